"""``bootseer snapshotter install`` on containerd's own default configs (version 2 from
Debian's containerd 1.6, version 3 from containerd 2.0): apply, apply again (no change),
uninstall restores the original bytes; bad input leaves the file untouched."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from bootseer.snapshotter import install
from bootseer.snapshotter.install import BACKUP_SUFFIX, InstallError

DATA = Path(__file__).parent / "data"
SOCK = "/run/bootseer/snapshotter.sock"


@pytest.fixture(params=["containerd-1.6-default.toml", "containerd-2.0-default.toml"])
def config(request, tmp_path) -> Path:
    path = tmp_path / "config.toml"
    shutil.copyfile(DATA / request.param, path)
    return path


def _runtimes(conf: dict) -> tuple[dict, dict]:
    """(the CRI's containerd runtime table, the table holding its image settings)"""
    if conf["version"] == 2:
        cri = conf["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
        return cri, cri
    return (conf["plugins"]["io.containerd.cri.v1.runtime"]["containerd"],
            conf["plugins"]["io.containerd.cri.v1.images"])


def test_apply_is_idempotent_and_uninstall_restores_every_byte(config):
    original = config.read_bytes()
    before = tomllib.loads(original.decode())
    assert install.apply(install.plan(config, socket=SOCK))
    after = tomllib.loads(config.read_text())
    cri, images = _runtimes(after)
    old_cri, old_images = _runtimes(before)
    handler = cri["runtimes"]["bootseer"]
    assert handler["snapshotter"] == "bootseer"
    # the default runtime's settings, runc options included, carried to the handler
    runc = old_cri["runtimes"]["runc"]
    assert handler["options"] == runc["options"]
    assert handler["runtime_type"] == runc["runtime_type"] == "io.containerd.runc.v2"
    assert after["proxy_plugins"]["bootseer"] == {"type": "snapshot", "address": SOCK}
    assert images["disable_snapshot_annotations"] is False
    # the node default is untouched: system pods keep overlayfs
    assert images["snapshotter"] == old_images["snapshotter"] == "overlayfs"
    assert cri["runtimes"]["runc"] == runc
    patched = config.read_bytes()
    assert config.with_name(config.name + BACKUP_SUFFIX).read_bytes() == original

    again = install.plan(config, socket=SOCK)
    assert again.text is None and not install.apply(again)
    assert config.read_bytes() == patched
    assert config.with_name(config.name + BACKUP_SUFFIX).read_bytes() == original

    assert install.uninstall(config)
    assert config.read_bytes() == original
    assert not config.with_name(config.name + BACKUP_SUFFIX).exists()
    assert not install.uninstall(config)   # nothing left to roll back


def test_default_is_switched_only_when_asked(config):
    install.apply(install.plan(config, socket=SOCK, default=True))
    _, images = _runtimes(tomllib.loads(config.read_text()))
    assert images["snapshotter"] == "bootseer"


def test_containerd_1_6_is_told_that_the_runtime_handler_alone_does_not_switch(tmp_path):
    path = tmp_path / "config.toml"
    shutil.copyfile(DATA / "containerd-1.6-default.toml", path)
    notes = install.plan(path, socket=SOCK, containerd_version="1.6.20~ds1").notes
    assert len(notes) == 1 and "--default" in notes[0] and "1.7" in notes[0]
    assert not install.plan(path, socket=SOCK, containerd_version="1.7.13").notes


def test_a_later_install_keeps_the_first_backup(config):
    original = config.read_bytes()
    install.apply(install.plan(config, socket=SOCK))
    install.apply(install.plan(config, socket="/run/other.sock"))   # a second, different one
    assert config.with_name(config.name + BACKUP_SUFFIX).read_bytes() == original
    assert install.uninstall(config) and config.read_bytes() == original


@pytest.mark.parametrize("text, says", [
    (None, "no containerd config"),
    ("version = 2\n[plugins\n", "not TOML"),
    ('root = "/var/lib/containerd"\n', "version None is not supported"),
    ("version = 4\n", "version 4 is not supported"),
])
def test_bad_input_is_one_line_with_a_hint_and_the_file_is_untouched(tmp_path, text, says):
    path = tmp_path / "config.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(InstallError) as e:
        install.plan(path, socket=SOCK)
    assert says in str(e.value) and "\n" not in str(e.value) and e.value.hint
    assert (path.read_text() if text is not None else None) == text
    assert sorted(p.name for p in tmp_path.iterdir()) == (["config.toml"] if text else [])


def test_the_writer_round_trips_what_it_cannot_avoid(tmp_path):
    conf = {"version": 2, "timeouts": {"io.containerd.timeout.shim.load": "5s"},
            "a": {"list": [1, "x\"y\\z"], "f": 0.5, "empty": {}, "t": True}}
    assert tomllib.loads(install.dumps(conf)) == conf


def _cli(*args: str):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "bootseer", "snapshotter", "install", *args],
                          capture_output=True, text=True)


def test_the_command_dry_runs_installs_and_rolls_back(config):
    original = config.read_bytes()
    r = _cli("--config", str(config), "--dry-run")
    assert r.returncode == 0 and tomllib.loads(r.stdout)["proxy_plugins"]["bootseer"]
    assert config.read_bytes() == original and len(list(config.parent.iterdir())) == 1
    r = _cli("--config", str(config))
    assert r.returncode == 0 and "patched" in r.stderr
    r = _cli("--config", str(config))
    assert r.returncode == 0 and "unchanged" in r.stderr
    r = _cli("--config", str(config), "--uninstall")
    assert r.returncode == 0 and config.read_bytes() == original
    r = _cli("--config", str(config), "--uninstall")
    assert r.returncode == 2 and r.stderr.count("\n") == 2 and "hint:" in r.stderr


def test_the_command_refuses_a_missing_config_in_one_line(tmp_path):
    r = _cli("--config", str(tmp_path / "none.toml"))
    lines = r.stderr.splitlines()
    assert r.returncode != 0 and len(lines) == 2 and "no containerd config" in lines[0]
    assert "containerd config default" in lines[1] and not list(tmp_path.iterdir())
