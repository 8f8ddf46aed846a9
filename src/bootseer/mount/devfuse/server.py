"""Serve any :class:`~bootseer.mount.view.TreeView` over one /dev/fuse connection.

Worker threads each wait for a request, answer it and wait again (the kernel hands each
request to one reader and wakes one idle worker for it), so slow reads (a stripe still on
the network) never hold up lookups or other files. A view may offer
``backing_path(path) -> str | None``: a complete, verified local copy of the file. An OPEN
of such a file is then answered with FOPEN_PASSTHROUGH and a backing id: the kernel reads
and mmaps that copy itself and this server sees no READ for it. Files without one keep
the Python read path.

The kernel refuses (EIO) an inode opened both ways at once, so the mode is decided per
node: while any open of a file reads through Python, new opens do too, and while any
reads through passthrough, new opens share its backing file.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import threading
import time
from dataclasses import dataclass

from bootseer.errors import MountError
from bootseer.mount.devfuse import protocol as p
from bootseer.mount.devfuse.channel import BUFFER_BYTES, MAX_READ, Channel, mount_fd, unmount
from bootseer.mount.errno_map import to_errno
from bootseer.mount.view import TreeView

log = logging.getLogger("bootseer.mount")

CACHE_SECONDS = 3600
"""Entries, attributes and misses stay valid this long: every view is immutable while
mounted, and Python imports stat many names that do not exist."""
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
FH_PYTHON, FH_PASSTHROUGH = 1, 2   # what RELEASE must undo


class ServerError(MountError):
    pass


@dataclass(slots=True)
class _FileIO:
    python: int = 0            # opens on the Python read path
    passthrough: int = 0       # opens on the backing file
    backing_id: int = -1


class Server:
    """``start()`` mounts and answers INIT; ``stop()`` unmounts (detaching a mount whose
    files are held open), ends the workers and closes the device. ``counts`` (requests by
    kind) and ``reads`` (READ requests by path) say what reached Python."""

    def __init__(self, view: TreeView, mountpoint: str, *, name: str = "bootseer",
                 threads: int = 16):
        self.view, self.mountpoint, self.name, self.threads = view, mountpoint, name, threads
        self.counts: collections.Counter = collections.Counter()
        self.reads: collections.Counter = collections.Counter()
        self.passthrough = False     # the kernel agreed to passthrough at INIT
        self.kernel_minor = 0
        self.ended = threading.Event()   # the connection is gone (unmounted, aborted)
        self._channel: Channel | None = None
        self._workers: list[threading.Thread] = []
        self._paths = {1: "/"}
        self._ids = {"/": 1}
        self._files: dict[int, _FileIO] = {}
        self._lock = threading.Lock()
        self._backing_failed_said = False
        self._live = 0                    # workers not yet returned
        self._close_when_idle = False

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> Server:
        fd = mount_fd(self.mountpoint, self.name)
        channel = self._channel = Channel(fd)
        try:
            self._init(channel)
        except BaseException:
            unmount(self.mountpoint)
            channel.close()
            raise
        self._live = self.threads
        for i in range(self.threads):
            t = threading.Thread(target=self._work, args=(channel,), name=f"devfuse-{i}",
                                 daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self, timeout: float = 10) -> None:
        """Idempotent. Open files of the Python path fail (ENOTCONN) after this; the
        name is gone either way."""
        if self._channel is None:
            return
        unmount(self.mountpoint)
        self._channel.stop()
        deadline = time.monotonic() + timeout
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for io in self._files.values():
                if io.passthrough:
                    self._channel.backing_close(io.backing_id)
            self._files.clear()
            # a worker still in a view call would write its late reply into whatever
            # reuses the descriptor: then the last worker out closes it
            self._close_when_idle = self._live > 0
            if self._live:
                log.warning("devfuse %s: %d workers still busy at stop", self.mountpoint,
                            self._live)
            else:
                self._channel.close()
        self._channel = None
        self.ended.set()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _connected(self) -> Channel:
        """The connection, between ``start()`` and ``stop()``."""
        if self._channel is None:
            raise ServerError(errno.ENOTCONN, f"devfuse {self.mountpoint}: not mounted")
        return self._channel

    def _init(self, channel: Channel) -> None:
        buf = bytearray(BUFFER_BYTES)
        n = channel.receive(buf)
        length, opcode, unique, *_ = p.IN_HEADER.unpack_from(buf)
        if n == 0 or opcode != p.INIT:
            raise ServerError(errno.EPROTO, f"FUSE: expected INIT, got opcode {opcode}")
        major, minor, readahead, flags, flags2 = p.INIT_IN.unpack_from(buf, p.IN_HEADER.size)
        if major != p.KERNEL_VERSION or minor < p.ANSWERED_MINOR:
            channel.reply(unique, errno.EPROTO)
            raise ServerError(errno.EPROTO, f"FUSE protocol {major}.{minor} (need 7.40+)")
        self.kernel_minor = minor
        offered = flags | ((flags2 << 32) if flags & p.INIT_EXT else 0)
        wanted = p.ASYNC_READ | p.PARALLEL_DIROPS | p.MAX_PAGES | p.CACHE_SYMLINKS | p.INIT_EXT
        # passthrough only for views that can use it: it also marks the superblock as
        # stacked, which file-backed mounts (EROFS) on this mount would refuse
        if hasattr(self.view, "backing_path"):
            wanted |= p.PASSTHROUGH
        agreed = wanted & offered
        self.passthrough = bool(agreed & p.PASSTHROUGH)
        out = p.INIT_OUT.pack(p.KERNEL_VERSION, p.ANSWERED_MINOR, readahead,
                              agreed & 0xFFFFFFFF, 64, 48, 4096, 1, MAX_READ // 4096, 0,
                              agreed >> 32, 1 if self.passthrough else 0)
        channel.reply(unique, 0, out)

    # -- requests -----------------------------------------------------------------------------
    def _work(self, channel: Channel) -> None:
        buf = bytearray(BUFFER_BYTES)
        view = memoryview(buf)
        try:
            with channel.listener() as listener:
                while n := listener.receive(buf):
                    self._handle(channel, view[:n])
            if not channel.stopping:   # unmounted from outside
                self.ended.set()
        except OSError as e:   # the device failed under us: the mount is unusable
            log.error("devfuse %s: %s", self.mountpoint, e)
            self.ended.set()
        finally:
            with self._lock:
                self._live -= 1
                if self._live == 0 and self._close_when_idle:
                    channel.close()

    def _handle(self, channel: Channel, req: memoryview) -> None:
        _, opcode, unique, node, *_ = p.IN_HEADER.unpack_from(req)
        body = req[p.IN_HEADER.size:]
        self.counts[p.NAMES.get(opcode, str(opcode))] += 1
        if opcode in p.NO_REPLY:
            return   # node ids are never reused, so forgetting one needs nothing
        handler = self._handlers.get(opcode)
        if handler is None:
            channel.reply(unique, errno.ENOSYS)
            return
        path = self._paths.get(node, "")
        try:
            payload = handler(self, node, path, body)
        except BaseException as e:  # noqa: BLE001 - every error becomes an errno
            channel.reply(unique, to_errno(e, path))
            return
        if isinstance(payload, int):
            channel.reply(unique, payload)
        elif isinstance(payload, _OpenReply):
            if not channel.reply(unique, 0, payload.data):
                self._undo_open(node, payload.fh)   # the opener gave up: no RELEASE comes
        else:
            channel.reply(unique, 0, *payload)

    def _node(self, path: str) -> int:
        with self._lock:
            got = self._ids.get(path)
            if got is None:
                got = self._ids[path] = len(self._paths) + 1
                self._paths[got] = path
            return got

    @staticmethod
    def _child(path: str, name: bytes) -> str:
        return path.rstrip("/") + "/" + os.fsdecode(bytes(name).split(b"\0", 1)[0])

    def _lookup(self, node, path, body):
        child = self._child(path, body)
        try:
            a = self.view.getattr(child)
        except FileNotFoundError as e:
            if to_errno(e) != errno.ENOENT:
                raise
            return (p.entry_bytes(0, None, CACHE_SECONDS),)   # a cached miss
        return (p.entry_bytes(self._node(child), a, CACHE_SECONDS),)

    def _getattr(self, node, path, body):
        return (p.ATTR_OUT.pack(CACHE_SECONDS, 0, 0), p.attr_bytes(self.view.getattr(path), node))

    def _readlink(self, node, path, body):
        return (os.fsencode(self.view.readlink(path)),)

    def _open(self, node, path, body):
        flags, _ = p.OPEN_IN.unpack_from(body)
        if flags & WRITE_FLAGS:
            return errno.EROFS
        if hasattr(self.view, "open"):
            self.view.open(path)
        backing = None
        if self.passthrough and hasattr(self.view, "backing_path"):   # as agreed at INIT
            try:
                backing = self.view.backing_path(path)
            except Exception as e:  # noqa: BLE001 - the Python path still works
                log.warning("no passthrough for %s: %s", path, e)
        with self._lock:
            io = self._files.setdefault(node, _FileIO())
            if not io.passthrough and backing and not io.python:
                try:
                    io.backing_id = self._connected().backing_open(backing)
                except OSError as e:   # gc removed it, or the kernel refused: Python reads
                    if not self._backing_failed_said:
                        self._backing_failed_said = True
                        log.warning("passthrough refused for %s (%s): Python read path", path, e)
            if io.backing_id >= 0:   # never set while Python-path opens exist
                io.passthrough += 1
                return _OpenReply(FH_PASSTHROUGH, p.OPEN_OUT.pack(
                    FH_PASSTHROUGH, p.FOPEN_PASSTHROUGH | p.FOPEN_NOFLUSH, io.backing_id))
            io.python += 1
        return _OpenReply(FH_PYTHON, p.OPEN_OUT.pack(
            FH_PYTHON, p.FOPEN_KEEP_CACHE | p.FOPEN_NOFLUSH, 0))

    def _undo_open(self, node: int, fh: int) -> None:
        with self._lock:
            io = self._files.get(node)
            if io is None:
                return
            if fh == FH_PASSTHROUGH:
                io.passthrough -= 1
                if io.passthrough == 0:
                    self._connected().backing_close(io.backing_id)
                    io.backing_id = -1
            else:
                io.python -= 1
            if not io.passthrough and not io.python:
                del self._files[node]

    def _release(self, node, path, body):
        fh, *_ = p.RELEASE_IN.unpack_from(body)
        self._undo_open(node, fh)
        if hasattr(self.view, "release"):
            self.view.release(path)
        return 0

    def _read(self, node, path, body):
        _, offset, size, _ = p.READ_IN.unpack_from(body)
        self.reads[path] += 1
        return (self.view.read(path, size, offset),)

    def _statfs(self, node, path, body):
        s = self.view.statfs() if hasattr(self.view, "statfs") else {}
        return (p.KSTATFS.pack(s.get("f_blocks", 0), s.get("f_bfree", 0), s.get("f_bavail", 0),
                               s.get("f_files", 0), s.get("f_ffree", 0),
                               s.get("f_bsize", 1 << 20), s.get("f_namemax", 255),
                               s.get("f_frsize", 1 << 20), 0),)

    @staticmethod
    def _sized(data: bytes, body) -> tuple | int:
        """getxattr/listxattr: size 0 asks for the length, a short buffer is ERANGE."""
        size, _ = p.GETXATTR_IN.unpack_from(body)
        if size == 0:
            return (p.GETXATTR_OUT.pack(len(data), 0),)
        return (data,) if len(data) <= size else errno.ERANGE

    def _getxattr(self, node, path, body):
        if not hasattr(self.view, "getxattr"):
            return errno.ENODATA
        name = os.fsdecode(bytes(body[p.GETXATTR_IN.size:]).split(b"\0", 1)[0])
        value = self.view.getxattr(path, name)
        if value is None:
            return errno.ENODATA
        return self._sized(value if isinstance(value, bytes) else os.fsencode(value), body)

    def _listxattr(self, node, path, body):
        names = self.view.listxattr(path) if hasattr(self.view, "listxattr") else []
        return self._sized(b"".join(os.fsencode(n) + b"\0" for n in names), body)

    def _opendir(self, node, path, body):
        # listings never change while mounted: let the kernel keep them
        return (p.OPEN_OUT.pack(0, p.FOPEN_CACHE_DIR | p.FOPEN_KEEP_CACHE, 0),)

    def _readdir(self, node, path, body):
        _, offset, size, _ = p.READ_IN.unpack_from(body)
        names = [".", "..", *self.view.readdir(path)]
        out, used = [], 0
        for i in range(offset, len(names)):
            name = names[i]
            ino = node if name == "." else 1 if name == ".." else self._node(
                self._child(path, os.fsencode(name)))
            ent = p.dirent_bytes(ino, i + 1, os.fsencode(name),
                                 0o040000 if name in (".", "..") else 0)
            if used + len(ent) > size:
                break
            out.append(ent)
            used += len(ent)
        return (b"".join(out),)

    def _ok(self, node, path, body):
        return 0

    def _enosys(self, node, path, body):
        return errno.ENOSYS   # FLUSH: the kernel stops sending it after one ENOSYS

    def _ioctl(self, node, path, body):
        return errno.ENOTTY   # isatty() of every Python open(); no file here is a tty

    _handlers = {p.LOOKUP: _lookup, p.GETATTR: _getattr, p.READLINK: _readlink,
                 p.OPEN: _open, p.READ: _read, p.RELEASE: _release, p.STATFS: _statfs,
                 p.GETXATTR: _getxattr, p.LISTXATTR: _listxattr, p.OPENDIR: _opendir,
                 p.READDIR: _readdir, p.RELEASEDIR: _ok, p.FLUSH: _enosys,
                 p.IOCTL: _ioctl, p.DESTROY: _ok}


@dataclass(frozen=True, slots=True)
class _OpenReply:
    fh: int
    data: bytes


__all__ = ["Server", "ServerError"]
