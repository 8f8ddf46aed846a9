"""bench/image's local rows: the honest baseline and the truth the hot set is judged by.

(4) fully local: the image pulled by podman beforehand (not timed) into storage on the
    node's disk, as a user who has it runs it: ``podman run`` from that storage, timed from
    the command to the job's READY line. Before each run every file of that podman storage
    is synced and evicted from the page cache with posix_fadvise(POSIX_FADV_DONTNEED) (only
    this image's files: drop_caches would also empty everyone else's caches); the bytes
    still resident afterwards are reported (``left_resident_bytes``).
truth: the image's rootfs copied onto an ext4 file system on a loop device the bench makes
    (its backing file on the scratch tmpfs; the root disk's own read-ahead is 8 MiB, a loop
    device's the kernel default), mounted afresh and every file evicted (a remount alone
    may find the old superblock and its cache alive), the loop device's read-ahead set,
    the workload run once in it (the chroot runtime, a private overlay over it), then every
    file's residency read with mincore(2): the bytes the start brought into the page cache,
    at 128 KiB read-ahead and at 0 (the pages it touched), less any resident before the
    run. Goal (issue #25): the profile's hot bytes / resident bytes at 128 KiB <= 1.3.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bootseer.node.libc import libc
from bootseer.run import container

PAGE = os.sysconf("SC_PAGE_SIZE")
READY_FILE = "/tmp/bootseer-ready"


def _files(root: Path):
    """Each regular file under ``root`` once (hard links counted once), mounts skipped."""
    seen: set[tuple[int, int]] = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not os.path.ismount(os.path.join(d, x))]
        for name in files:
            p = os.path.join(d, name)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if not (st.st_mode & 0o170000 == 0o100000) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            yield p, st.st_size


def resident_bytes(path: str, size: int) -> int:
    """Bytes of ``path`` in the page cache (mincore(2) over a private mapping, which
    reads nothing)."""
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        m = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    pages = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    try:
        buf = ctypes.c_char.from_buffer(m)
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size),
                            vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
        finally:
            del buf
    finally:
        m.close()
    n = sum(v & 1 for v in vec)
    if n and vec[pages - 1] & 1:   # the last page counts only the file's bytes
        return (n - 1) * PAGE + size - (pages - 1) * PAGE
    return n * PAGE


def residency(root: Path) -> dict:
    total = files = touched = size_all = 0
    for p, size in _files(root):
        r = resident_bytes(p, size)
        files += 1
        total += r
        touched += r > 0
        size_all += size
    return {"resident_bytes": total, "files": files, "files_touched": touched,
            "bytes": size_all}


def evict(root: Path) -> None:
    """Every file under ``root`` out of the page cache (written back first)."""
    os.sync()
    for p, _size in _files(root):
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class LocalImage:
    """The image pulled by podman into private storage on the node's disk."""

    def __init__(self, ref: str, netns: str | None):
        # podman refuses a long --runroot: short paths under /tmp (the root disk)
        self.dir = Path(tempfile.mkdtemp(prefix="bsb4-", dir="/tmp"))
        self.ref, self.ns = ref, (["nsenter", f"--net=/run/netns/{netns}"] if netns else [])
        self.podman = ["podman", "--root", f"{self.dir}/r", "--runroot", f"{self.dir}/rr",
                       "--cgroup-manager", "cgroupfs", "--events-backend", "file",
                       "--storage-driver", "overlay"]

    def pull(self) -> None:
        subprocess.run([*self.ns, *self.podman, "pull", "-q", "--tls-verify=false", self.ref],
                       check=True, stdout=subprocess.DEVNULL)

    def run_evicted(self, code: str) -> dict:
        """(4): evict the storage's files, then ``podman run``; seconds to READY."""
        evict(self.dir / "r")
        left = residency(self.dir / "r")["resident_bytes"]
        # the flags bootseer's own podman runtime passes (runc, host network and IPC, the
        # host's hard limits: podman's defaults exceed what this node allows)
        argv = [*self.podman, "run", "--rm", "--pull", "never",
                *container.podman_option_flags(container.Options(network="host")),
                "-e", f"BOOTSEER_READY_FILE={READY_FILE}", self.ref, "python3", "-c", code]
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = None
        assert p.stdout is not None
        for line in p.stdout:
            if line.strip() == "READY" and ready is None:
                ready = time.monotonic() - t0
        err = p.stderr.read() if p.stderr else ""
        if p.wait() != 0 or ready is None:
            raise SystemExit(f"(4) podman run failed (exit {p.returncode}): {err[-3000:]}")
        return {"ready_s": round(ready, 3), "left_resident_bytes": left}

    @contextlib.contextmanager
    def rootfs(self):
        out = subprocess.run([*self.podman, "image", "mount", self.ref], check=True,
                             capture_output=True, text=True).stdout.strip()
        try:
            yield Path(out)
        finally:
            subprocess.run([*self.podman, "image", "unmount", "--all", "--force"],
                           capture_output=True)

    def close(self) -> None:
        subprocess.run([*self.podman, "image", "unmount", "--all", "--force"],
                       capture_output=True)
        subprocess.run([*self.podman, "rm", "--all", "--force"], capture_output=True)
        subprocess.run(["umount", "-R", "-l", f"{self.dir}/r"], capture_output=True)
        subprocess.run(["rm", "-rf", str(self.dir)], check=False)


