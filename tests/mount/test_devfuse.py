"""bootseer's own /dev/fuse server against the real kernel: staged files through
passthrough (no READ reaches Python, mmap works), streaming files through Python, many
readers at once, misses, unmount with files held open, and the choice of backend."""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import random
import stat
import subprocess
import sys
import threading
import time

import pytest

from bootseer.mount.devfuse import probe
from bootseer.mount.devfuse.process import mount as devfuse_mount
from bootseer.mount.devfuse.server import Server
from bootseer.mount.fuse import MountError
from bootseer.mount.view import Attr
from tests.conftest import need

pytestmark = [pytest.mark.timeout(60), pytest.mark.fuse]
MiB = 1 << 20
# the same bytes in a spawned server process, which imports this module again
DATA = {f"/f{i}": random.Random(i).randbytes(2 * MiB + i) for i in range(8)}


class StagedView:
    """``/staged`` has a local backing file; ``/f0``..``/f7`` stream through ``read``,
    each READ taking a little while, so concurrent readers overlap in the server."""

    def __init__(self, backing: str, read_delay: float = 0.0):
        self.backing, self.read_delay = backing, read_delay
        with open(backing, "rb") as f:
            self.staged = f.read()
        self.active = self.most_active = 0
        self._lock = threading.Lock()

    def getattr(self, path):
        if path == "/":
            return Attr(mode=stat.S_IFDIR | 0o755, size=0, nlink=2)
        if path == "/staged":
            return Attr(mode=stat.S_IFREG | 0o644, size=len(self.staged))
        if path in DATA:
            return Attr(mode=stat.S_IFREG | 0o644, size=len(DATA[path]))
        raise FileNotFoundError(path)

    def readdir(self, path):
        return ["staged", *(k[1:] for k in DATA)]

    def readlink(self, path):
        raise OSError(errno.EINVAL, "not a symlink")

    def read(self, path, size, offset):
        with self._lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            time.sleep(self.read_delay)
            return (self.staged if path == "/staged" else DATA[path])[offset:offset + size]
        finally:
            with self._lock:
                self.active -= 1

    def backing_path(self, path):
        return self.backing if path == "/staged" else None


def staged_view(backing: str) -> StagedView:   # a module-level factory pickles
    return StagedView(backing)


@pytest.fixture
def backing(tmp_path):
    path = tmp_path / "staged-copy"
    path.write_bytes(os.urandom(3 * MiB + 77))
    return str(path)


@pytest.fixture
def passthrough(need_fuse):
    need(probe.passthrough_unavailable() is None,
         f"FUSE passthrough: {probe.passthrough_unavailable()}")


@pytest.fixture
def served(passthrough, tmp_path, backing):
    mp = tmp_path / "mnt"
    mp.mkdir()
    view = StagedView(backing, read_delay=0.02)
    with Server(view, str(mp), name="devfuse-test") as server:
        yield server, view, mp
    assert not os.path.ismount(mp)


def test_staged_file_is_read_by_the_kernel_not_python(served, backing):
    server, view, mp = served
    assert server.passthrough
    assert (mp / "staged").read_bytes() == view.staged
    assert server.reads["/staged"] == 0 and server.counts["open"] == 1
    assert server.counts["flush"] == 0   # FOPEN_NOFLUSH: no round trip at close


def test_mmap_of_a_staged_file(served):
    server, view, mp = served
    # in another process: a page fault that needed this server would hold our GIL
    code = ("import mmap, sys, hashlib\n"
            "with open(sys.argv[1], 'rb') as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)"
            " as m:\n    print(hashlib.sha256(m[:]).hexdigest(), m[5 * 1024:5 * 1024 + 3].hex())")
    out = subprocess.run([sys.executable, "-c", code, str(mp / "staged")], capture_output=True,
                         text=True, timeout=30, check=True).stdout.split()
    import hashlib
    assert out == [hashlib.sha256(view.staged).hexdigest(), view.staged[5 * 1024:][:3].hex()]
    assert server.reads["/staged"] == 0


