"""Shared fixtures: real servers on loopback, stopped by PID. One nginx and one registry
serve the whole session (each test its own directory or repository under them); a test
that needs its own (a rate limit, TLS, auth, a server it kills) starts one.

When ``BOOTSEER_TEST_REQUIRE_ALL=1`` (set by .ci/run, which runs as root with FUSE), a
test that would skip for a missing capability fails instead.

Tiers: every test is marked from the fixtures it uses (``FIXTURE_MARKS``) and from the
marks its module or function carries; a test with none of the capability marks and not
``slow`` is ``unit`` (``make check``'s fast tier), every other one ``integration``.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
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
    "shared_nginx": ("servers",),
    "shared_registry": ("servers",),
    "busybox_rootfs": ("root",),          # a container's root: only a container runs it
    "dcp_dir": ("torch",),                # tests/ckpt: checkpoints saved by torch.distributed
    "dcp_checkpoint": ("torch",),
}
# What every test of a directory or module needs, and why (the rest is marked by fixture).
PATH_MARKS: dict[str, tuple[tuple[str, ...], str]] = {
    "tests/integration/": (("netns", "root"), "nodes in network namespaces"),
    "tests/snapshotter/test_containerd.py": (("servers", "root"), "a real containerd"),
    "tests/snapshotter/test_lazy_cri.py": (("servers", "root"), "a real containerd"),
    "tests/run/test_container.py": (("root",), "containers"),
    "tests/run/test_faults.py": (("root",), "containers"),
    "tests/run/test_baseline.py": (("root",), "podman pulls"),
    "tests/run/test_devices.py": (("root",), "mknod"),
    "tests/run/test_gpu_scripts.py": (("root",), "the GPU scripts run as root"),
    "tests/peers/": (("slow",), "libtorrent swarms of several nodes"),
    "tests/cli/": (("slow",), "the real bootseer command in a subprocess per call"),
    "tests/run/test_job_trace.py": (("slow",), "torchrun jobs and containers"),
    "tests/trace/test_auto.py": (("slow",), "torchrun jobs"),
    "tests/trace/test_remote.py": (("slow",), "traced jobs uploading in subprocesses"),
    "tests/security/test_trace_input.py": (("slow",), "bootseer report in a subprocess"),
    "tests/security/test_sigkill.py": (("slow",), "processes killed mid-write"),
    "tests/packaging/test_wheel.py": (("slow",), "builds the wheel and a venv"),
    "tests/security/test_hostile_interleavings.py": (("slow",), "hundreds of faulty reads"),
    "tests/security/test_hostile_server.py": (("slow",), "an HTTP server per test"),
    "tests/trace/test_otlp_transport.py": (("slow",), "OTLP receivers per test"),
    "tests/store/test_http_proxy.py": (("slow",), "a proxy and a server per test"),
}
CAPABILITIES = ("servers", "fuse", "netns", "root", "torch")


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        marks = {m for fixture, ms in FIXTURE_MARKS.items() if fixture in names for m in ms}
        for path, (ms, _why) in PATH_MARKS.items():
            if item.nodeid.startswith(path):
                marks.update(ms)
        for m in sorted(marks):
            item.add_marker(m)
        own = {m.name for m in item.iter_markers()}
        item.add_marker("integration" if own & {*CAPABILITIES, "slow"} else "unit")


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


@pytest.fixture(scope="session")
def shared_nginx(tmp_path_factory) -> Iterator[servers.Server]:
    """One nginx for the whole session, serving a directory of links: each test's root is
    linked there under a name of its own (``SharedRoot``)."""
    need(servers.nginx_available(), "nginx is not installed (apt-get install nginx-light)")
    root = tmp_path_factory.mktemp("shared-www")
    s = servers.start_nginx(root, tmp_path_factory.mktemp("shared-nginx"))
    s.extra["root"] = root
    yield s
    s.stop()


@dataclass
class SharedRoot:
    """A test's directory served by the session's nginx under ``/<name>``: ``url`` is the
    directory's URL, as a server of its own would give for its root. Unlinked at the
    test's end; a test that stops or kills its server asks for its own (``own=True``)."""

    server: servers.Server
    link: Path

    @property
    def url(self) -> str:
        return f"{self.server.url}/{self.link.name}"

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def host(self) -> str:
        return self.server.host

    def stop(self) -> None:
        self.link.unlink(missing_ok=True)

    def kill(self) -> None:
        raise RuntimeError("the session's nginx is shared: use nginx_factory(root, own=True) "
                           "for a server the test may kill")


_shared_names = itertools.count()


@pytest.fixture
def nginx_factory(request, tmp_path_factory):
    """``start(root, own=False, **kw)`` -> a server of ``root``. Without options, the
    session's nginx serves it under a path of its own (starting one nginx per test costs
    more than most tests); with options (a rate limit, TLS, an access log, a port) or
    ``own=True`` (the test stops or kills it), a server of its own, stopped at teardown."""
    need(servers.nginx_available(), "nginx is not installed (apt-get install nginx-light)")
    started: list[servers.Server | SharedRoot] = []

    def start(root, *, own: bool = False, **kw) -> servers.Server | SharedRoot:
        s: servers.Server | SharedRoot
        if own or kw:
            s = servers.start_nginx(root, tmp_path_factory.mktemp("nginx"), **kw)
        else:
            shared = request.getfixturevalue("shared_nginx")
            s = SharedRoot(shared, shared.extra["root"] / f"t{next(_shared_names)}")
            s.link.symlink_to(Path(root).resolve(), target_is_directory=True)
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


@pytest.fixture(scope="session")
def shared_registry(tmp_path_factory) -> Iterator[servers.Server]:
    """One docker-registry for the session; a test using it takes a repository (a store
    prefix) no other test uses."""
    need(servers.registry_available(), "docker-registry is not installed")
    s = servers.start_registry(tmp_path_factory.mktemp("shared-regdata"),
                               tmp_path_factory.mktemp("shared-regwork"))
    yield s
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