def hot_bytes(p: dict) -> dict:
    """The profile's hot set: whole chunks, and the blocks read where it lists them
    (``block_size`` and ``blocks``: per chunk, the indices of the blocks the start read)."""
    chunks = sum(r[4] for r in p["chunks"])
    bsize, blocks = p.get("block_size"), p.get("blocks") or {}
    out = {"hot_chunks": len(p["chunks"]), "hot_bytes": chunks}
    if bsize and blocks:
        out["hot_block_bytes"] = sum(
            sum(max(0, min(bsize, r[4] - i * bsize)) for i in blocks[r[0]])
            if r[0] in blocks else r[4] for r in p["chunks"])
    return out


def truth(rootfs: Path, code: str, scratch: Path, *, read_ahead_kb: tuple[int, ...] = (128, 0)
          ) -> dict[int, dict]:
    """The workload on an ext4 copy of ``rootfs`` with a cold page cache, once per
    read-ahead: {read_ahead_kb: residency}."""
    backing, mnt = scratch / "truth.ext4", scratch / "truth"
    used = int(subprocess.run(["du", "-sb", "-x", str(rootfs)], check=True, capture_output=True,
                              text=True).stdout.split()[0])
    subprocess.run(["truncate", "-s", str(used * 3 // 2 + (256 << 20)), str(backing)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0", str(backing)],
                   check=True)
    loop = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True,
                          capture_output=True, text=True).stdout.strip()
    mnt.mkdir()
    out: dict[int, dict] = {}
    try:
        subprocess.run(["mount", loop, str(mnt)], check=True)
        subprocess.run(["cp", "-a", f"{rootfs}/.", str(mnt)], check=True)
        subprocess.run(["umount", str(mnt)], check=True)
        ra = Path("/sys/block") / Path(loop).name / "queue/read_ahead_kb"
        for kb in read_ahead_kb:
            subprocess.run(["blockdev", "--flushbufs", loop], check=True)
            ra.write_text(str(kb))
            subprocess.run(["mount", "-o", "ro", loop, str(mnt)], check=True)
            try:
                # a fresh mount may find the superblock, and its page cache, still alive
                # (the runtime's overlay over it is torn down after the run ends): evict too
                evict(mnt)
                before = residency(mnt)["resident_bytes"]
                c = container.Container(rootfs=str(mnt), argv=["python3", "-c", code],
                                        env={"BOOTSEER_READY_FILE": READY_FILE})
                rc = container.run(c, runtime="chroot")
                if rc != 0:
                    raise SystemExit(f"the truth run (read-ahead {kb} KiB) failed: exit {rc}")
                r = residency(mnt)
                r["resident_bytes"] -= before
                r["before_bytes"] = before
                out[kb] = r
            finally:
                subprocess.run(["umount", str(mnt)], check=True)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        subprocess.run(["losetup", "-d", loop], capture_output=True)
        backing.unlink(missing_ok=True)
    return out
