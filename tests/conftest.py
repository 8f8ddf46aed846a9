"""Shared fixtures: real servers on loopback, started per test (or module) and stopped by PID.

When ``BOOTSEER_TEST_REQUIRE_ALL=1`` (set by .ci/run, which runs as root with FUSE), a
test that would skip for a missing capability fails instead.

Tiers: every test is marked from the fixtures it uses (``FIXTURE_MARKS``) and from the
marks its module or function carries; a test with none of the capability marks and not
``slow`` is ``unit`` (``make check``'s fast tier), every other one ``integration``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bootseer.testing import servers

REQUIRE_ALL = os.environ.get("BOOTSEER_TEST_REQUIRE_ALL") == "1"


@pytest.fixture(autouse=True)
def _no_mount_left(tmp_path_factory):
    """A test that leaves a mount under pytest's temporary directories fails, and what it
    left is unmounted (deepest first) so neither the next test nor pytest's clean-up of old
    temporary directories meets it. Mounts made by wider-scoped fixtures exist before the
    test starts and are not counted."""
    from bootseer.node import mounts as points
    root = os.path.realpath(tmp_path_factory.getbasetemp())

    def under_root() -> set[str]:
        return {e.mountpoint for e in points.table()
                if e.mountpoint == root or e.mountpoint.startswith(root + "/")}

    before = under_root()
    yield
    left = under_root() - before
    for mp in sorted(left, key=len, reverse=True):
        points.lazy_unmount(mp)
    assert not left, f"the test left mounts behind: {sorted(left)}"


# What a fixture needs of the machine, by name; a test inherits the marks of every fixture
# it uses, directly or through other fixtures.
FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    "need_root": ("root",),
    "need_fuse": ("fuse", "root"),
    "nginx_factory": ("servers",),
    "registry_factory": ("servers",),
    "busybox_rootfs": ("root",),
}
CAPABILITIES = ("servers", "fuse", "netns", "root", "torch")


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marks in FIXTURE_MARKS.items():
            if fixture in names:
                for m in marks:
                    item.add_marker(m)
        own = {m.name for m in item.iter_markers()}
        needs = own & {*CAPABILITIES, "slow"}
        item.add_marker("integration" if needs else "unit")


def need(condition: bool, why: str) -> None:
    """Skip (or, in CI, fail) unless ``condition`` holds."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required capability missing in CI: {why}")
    pytest.skip(why)


def is_root() -> bool:
    return os.geteuid() == 0


def has_fuse() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


@pytest.fixture
def need_root():
    need(is_root(), "needs root")


@pytest.fixture
def need_fuse():
    need(is_root() and has_fuse(), "needs root, /dev/fuse and fusermount3")


@pytest.fixture
def nginx_factory(tmp_path_factory):
    """``start(root, **kw)`` -> Server serving ``root``; all stopped at teardown."""
    need(servers.nginx_available(), "nginx is not installed (apt-get install nginx-light)")
    started: list[servers.Server] = []

    def start(root, **kw) -> servers.Server:
        s = servers.start_nginx(root, tmp_path_factory.mktemp("nginx"), **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def www(tmp_path) -> Path:
    d = tmp_path / "www"
    d.mkdir()
    return d


@pytest.fixture
def nginx(nginx_factory, www):
    """nginx serving the (initially empty) ``www`` directory."""
    return nginx_factory(www)


@pytest.fixture
def registry_factory(tmp_path_factory):
    need(servers.registry_available(), "docker-registry is not installed")
    started: list[servers.Server] = []

    def start(**kw) -> servers.Server:
        s = servers.start_registry(tmp_path_factory.mktemp("regdata"),
                                   tmp_path_factory.mktemp("regwork"), **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def registry(registry_factory):
    return registry_factory()


# A tiny real container root: busybox-static plus its applet links.

BUSYBOX = shutil.which("busybox") or "/bin/busybox"


def make_busybox_rootfs(root: Path) -> Path:
    for d in ("bin", "proc", "dev", "tmp", "etc", "sys"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    for applet in ("sh", "cat", "echo", "sleep", "ls", "touch", "test", "true", "false",
                   "kill", "ps", "env", "mkdir", "trap", "wc", "id"):
        link = root / "bin" / applet
        if not link.exists():
            os.symlink("busybox", link)
    os.chmod(root / "tmp", 0o1777)
    return root


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory):
    if not os.path.exists(BUSYBOX):
        pytest.skip("busybox-static is not installed")
    return make_busybox_rootfs(tmp_path_factory.mktemp("rootfs"))
