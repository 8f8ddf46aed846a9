"""Serve a TreeView as a read-only FUSE mount from a child process.

The FUSE loop runs in a forked child so that the caller stays free (and tests can kill
the server to see what clients get). The child builds its view with ``view_factory()``
after the fork (fetcher threads do not survive a fork). Options: ``ro,nosuid,nodev``,
``allow_other`` (the container's processes are other users' too) when served by root; the
mount's ``/sys/class/bdi/<major:minor>/read_ahead_kb`` is raised so the kernel sends
1 MiB reads instead of 128 KiB ones.
"""

from __future__ import annotations

import errno
import functools
import logging
import multiprocessing
import os
import pickle
import signal
import time
from collections.abc import Callable

from bootseer.errors import MountError
from bootseer.mount import libfuse
from bootseer.mount.errno_map import to_errno
from bootseer.mount.handle import MountHandle
from bootseer.mount.kinds import Serving
from bootseer.mount.view import TreeView
from bootseer.node import alive, mounts
from bootseer.node import proc as procs

log = logging.getLogger("bootseer.mount")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def operations(view: TreeView, on_init: Callable[[], None] | None = None):
    """The FUSE operations serving ``view``; ``on_init``: called once the kernel has
    connected (mounted, and libfuse's signal handlers installed)."""
    import mfusepy
    # A user's mount is open to that user alone (no allow_other), whose processes are the
    # only ones that can reach it: every file is shown as theirs, as a rootless container
    # engine maps an image's single owner, so the owner's mode bits (a 0600 root file)
    # apply to them and root (mapped to them in the user namespace) owns the image.
    owner = None if os.geteuid() == 0 else (os.getuid(), os.getgid())

    class Ops(mfusepy.Operations):
        use_ns = False

        def init(self, path):
            if on_init is not None:
                on_init()

        def _call(self, path, fn, *args):
            try:
                return fn(*args)
            except mfusepy.FuseOSError:
                raise
            except BaseException as e:  # noqa: BLE001 - every error becomes an errno
                raise mfusepy.FuseOSError(to_errno(e, path)) from None

        def getattr(self, path, fh=None):
            a = self._call(path, view.getattr, path)
            uid, gid = (a.uid, a.gid) if owner is None else owner
            return {"st_mode": a.mode, "st_size": a.size, "st_uid": uid, "st_gid": gid,
                    "st_mtime": a.mtime, "st_atime": a.mtime, "st_ctime": a.mtime,
                    "st_nlink": a.nlink, "st_rdev": a.rdev,
                    "st_blocks": (a.size + 511) // 512, "st_blksize": a.blksize}

        def readdir(self, path, fh):
            return [".", "..", *self._call(path, view.readdir, path)]

        def readlink(self, path):
            return self._call(path, view.readlink, path)

        def read(self, path, size, offset, fh):
            return self._call(path, view.read, path, size, offset)

        def statfs(self, path):
            if hasattr(view, "statfs"):
                return view.statfs()
            return {"f_bsize": 1 << 20, "f_frsize": 1 << 20, "f_namemax": 255}

        def listxattr(self, path):
            return self._call(path, view.listxattr, path) if hasattr(view, "listxattr") else []

        def getxattr(self, path, name, position=0):
            if not hasattr(view, "getxattr"):
                raise mfusepy.FuseOSError(errno.ENODATA)
            value = self._call(path, view.getxattr, path, name)
            if value is None:
                raise mfusepy.FuseOSError(errno.ENODATA)
            return value

        def destroy(self, path):
            if hasattr(view, "close"):
                view.close()

    # Every callback registered is a round trip into Python for each file opened (release
    # alone cost ~40 us per open+read of a small file). So open/release only for views that
    # want them; the mount is read-only and uses default_permissions, so the kernel itself
    # refuses writes (EROFS) and checks access() from the attributes.
    if hasattr(view, "open"):
        def open_(self, path, flags):
            if flags & WRITE_FLAGS:
                raise mfusepy.FuseOSError(errno.EROFS)
            self._call(path, view.open, path)
            return 0
        Ops.open = open_
    if hasattr(view, "release"):
        def release(self, path, fh):
            self._call(path, view.release, path)
            return 0
        Ops.release = release
    return Ops()


def build_view_or_exit(view_factory, ready):
    """In a server's child: the view, or its error sent to the parent and exit 3 (nothing
    was mounted yet)."""
    try:
        return view_factory()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        ready.send(f"error: {type(e).__name__}: {e}"[:4000])
        os._exit(3)


def _serve(view_factory, mountpoint: str, name: str, ready, parent_pid: int) -> None:
    libfuse.settle()   # before mfusepy looks for the library (with a compiler, else)
    import mfusepy
    os.setsid()
    view = build_view_or_exit(view_factory, ready)
    ready.send("ok")
    ready.close()
    # SIGTERM/SIGINT/SIGHUP: libfuse installs its own handlers (only over SIG_DFL) that end
    # the loop and unmount; a Python handler would never run while fuse_main blocks in C.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    # Every view is immutable while mounted (a tree, a snapshot, a checkpoint whose change
    # fails the read): let the kernel cache pages, attributes, entries and misses. Python
    # imports stat many paths that do not exist; negative caching saves each a round trip.
    # max_idle_threads: libfuse's default (UINT_MAX, "unset") is warned about by its own loop
    try:
        # The mount must not outlive the process that made it (a SIGKILLed `image mount`):
        # SIGTERM when it dies, asked for once mounted, when libfuse's handler is there to
        # turn it into an unmount (a SIGTERM that came while libfuse mounted would end this
        # process with the mount left behind); a parent already gone is signalled at once.
        on_init = functools.partial(procs.die_with_parent, parent_pid, signal.SIGTERM)
        mfusepy.FUSE(operations(view, on_init), mountpoint, foreground=True, ro=True, nosuid=True,
                     nodev=True, allow_other=os.geteuid() == 0, default_permissions=True,
                     fsname=name,
                     kernel_cache=True, attr_timeout=3600, entry_timeout=3600,
                     negative_timeout=3600, max_threads=FUSE_MAX_THREADS,
                     max_idle_threads=FUSE_MAX_THREADS)
    except RuntimeError:   # libfuse has said why (fusermount3: ...); the parent reports it
        os._exit(1)
    os._exit(0)


FUSE_MAX_THREADS = 64
"""Worker threads of a FUSE server (libfuse's default is 10; reads block on the network)."""


def set_read_ahead(mountpoint: str, kb: int) -> bool:
    dev = os.stat(mountpoint).st_dev
    path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(kb))
        return True
    except OSError as e:
        log.info("cannot raise %s: %s (kernel reads stay at 128 KiB)", path, e)
        return False


