"""One spelling per concept, accepted after the verb; every argument explained, with its
default; ``--json`` documents that parse, with their schema version; ``-`` is stdout."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from bootseer.cli.main import build_parser
from tests.cli.conftest import DIGEST_OF_HI


def _commands(parser, path=()):
    """(path, parser) of every command and verb."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_argument_has_help():
    missing = [f"{' '.join(path)} {a.option_strings or a.dest}"
               for path, p in _commands(build_parser()) for a in p._actions
               if not isinstance(a, (argparse._HelpAction, argparse._VersionAction,
                                     argparse._SubParsersAction))
               and a.help is None]
    assert not missing, missing


def test_help_shows_defaults():
    text = build_parser(only="ckpt")._subparsers._group_actions[0].choices["ckpt"]
    mount = text._subparsers._group_actions[0].choices["mount"].format_help()
    assert "(default: striped)" in mount


@pytest.mark.parametrize("argv", [
    ["store", "ls", "--store", "{store}"],
    ["store", "--store", "{store}", "ls"],
    ["store", "ref", "get", "x", "--store", "{store}"],
])
def test_store_is_accepted_after_the_verb(world, argv):
    r = world.run(*[a.format(store=world.store) for a in argv], env={"BOOTSEER_STORE_URL": ""})
    assert "unrecognized arguments" not in r.stderr and "no store configured" not in r.stderr


def _json(r):
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1
    return doc


def test_image_convert_json_and_store_after_the_verb(world):
    from tests.image.test_image import oci_layout, tar_layer
    layer = tar_layer([("bin", None, "d"), ("bin/tool", b"T" * 3000, "f"),
                       ("etc", None, "d"), ("etc/a", b"A", "f")])
    oci_layout(world.root / "img", [layer])
    doc = _json(world.run("image", "convert", "img", "--store", "converted", "--json",
                          "--chunk-size", "1KiB"))
    assert doc["digest"].startswith("sha256:") and doc["size"] == 3001
    assert doc["chunks"] == 4                                     # 3 of bin/tool, 1 of etc/a
    assert (world.root / "converted").is_dir()
    old = world.run("image", "convert", "img", "--to", "converted", "--chunk-size", "1KiB")
    assert old.stdout.strip() == doc["digest"], old.stderr     # --to: the hidden alias
    assert "--to" not in world.run("image", "convert", "--help").stdout
    r = world.run("image", "profile", "show", doc["digest"], "--store", "converted", "--json")
    assert r.returncode == 1                                   # no profile recorded yet
    assert json.loads(r.stdout) == {"schema": 1, "tree": doc["digest"], "profile": None}


def test_read_verbs_print_json(world):
    blobs = _json(world.run("store", "ls", "--json"))
    assert blobs["blobs"] == [DIGEST_OF_HI]
    assert world.run("store", "ref", "set", "team/a", DIGEST_OF_HI).returncode == 0
    refs = _json(world.run("store", "ls", "--refs", "team/", "--json"))
    assert refs["refs"] == {"team/a": DIGEST_OF_HI}
    assert _json(world.run("deps", "ls", "--json"))["environments"] == []


def test_report_json_dash_is_stdout(world):
    from tests.trace.report_traces import demo_node
    trace = world.root / "trace"
    trace.mkdir()
    demo_node(trace, "n0").write()
    r = world.run("report", str(trace), "--json", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == 1   # only the JSON: the text went to stderr
    assert not (world.root / "-").exists()
    assert r.stderr.strip()                  # (the text report)
    r = world.run("report", str(trace), "--json", "-", "--chrome", "-")
    assert r.returncode == 2 and "only one of" in r.stderr


def _readme_command_cells() -> list[str]:
    """The first cell of each row of the Commands table (docs/commands.md, linked from the
    README): its command lines."""
    from pathlib import Path
    readme = (Path(__file__).parents[2] / "docs/commands.md").read_text()
    table = readme.split("## Commands", 1)[1].split("\n\n", 2)[1]
    return [row.split(" | ")[0].removeprefix("| ") for row in table.splitlines()
            if row.startswith("| `bootseer")]


def test_readme_command_table_names_every_command():
    import re
    cells = " ".join(_readme_command_cells())
    listed = set(re.findall(r"`bootseer (\w+)", cells))
    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    assert commands - listed == set(), "commands missing from README's Commands table"


def _leaves(parser, path=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*path, name))


def test_readme_command_table_matches_help():
    """Every verb of ``--help`` is in the row of its command, and every option a row
    shows exists on that command (no stale flags)."""
    import re
    cells = _readme_command_cells()
    verbs = dict(_leaves(build_parser()))
    missing = []
    for path in verbs:
        rows = " ".join(c for c in cells if re.search(rf"`(bootseer )?{path[0]}\b", c))
        words = set(re.findall(r"[\w-]+", rows.replace("\\|", " ")))
        missing += [" ".join(path)] if not set(path[1:]) <= words else []
    assert not missing, f"verbs missing from README's Commands table: {missing}"
    stale = []
    for cell in cells:
        for part in cell.split(" / "):
            m = re.match(r"`(?:bootseer )?([\w-]+)(?: ([\w-]+))?", part.strip())
            named = [p for path, p in verbs.items() if path[0] == m.group(1)
                     and (len(path) == 1 or path[1] == m.group(2) or "\\|" in part)]
            options = {o for p in named for a in p._actions for o in a.option_strings}
            stale += [f"{part.strip()[:40]}: {flag}"
                      for flag in re.findall(r"--[\w-]+", part) if flag not in options]
    assert not stale, f"options in README's Commands table that --help does not have: {stale}"


