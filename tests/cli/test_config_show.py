"""``bootseer config show``: the node's file, the user's file, the environment and the
defaults, in that order of precedence, each setting with where it came from; secrets never
shown; a broken file named in one line."""

from __future__ import annotations

import json


def _show(world, *argv: str, env: dict | None = None):
    r = world.run("config", "show", *argv, env=env)
    return r


def test_the_node_file_then_the_users_then_the_environment(world, tmp_path):
    system = tmp_path / "system.toml"
    system.write_text('[fetch]\nretries = 2\ntimeout_s = 11.0\n[cache]\nbudget_bytes = "1GiB"\n')
    user = tmp_path / "user.toml"
    user.write_text("[fetch]\nretries = 5\n")
    env = {"BOOTSEER_SYSTEM_CONFIG": str(system), "BOOTSEER_CONFIG": str(user),
           "BOOTSEER_FETCH_TIMEOUT_S": "30", "BOOTSEER_STORE_PASSWORD": "hunter2"}
    r = _show(world, "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1 and doc["files"] == [str(system), str(user)]
    s = doc["settings"]
    assert s["fetch"]["retries"] == {"value": 5, "source": str(user)}
    assert s["fetch"]["timeout_s"] == {"value": 30.0, "source": "BOOTSEER_FETCH_TIMEOUT_S"}
    assert s["cache"]["budget_bytes"] == {"value": 2**30, "source": str(system)}
    assert s["store"]["url"]["source"] == "BOOTSEER_STORE_URL"      # the world's store
    assert s["mount"]["backend"]["source"] == "default"
    assert s["store"]["password"] == {"value": "***", "source": "BOOTSEER_STORE_PASSWORD"}
    text = _show(world, "fetch", env=env)
    assert text.returncode == 0 and "hunter2" not in text.stdout + text.stderr
    assert text.stdout.splitlines()[0] == f"# files read: {system}, {user}"
    row = next(line.split() for line in text.stdout.splitlines()
               if line.startswith("fetch.retries "))
    assert row == ["fetch.retries", "5", str(user)]
    assert not [line for line in text.stdout.splitlines()[1:] if not line.startswith("fetch.")]


def test_a_broken_node_file_is_one_line_naming_it(world, tmp_path):
    system = tmp_path / "system.toml"
    system.write_text("[fetch\nretries = 2\n")
    r = _show(world, env={"BOOTSEER_SYSTEM_CONFIG": str(system)})
    assert r.returncode == 2, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("bootseer: error:")]
    assert str(system) in line and "BOOTSEER_SYSTEM_CONFIG" in line
    missing = tmp_path / "nope.toml"
    r = _show(world, env={"BOOTSEER_SYSTEM_CONFIG": str(missing)})
    assert r.returncode == 2 and str(missing) in r.stderr


def test_an_unknown_section_names_the_known_ones(world):
    r = _show(world, "fetc")
    assert r.returncode == 2
    assert "no section 'fetc' (did you mean fetch?); sections: cache, ckpt, fetch" in r.stderr