def test_streaming_file_goes_through_python_reads(served):
    server, view, mp = served
    assert (mp / "f3").read_bytes() == DATA["/f3"]
    assert server.reads["/f3"] >= 1


def test_concurrent_readers_are_served_in_parallel(served):
    server, view, mp = served
    results: dict[str, bytes] = {}

    def read(name):
        fd = os.open(mp / name, os.O_RDONLY)
        try:
            chunks, off = [], 0
            while chunk := os.pread(fd, 256 * 1024, off):
                chunks.append(chunk)
                off += len(chunk)
            results[name] = b"".join(chunks)
        finally:
            os.close(fd)

    names = [k[1:] for k in DATA] + ["staged", "staged"]
    threads = [threading.Thread(target=read, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(results[k[1:]] == v for k, v in DATA.items())
    assert results["staged"] == view.staged
    assert view.most_active > 1, "READs were answered one at a time"
    assert server.reads["/staged"] == 0


def test_a_file_staged_while_open_switches_to_passthrough_only_when_all_closed(served):
    """The kernel fails (EIO) an open in passthrough while another open of the same file
    reads through Python: the server keeps one mode per file until its last close."""
    server, view, mp = served
    streaming_backing = {}
    view.backing_path = lambda path: streaming_backing.get(path)
    first = os.open(mp / "f4", os.O_RDONLY)
    assert os.pread(first, 10, 0) == DATA["/f4"][:10]
    reads = server.reads["/f4"]
    local = mp.parent / "f4-staged"
    local.write_bytes(DATA["/f4"])
    streaming_backing["/f4"] = str(local)   # staged now, while `first` is open
    second = os.open(mp / "f4", os.O_RDONLY)
    assert os.pread(second, 10, MiB) == DATA["/f4"][MiB:MiB + 10]
    assert server.reads["/f4"] > reads      # still the Python path, no EIO
    os.close(first)
    os.close(second)
    # the kernel sends RELEASE after close() returns: the mode changes once both are done
    deadline = time.monotonic() + 10
    while server._files and time.monotonic() < deadline:
        time.sleep(0.01)
    reads = server.reads["/f4"]
    assert (mp / "f4").read_bytes() == DATA["/f4"]   # most of it never read before
    assert server.reads["/f4"] == reads     # the next open passed through


def test_a_backing_file_that_went_away_falls_back_to_python(served, tmp_path):
    server, view, mp = served
    view.backing_path = lambda path: str(tmp_path / "removed-by-gc")
    assert (mp / "f5").read_bytes() == DATA["/f5"]
    assert server.reads["/f5"] >= 1


def test_missing_file_is_enoent_and_the_miss_is_cached(served):
    server, view, mp = served
    with pytest.raises(FileNotFoundError):
        os.stat(mp / "nope")
    lookups = server.counts["lookup"]
    assert not os.path.exists(mp / "nope")
    assert server.counts["lookup"] == lookups   # negative entry kept by the kernel
    assert sorted(os.listdir(mp)) == sorted(["staged", *(k[1:] for k in DATA)])


def test_read_only_and_options(served):
    server, view, mp = served
    with pytest.raises(OSError) as e:
        open(mp / "f0", "r+b")
    assert e.value.errno in (errno.EROFS, errno.EACCES)
    opts = next(line for line in open("/proc/mounts") if f" {mp} " in line).split()
    assert opts[2] == "fuse.bootseer"
    assert {"ro", "nosuid", "nodev"} <= set(opts[3].split(","))


def test_unmount_with_files_held_open(need_fuse, tmp_path, backing):
    import functools
    mp = tmp_path / "mnt"
    mp.mkdir()
    # the seam's spawner keeps its own pipes from the first mount on: count after one
    devfuse_mount(functools.partial(staged_view, backing), str(mp)).unmount()
    fds_before = set(os.listdir("/proc/self/fd"))
    h = devfuse_mount(functools.partial(staged_view, backing), str(mp), name="held")
    want = open(backing, "rb").read()
    staged = os.open(mp / "staged", os.O_RDONLY)
    streaming = os.open(mp / "f1", os.O_RDONLY)
    assert os.pread(staged, 10, 0) == want[:10]
    assert os.pread(streaming, 10, 0) == DATA["/f1"][:10]
    h.unmount()
    # detached, not waiting for the holders (closed below): a server that waited would be
    # killed at unmount's timeout, not exit 0
    assert not os.path.ismount(mp)
    assert h.proc.exitcode == 0
    # the staged file's reads never needed the server; the streaming one's do
    assert os.pread(staged, 10, MiB) == want[MiB:MiB + 10]
    with pytest.raises(OSError) as e:
        os.pread(streaming, 10, MiB)
    assert e.value.errno == errno.ENOTCONN
    os.close(staged)
    os.close(streaming)   # no FLUSH to a server that is gone: closes cleanly
    assert h.state is None
    del h   # its process object holds the child's sentinel pipes until collected
    gc.collect()
    assert set(os.listdir("/proc/self/fd")) == fds_before


def test_sigterm_unmounts_and_a_bad_factory_fails_before_mounting(need_fuse, tmp_path, backing):
    import functools
    mp = tmp_path / "mnt"
    mp.mkdir()
    h = devfuse_mount(functools.partial(staged_view, backing), str(mp))
    os.kill(h.pid, 15)
    h.proc.join(20)
    assert h.proc.exitcode == 0 and not os.path.ismount(mp)
    h.unmount()
    with pytest.raises(MountError, match="FileNotFoundError"):
        devfuse_mount(functools.partial(staged_view, str(tmp_path / "absent")), str(mp))
    assert not os.path.ismount(mp)


def test_stop_while_a_read_is_in_the_view(need_fuse, tmp_path, backing):
    """A worker still inside the view at stop: stop returns, the device closes when that
    worker is done (not earlier: its reply must not reach a reused descriptor)."""
    gate = threading.Event()

    class Gated(StagedView):
        def read(self, path, size, offset):
            gate.wait(120)   # longer than the test may run: only gate.set() lets it go
            return super().read(path, size, offset)

    mp = tmp_path / "mnt"
    mp.mkdir()
    fds = set(os.listdir("/proc/self/fd"))
    server = Server(Gated(backing), str(mp), threads=4).start()
    fd = os.open(mp / "f2", os.O_RDONLY)
    got = []
    reader = threading.Thread(target=lambda: got.append(os.pread(fd, 100, 0)))
    reader.start()
    time.sleep(0.3)
    server.stop(timeout=0.5)
    assert not os.path.ismount(mp)
    assert server._live == 1   # that worker, still in the view: stop did not wait for it
    gate.set()
    reader.join(10)
    assert got == [DATA["/f2"][:100]]   # the detached mount still answered it
    deadline = time.time() + 10
    while server._live and time.time() < deadline:
        time.sleep(0.05)
    os.close(fd)
    assert set(os.listdir("/proc/self/fd")) == fds   # the device closed by the last worker


def _worker_switches(server: Server) -> int:
    """Context switches of the server's worker threads so far (a wake-up is one)."""
    total = 0
    for t in server._workers:
        with open(f"/proc/self/task/{t.native_id}/status") as f:
            total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    return total


def test_a_request_wakes_one_idle_worker_not_all(need_fuse, tmp_path, backing):
    """Issue #14: the workers all polled one descriptor, so every request woke every idle
    worker (all but one found nothing to read). The kernel wakes one exclusive waiter."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    requests = 40
    with Server(StagedView(backing), str(mp), threads=16) as server:
        time.sleep(0.3)   # every worker in its wait
        before = _worker_switches(server)
        for i in range(requests):   # one LOOKUP each, answered before the next is sent
            assert not os.path.exists(mp / f"missing-{i}")
        woken = _worker_switches(server) - before
        assert server.counts["lookup"] >= requests
    # one wake-up per request, and a few for the GIL; all 16 would be >= 640
    assert woken < 4 * requests, f"{woken} worker context switches for {requests} requests"


def test_stop_with_every_worker_idle_and_a_file_held_open(need_fuse, tmp_path, backing):
    """A held file keeps the detached mount (and so the connection) alive: the kernel never
    wakes the idle workers with ENODEV; the stop itself must, and close everything."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    fds = set(os.listdir("/proc/self/fd"))
    server = Server(StagedView(backing), str(mp), threads=8).start()
    fd = os.open(mp / "f1", os.O_RDONLY)
    assert os.pread(fd, 10, 0) == DATA["/f1"][:10]
    time.sleep(0.3)   # every worker back in its wait
    server.stop(timeout=10)
    assert not os.path.ismount(mp)
    # the stop woke them: idle workers the kernel never wakes would outlive its timeout
    assert server._live == 0 and not any(t.is_alive() for t in server._workers)
    with pytest.raises(OSError) as e:   # the connection went with the device
        os.pread(fd, 10, MiB)
    assert e.value.errno == errno.ENOTCONN
    os.close(fd)
    assert set(os.listdir("/proc/self/fd")) == fds   # device, stop pipe, every worker's wait


def test_owner_killed_the_server_unmounts(need_fuse, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    code = ("import sys, time\n"
            "from bootseer.mount.devfuse.process import mount\n"
            "from bootseer.mount.devfuse.probe import EmptyView\n"
            "h = mount(EmptyView, sys.argv[1])\n"
            "print(h.pid, flush=True)\n"
            "time.sleep(60)\n")
    owner = subprocess.Popen([sys.executable, "-c", code, str(mp)], stdout=subprocess.PIPE,
                             text=True)
    try:
        server_pid = int(owner.stdout.readline())
        assert os.path.ismount(mp)
    finally:
        owner.kill()
        owner.wait(10)
    deadline = time.time() + 15
    while (os.path.ismount(mp) or os.path.exists(f"/proc/{server_pid}")) and \
            time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.ismount(mp) and not os.path.exists(f"/proc/{server_pid}")


class RootlessView(StagedView):
    def getattr(self, path):
        raise FileNotFoundError(path)


def rootless_view(backing: str) -> RootlessView:
    return RootlessView(backing)


def test_a_root_that_never_answers_leaves_no_mount(need_fuse, tmp_path, backing):
    import functools

    from bootseer.node import mounts as points
    mp = tmp_path / "mnt"
    mp.mkdir()
    with pytest.raises(MountError, match="did not mount"):
        devfuse_mount(functools.partial(rootless_view, backing), str(mp), timeout=2)
    assert points.find(str(mp)) is None   # the killed server's mount is gone too


# -- the backend choice ------------------------------------------------------------------------
def test_backend_choice_and_fallback_said_once(passthrough, monkeypatch, caplog):
    from bootseer.config import BootseerConfig, CkptConfig
    from bootseer.mount import choose as seam

    def ckpt_backend(wanted: str) -> str:
        return seam.choose(BootseerConfig(ckpt=CkptConfig(fuse=wanted)), seam.What.FILES).value
    assert ckpt_backend("mfusepy") == "mfusepy"
    assert ckpt_backend("auto") == "devfuse"
    monkeypatch.setattr(probe, "passthrough_unavailable", lambda: "no CAP_SYS_ADMIN")
    monkeypatch.setattr(seam, "_said", set())
    with caplog.at_level(logging.WARNING, logger="bootseer.mount"):
        assert ckpt_backend("auto") == "mfusepy"
        assert ckpt_backend("auto") == "mfusepy"
    said = [r for r in caplog.records if "passthrough unavailable" in r.getMessage()]
    assert len(said) == 1 and "no CAP_SYS_ADMIN" in said[0].getMessage()
    with pytest.raises(MountError, match="BOOTSEER_CKPT_FUSE=devfuse but .*no CAP_SYS_ADMIN"):
        ckpt_backend("devfuse")


def test_no_cap_sys_admin_is_found_by_the_probe_and_doctor(passthrough):
    code = ("from bootseer.config import BootseerConfig; from bootseer.mount import choose as seam;"
            " from bootseer.doctor import check_fuse_passthrough as c;"
            " print(seam.choose(BootseerConfig(), seam.What.FILES).value, c().ok, c().detail)")
    # setpriv (util-linux) drops the capability for one command
    r = subprocess.run(["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin",
                        sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("mfusepy False ") and "CAP_SYS_ADMIN" in r.stdout
    assert "passthrough unavailable (no CAP_SYS_ADMIN" in r.stderr   # the one log line
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.stdout.startswith("devfuse True "), r.stdout + r.stderr


# -- the checkpoint mount on it ----------------------------------------------------------------
def test_checkpoint_mount_reads_a_staged_file_through_passthrough(passthrough, tmp_path,
                                                                  nginx_factory):
    from bootseer.ckpt.mount import mount_checkpoint
    from bootseer.config import BootseerConfig
    d = tmp_path / "ckpt"
    d.mkdir()
    want = os.urandom(3 * MiB + 5)
    (d / "model.bin").write_bytes(want)
    server = nginx_factory(d)
    loads = []
    for fuse in ("devfuse", "devfuse", "mfusepy"):
        config = BootseerConfig.from_env(overrides={
            "cache": {"dir": str(tmp_path / "cache/blobs")},
            "ckpt": {"stripe_bytes": 256 * 1024, "fuse": fuse}})
        mp = tmp_path / f"mnt{len(loads)}"
        mp.mkdir()
        stats = tmp_path / f"stats{len(loads)}.json"
        with mount_checkpoint(f"{server.url}/", str(mp), config, prefetch=False,
                              stats_path=str(stats)):
            kind = next(line for line in open("/proc/mounts") if f" {mp} " in line).split()[2]
            assert (mp / "model.bin").read_bytes() == want
        report = json.loads(stats.read_text())
        loads.append((kind, report["bytes_consumed"], report["passthrough_bytes"],
                      report["first_byte_s"] is not None))
    # 1st: streamed through Python and staged; 2nd: the staged copy through passthrough
    # (nothing handed to Python, the open counted, so the load is still traced);
    # 3rd, forced to mfusepy: Python reads the staged copy
    assert loads == [("fuse.bootseer", len(want), 0, True),
                     ("fuse.bootseer", 0, len(want), True),
                     ("fuse", len(want), 0, True)]


def test_access_profile_keeps_files_read_through_passthrough(passthrough, tmp_path,
                                                             nginx_factory):
    """The next resume's prefetch order comes from the files this load opened, also those
    whose bytes the kernel served (the engine never sees those reads)."""
    from bootseer.ckpt import profile
    from bootseer.ckpt.mount import mount_checkpoint
    from bootseer.ckpt.staging import node_staging_dir
    from bootseer.config import BootseerConfig
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "a.bin").write_bytes(os.urandom(MiB))
    (d / "b.bin").write_bytes(os.urandom(MiB))
    server = nginx_factory(d)
    config = BootseerConfig.from_env(overrides={
        "cache": {"dir": str(tmp_path / "cache/blobs")},
        "ckpt": {"stripe_bytes": 256 * 1024, "fuse": "devfuse"}})
    for n, names in enumerate((["a.bin"], ["a.bin", "b.bin"])):
        mp = tmp_path / f"mnt{n}"
        mp.mkdir()
        with mount_checkpoint(f"{server.url}/", str(mp), config, prefetch=False):
            for name in names:   # the 2nd load: a.bin staged (passthrough), b.bin streams
                assert (mp / name).read_bytes() == (d / name).read_bytes()
    saved = json.loads(profile.profile_path(node_staging_dir(config),
                                            f"{server.url}/").read_text())
    assert sorted(saved["files"]) == ["a.bin", "b.bin"]
    assert saved["ranges"][0] == ["a.bin", 0, MiB]   # first opened, first in the plan