def test_every_command_that_uses_a_store_takes_store_after_its_verb():
    uses_store = {("run",), ("image", "convert"), ("image", "mount"), ("image", "prefetch"),
                  ("image", "run"), ("image", "ls"), ("image", "inspect"),
                  ("image", "profile", "push"), ("image", "profile", "show"),
                  ("deps", "ensure"), ("deps", "ls"), ("deps", "verify"), ("ckpt", "mount"),
                  ("ckpt", "prefetch"), ("store", "ls"), ("store", "put"), ("store", "gc"),
                  ("store", "ref", "set")}
    found = {path for path, p in _commands(build_parser())
             if any("--store" in a.option_strings for a in p._actions)}
    assert uses_store <= found, uses_store - found


def test_ckpt_prefetch_takes_store(world):
    ckpt = world.root / "ckpt"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"w" * 1000)
    r = world.run("ckpt", "prefetch", f"file://{ckpt}", "--store", "profiles",
                  env={"BOOTSEER_STORE_URL": ""})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["failed"] == 0
    assert (world.root / "profiles" / "refs").is_dir()        # the store it was given


def test_store_stat_and_ref_get_print_json(world):
    doc = _json(world.run("store", "stat", DIGEST_OF_HI, "--json"))
    assert doc == {"schema": 1, "store": str(world.store), "digest": DIGEST_OF_HI, "size": 3}
    assert world.run("store", "ref", "set", "team/a", DIGEST_OF_HI).returncode == 0
    doc = _json(world.run("store", "ref", "get", "team/a", "--json"))
    assert doc == {"schema": 1, "store": str(world.store), "name": "team/a",
                   "digest": DIGEST_OF_HI}
    missing = world.run("store", "ref", "get", "team/none", "--json")
    assert missing.returncode == 1 and "no ref 'team/none'" in missing.stderr


def test_dash_is_stdout_for_every_output_file(world):
    """``-`` names standard output wherever a verb writes a file; no file named ``-``."""
    got = world.run("store", "get", DIGEST_OF_HI, "-o", "-")
    assert got.returncode == 0 and got.stdout == "hi\n", got.stderr
    profile = world.root / "p.json"
    profile.write_text(json.dumps({"kind": "bootseer.profile", "version": 1, "tree": "sha256:"
                                   + "a" * 64, "runs": 1, "chunks": []}))
    merged = world.run("image", "profile", "merge", str(profile), "-o", "-")
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout)["kind"] == "bootseer.profile"
    piped = subprocess.run([sys.executable, "-m", "bootseer", "image", "profile", "merge", "-"],
                           input=merged.stdout, capture_output=True, text=True, cwd=world.root,
                           env=world.env, timeout=60)   # and - is standard input
    assert piped.returncode == 0 and json.loads(piped.stdout)["runs"] == 1, piped.stderr
    sim = world.run("simulate", "sim", "--jobs", "20")
    assert sim.returncode == 0, sim.stderr
    analyzed = world.run("analyze", "sim", "--json", "-")
    assert analyzed.returncode == 0, analyzed.stderr
    assert isinstance(json.loads(analyzed.stdout), dict)     # the text went to stderr
    assert analyzed.stderr.strip()
    both = world.run("analyze", "sim", "--json", "-", "--html", "-")
    assert both.returncode == 2 and "only one of" in both.stderr
    run = world.run("run", "--summary", "-", "--", "echo", "job-out")
    assert run.returncode == 0, run.stderr
    job_line, summary = run.stdout.split("\n", 1)
    assert job_line == "job-out" and "job.run" in json.loads(summary)["phases"]
    assert not (world.root / "-").exists()


def test_trace_verbs_take_trace_like_run(world):
    trace = world.root / "t"
    r = world.run("trace", "mark", "ready", "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    r = world.run("trace", "exec", "--phase", "x", "--trace", str(trace), "--", "true")
    assert r.returncode == 0, r.stderr
    old = world.run("trace", "mark", "again", "--location", str(trace))   # first spelling
    assert old.returncode == 0, old.stderr
    events = "".join(p.read_text() for p in trace.rglob("*") if p.is_file())
    assert all(name in events for name in ('"ready"', '"x"', '"again"')), events


def test_ckpt_gc_and_prefetch_json(world):
    ckpt = world.root / "model"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"w" * 5000)
    r = world.run("ckpt", "prefetch", f"file://{ckpt}")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == 1
    doc = _json(world.run("ckpt", "gc", "--max-size", "0", "--dry-run", "--json"))
    assert doc["dry_run"] is True and doc["kept_bytes"] == 0
    assert [f["action"] for f in doc["files"]] == ["would remove"]
    assert doc["files"][0]["bytes"] >= 5000


def test_ckpt_prefetch_from_a_server_with_an_html_listing(world):
    """`python -m http.server`'s HTML index is a checkpoint directory like nginx's JSON one."""
    from bootseer.testing import servers
    served = world.root / "served"
    (served / "step1/sub").mkdir(parents=True)
    (served / "step1/w.bin").write_bytes(b"w" * 300_000)
    (served / "step1/sub/o.bin").write_bytes(b"o" * 1000)
    port = servers.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                             str(port), "--directory", str(served)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        servers.wait_port(port)
        r = world.run("ckpt", "prefetch", f"http://127.0.0.1:{port}/step1")
    finally:
        proc.terminate()
        proc.wait(10)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["failed"] == 0 and doc["bytes_fetched"] == 301_000