def mount(view_factory: Callable[[], TreeView], mountpoint: str, *, read_ahead_kb: int = 1024,
          name: str = "bootseer", timeout: float = 30, serve: Callable | None = None,
          serving: Serving = Serving.MFUSEPY, term: bool = False) -> MountHandle:
    """Mount ``view_factory()`` at ``mountpoint`` in a child process; return when it is
    serving. Errors building the view are raised here, before anything is mounted.
    The server dies with this process; what a killed one left is removed first.
    ``serve``/``serving``/``term``: another backend's child entry, its name, and whether
    its server ends on SIGTERM (mount/devfuse)."""
    alive.sweep_dead()   # a mount left at ``mountpoint`` by a SIGKILLed command goes now
    if not os.path.isdir(mountpoint):
        raise MountError(f"mount point {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point")
    if not os.path.exists("/dev/fuse"):
        raise MountError("/dev/fuse is missing: FUSE is not available here")
    # spawn, not fork: a forked child inherits every descriptor other threads hold at that
    # instant (a subprocess's exec-status pipe, another mount's ready pipe, pooled
    # sockets, file locks), and their owners then wait forever for an EOF (seen as a node
    # of bench/e2e hung in `uv` while its image mount started). A spawned server inherits
    # nothing; the view factory must pickle (a module-level function or a partial of one).
    ctx = multiprocessing.get_context("spawn")
    r, w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=serve or _serve,
                       args=(view_factory, mountpoint, name, w, os.getpid()),
                       daemon=False,
                       name=f"bootseer-fuse-{name}")
    try:
        procs.spawn(proc.start)   # pickles the factory; from a thread that outlives the server
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        r.close()
        w.close()
        raise MountError(f"the view factory for {name} must pickle (a module-level "
                         f"function or a functools.partial of one): {e}") from None
    w.close()
    status = ""
    while proc.is_alive() or r.poll(0):
        if r.poll(0.05):
            try:
                status = r.recv()
            except EOFError:
                pass
            break
    r.close()
    if status != "ok":
        proc.join(5)
        raise MountError(f"cannot serve {name} at {mountpoint}: "
                         f"{status.removeprefix('error: ') or 'server died'}")
    deadline = time.time() + timeout
    while not os.path.ismount(mountpoint):
        if not proc.is_alive() or time.time() > deadline:
            proc.kill()
            proc.join(5)
            if mounts.find(mountpoint) is not None:   # mounted, but its root never answered
                mounts.lazy_unmount(mountpoint)
            raise MountError(f"FUSE server for {name} did not mount {mountpoint} "
                             f"(exit {proc.exitcode})")
        time.sleep(0.02)
    state = alive.note_mount(mountpoint)
    set_read_ahead(mountpoint, read_ahead_kb)
    return MountHandle(mountpoint, serving, proc=proc, state=state, term=term)


def run_foreground(view_factory: Callable[[], TreeView], mountpoint: str, *,
                   name: str = "bootseer", mount_with: Callable | None = None) -> int:
    """For the CLI: mount (with ``mount_with``, another backend's mount), wait for
    SIGINT/SIGTERM, unmount."""
    stop = {"sig": None}

    def on_signal(signum, _frame):
        stop["sig"] = signum
    # Handlers first: the mount is visible to others before mount() returns, and a
    # SIGTERM in between must still unmount cleanly, not kill us with the mount left.
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        handle = (mount_with or mount)(view_factory, mountpoint, name=name)
    except BaseException:
        for s, h in old.items():
            signal.signal(s, h)
        raise
    try:
        print(f"mounted {name} at {mountpoint} (Ctrl-C or SIGTERM to unmount)", flush=True)
        while stop["sig"] is None and handle.proc.is_alive():
            time.sleep(0.2)
    finally:
        handle.unmount()
        for s, h in old.items():
            signal.signal(s, h)
    return 0
