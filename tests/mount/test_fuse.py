"""The FUSE adapter against a real kernel mount: attributes, reads, errors become errno,
read-only, unmount on SIGTERM, the server killed mid-use."""

from __future__ import annotations

import errno
import os
import signal
import stat
import time

import pytest

from bootseer.errors import DigestMismatch
from bootseer.mount.fuse import MountError, mount
from bootseer.mount.view import Attr

pytestmark = [pytest.mark.timeout(60), pytest.mark.fuse]

FILES = {"/hello.txt": b"hello world\n", "/dir/big.bin": bytes(range(256)) * 8192}


class DictView:
    def getattr(self, path):
        if path in ("/", "/dir"):
            return Attr(mode=stat.S_IFDIR | 0o755, size=0, nlink=2)
        if path == "/link":
            return Attr(mode=stat.S_IFLNK | 0o777, size=9)
        if path == "/corrupt":
            return Attr(mode=stat.S_IFREG | 0o644, size=10)
        if path in FILES:
            return Attr(mode=stat.S_IFREG | 0o644, size=len(FILES[path]), uid=1000, mtime=1e9)
        raise FileNotFoundError(path)

    def readdir(self, path):
        return {"/": ["hello.txt", "dir", "link", "corrupt"], "/dir": ["big.bin"]}[path]

    def readlink(self, path):
        return "hello.txt"

    def read(self, path, size, offset):
        if path == "/corrupt":
            raise DigestMismatch("chunk corrupt", digest="sha256:" + "a" * 64)
        return FILES[path][offset:offset + size]


def test_mount_read_errors_and_unmount(need_fuse, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    with mount(DictView, str(mp), name="dict") as h:
        assert (mp / "hello.txt").read_bytes() == FILES["/hello.txt"]
        assert (mp / "dir/big.bin").read_bytes() == FILES["/dir/big.bin"]
        assert sorted(os.listdir(mp)) == ["corrupt", "dir", "hello.txt", "link"]
        assert os.readlink(mp / "link") == "hello.txt"
        st = os.stat(mp / "hello.txt")
        assert st.st_uid == 1000 and st.st_size == 12
        with pytest.raises(OSError) as e:
            (mp / "corrupt").read_bytes()
        assert e.value.errno == errno.EIO
        with pytest.raises(FileNotFoundError):
            (mp / "missing").read_bytes()
        with pytest.raises(OSError) as e:
            open(mp / "hello.txt", "w")
        assert e.value.errno in (errno.EROFS, errno.EACCES)
        opts = [line for line in open("/proc/mounts") if str(mp) in line][0]
        assert "ro" in opts.split()[3].split(",") and "nosuid" in opts and "nodev" in opts
        pid = h.pid
    assert not os.path.ismount(mp)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_sigterm_unmounts(need_fuse, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    h = mount(DictView, str(mp))
    os.kill(h.pid, signal.SIGTERM)
    h.proc.join(20)
    assert not h.proc.is_alive()
    deadline = time.time() + 10
    while os.path.ismount(mp) and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.ismount(mp)
    h.unmount()


def test_killed_server_gives_clean_errors(need_fuse, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    h = mount(DictView, str(mp))
    h.proc.kill()
    h.proc.join(10)
    with pytest.raises(OSError) as e:
        (mp / "hello.txt").read_bytes()
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO)
    h.unmount()
    assert not os.path.ismount(mp)


def _broken_view():
    raise FileNotFoundError("unknown tree sha256:123")


def test_view_that_cannot_start_is_an_error_before_mounting(need_fuse, tmp_path):
    with pytest.raises(MountError, match="unknown tree"):
        mount(_broken_view, str(tmp_path))
    assert not os.path.ismount(tmp_path)
    with pytest.raises(MountError, match="must pickle"):
        mount(lambda: DictView(), str(tmp_path))
    assert not os.path.ismount(tmp_path)
    with pytest.raises(MountError, match="not a directory"):
        mount(DictView, str(tmp_path / "nope"))
