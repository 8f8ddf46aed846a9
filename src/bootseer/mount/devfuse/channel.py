"""One FUSE connection: ``/dev/fuse`` opened, mounted with ``mount(2)`` (no fusermount3,
no libfuse), requests read and answers written, backing files registered for passthrough.

Needs CAP_SYS_ADMIN (the mount itself and FUSE_DEV_IOC_BACKING_OPEN); the node agent is
root. The descriptor is non-blocking so that worker threads can wait next to a stop pipe:
a thread blocked in ``read`` on /dev/fuse would keep the connection alive after its owner
wants it gone (a detached mount with files held open is never aborted by the kernel).

Each worker waits in an epoll of its own that holds /dev/fuse with EPOLLEXCLUSIVE. The
kernel queues each request with one ``wake_up`` on the connection's input wait queue, and
that wakes every plain ``poll`` waiter but only one exclusive one: with ``poll`` all idle
workers woke for every request (and all but one found nothing), now one does. The stop
pipe sits in each epoll without the flag, so a stop still wakes them all.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select

from bootseer.errors import MountError
from bootseer.mount.devfuse import protocol as p
from bootseer.node import mounts
from bootseer.node.libc import libc

log = logging.getLogger("bootseer.mount")

MAX_READ = 1 << 20
"""The kernel's limit here (/proc/sys/fs/fuse/max_pages_limit = 256 pages)."""
BUFFER_BYTES = MAX_READ + 64 * 1024
"""A request buffer: the kernel refuses reads of /dev/fuse into less than max_write plus
headers, and a read-only server sets max_write to 4 KiB, so this is plenty."""


def mount_fd(mountpoint: str, name: str) -> int:
    """Open /dev/fuse and mount it read-only, nosuid, nodev at ``mountpoint`` (type
    ``fuse.bootseer``, source ``name``); return the descriptor."""
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        data = (f"fd={fd},rootmode=40000,user_id=0,group_id=0,default_permissions,"
                f"allow_other,max_read={MAX_READ}")
        mounts.mount(name, mountpoint, "fuse.bootseer",
                     mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV, data)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unmount(mountpoint: str) -> None:
    """Unmount; a mount still in use (files held open) is detached instead: the name goes
    now, open files keep working until closed. One already gone (its owner unmounted it
    first) is no error, nor one that cannot go: the server stops either way."""
    try:
        mounts.unmount(mountpoint)
    except MountError as e:
        log.warning("%s", e)


class Channel:
    """The request/answer side of one connection; safe to use from many threads (each
    request is read whole by one ``read`` and answered by one ``writev``)."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self.stopping = False

    def listener(self) -> Listener:
        """A wait of one's own for one worker thread (close it when the thread ends)."""
        return Listener(self)

    def receive(self, buf: bytearray) -> int:
        """:meth:`Listener.receive` for a one-off read (INIT)."""
        with self.listener() as listener:
            return listener.receive(buf)

    def reply(self, unique: int, error: int = 0, *payload) -> bool:
        """Answer request ``unique``: ``error`` a positive errno, or 0 and the payload.
        False when nobody waits for the answer any more."""
        size = p.OUT_HEADER.size + sum(len(x) for x in payload)
        try:
            os.writev(self.fd, [p.OUT_HEADER.pack(size, -error, unique), *payload])
        except OSError as e:
            # ENOENT: the caller was interrupted and gave up; ENODEV: unmounted meanwhile
            if e.errno not in (errno.ENOENT, errno.ENODEV, errno.EBADF):
                raise
            return False
        return True

    def backing_open(self, path: str) -> int:
        """Register ``path`` (a complete local file) as a backing file; its id for
        FOPEN_PASSTHROUGH. The kernel holds the file from now on, not our descriptor."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:   # the id is ioctl's return value, which fcntl.ioctl does not hand back
            arg = ctypes.create_string_buffer(p.BACKING_MAP.pack(fd, 0, 0))
            backing_id = libc.ioctl(self.fd, p.DEV_IOC_BACKING_OPEN, arg)
            if backing_id < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"FUSE_DEV_IOC_BACKING_OPEN {path}: {os.strerror(err)}")
            return backing_id
        finally:
            os.close(fd)

    def backing_close(self, backing_id: int) -> None:
        # an error means the connection is gone, and the kernel dropped the file with it
        libc.ioctl(self.fd, p.DEV_IOC_BACKING_CLOSE, ctypes.byref(ctypes.c_uint32(backing_id)))

    def stop(self) -> None:
        """Wake every thread waiting in :meth:`receive`; they return 0."""
        self.stopping = True
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass

    def close(self) -> None:
        """Close the device (aborts the connection once no thread reads it any more)."""
        for fd in (self.fd, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fd = -1


class Listener:
    """One worker's wait on the channel: woken alone for a request (EPOLLEXCLUSIVE), or
    with every other worker by :meth:`Channel.stop`."""

    def __init__(self, channel: Channel):
        self.channel = channel
        self._epoll = select.epoll(2)
        try:
            self._epoll.register(channel.fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)
            self._epoll.register(channel._stop_r, select.EPOLLIN)
        except BaseException:
            self._epoll.close()
            raise

    def receive(self, buf: bytearray) -> int:
        """Wait for one request and read it into ``buf``; its length, or 0 when the
        connection ended (unmounted, aborted) or :meth:`Channel.stop` was called."""
        channel = self.channel
        while not channel.stopping:
            events = self._epoll.poll()
            if any(fd == channel._stop_r for fd, _ in events):
                return 0
            try:
                return os.readv(channel.fd, [buf])
            except BlockingIOError:   # woken with another worker, which took it
                continue
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.ENOENT:   # the request was interrupted meanwhile
                    continue
                if e.errno in (errno.ENODEV, errno.ECONNABORTED, errno.EBADF):
                    return 0
                raise
        return 0

    def close(self) -> None:
        self._epoll.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
