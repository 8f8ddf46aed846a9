"""Liveness marks: a process holds an exclusive ``flock`` on a small file for as long as it
lives; the kernel drops the lock when the process dies (SIGKILL and OOM included), so a
mark nobody holds was left by a dead process.

Whether a mark is held is probed by asking for a shared lock on a descriptor of our own:
``flock`` locks belong to the open file description, so the probe conflicts with the
holder even inside the holder's own process, and closing the probe leaves the holder's
lock alone. It sees holders in every PID namespace; ``/proc/locks``, read before, lists only
the locks of processes visible in the reader's namespace (a containerised command sharing
the node's directories took every host command's mark for dead). A mark is locked before
it gets its name (made under a dot name, locked, renamed), so no probe ever finds a live
holder's mark unlocked.

State directories build on marks: every command that mounts or keeps state makes a
:class:`StateDir` (``/tmp/<prefix>XXXX`` holding its mark) and notes in it what it leaves
outside (a mount point, another directory with the command that undoes it). The next
command on the node (:func:`sweep_dead`) removes what a dead command left: its notes undone,
its mounts lazily unmounted deepest first, its directory removed; never a live one's.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

from bootseer.node import mounts as points

log = logging.getLogger(__name__)


class Mark:
    """A held mark at ``path`` (created, or taken over from a dead holder); ``release``
    drops and removes it."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.new-")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.fchmod(fd, 0o644)
            os.rename(tmp, self.path)   # named only once locked
        except BaseException:
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise
        self._fd: int | None = fd

    @classmethod
    def new_in(cls, directory: str | os.PathLike[str]) -> Mark:
        """A mark with a fresh name in ``directory`` (one per holder, even within a
        process)."""
        os.makedirs(directory, exist_ok=True)
        while True:
            path = Path(directory, f"{os.getpid()}-{os.urandom(6).hex()}")
            if not path.exists():
                return cls(path)

    def release(self, *, remove: bool = True) -> None:
        """Drop the lock; ``remove=False`` leaves the file, a dead mark (swept later)."""
        if self._fd is not None:
            if remove:
                self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def held(path: str | os.PathLike[str], locks: object = None) -> bool | None:
    """Whether a live process holds the mark at ``path`` (None: there is no such file).
    ``locks`` is ignored (kept for callers of the earlier ``/proc/locks`` reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return True   # cannot tell (a link, no permission): alive, never remove what may be in use
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True
    finally:
        os.close(fd)   # our probe's lock, if we got it, goes with it
    return False


# -- state directories -----------------------------------------------------------------------
STATE_ROOT = "/tmp"   # fixed, not $TMPDIR: every command on the node must look in one place
# a node run, an image mount, one mount, an image conversion
STATE_PREFIXES = ("bsn-", "bsimg-", "bsmnt-", "bsconv-")
MARK, NOTES = ".alive", ".left-outside"


class StateDir:
    """A command's private directory under ``root``, marked alive while the command lives.
    Creating one first sweeps what dead commands left (``sweep``)."""

    def __init__(self, prefix: str, root: str = STATE_ROOT, *, sweep: bool = True):
        if prefix not in STATE_PREFIXES:
            raise ValueError(f"unknown state prefix {prefix!r} (add it to STATE_PREFIXES)")
        if sweep:
            sweep_dead(root)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        self._mark: Mark | None = Mark(self.path / MARK)
        self._closing = threading.Lock()

    def note_mount(self, mountpoint: str) -> None:
        """A mount this command made outside its directory: unmounted by the next command if
        this one dies with it still mounted (the same mount: its id and device match)."""
        entry = points.find(mountpoint)
        if entry is not None:
            self._note({"mount": entry.mountpoint, "id": entry.mount_id, "dev": entry.dev})

    def note_dir(self, path: str, undo: list[str] | None = None) -> None:
        """A directory this command made outside its own: if it dies, the next command runs
        ``undo`` (e.g. removes the containers whose storage is there), unmounts what is
        left under ``path`` and removes it."""
        self._note({"dir": os.path.realpath(path), "undo": list(undo or [])})

    def _note(self, record: dict[str, object]) -> None:
        # 0600 whatever the umask: a sweep acts only on notes nobody else could write
        fd = os.open(self.path / NOTES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """This command cleaned up after itself: remove the directory (unmounting what is
        still below it). The mark goes last, so a kill midway leaves a dead, swept state."""
        with self._closing:   # one close at a time: a second one finds nothing to do
            mark, self._mark = self._mark, None
            if mark is None:
                return
            points.unmount_under(str(self.path))
            try:
                for child in self.path.iterdir():
                    if child.name == MARK:
                        continue
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
                left = [c for c in self.path.iterdir() if c.name != MARK]
            except FileNotFoundError:
                # gone already: cleaning up must not hide the error that brought us here
                log.warning("state directory %s was removed before its owner closed it",
                            self.path)
                mark.release(remove=False)
                return
            mark.release(remove=not left)   # what could not go now, a later sweep retries
            if not left:
                os.rmdir(self.path)

    def __enter__(self) -> StateDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _private(path: Path) -> bool:
    """Made by us: owned by this user, not writable by others, not a symlink. A directory
    anyone could plant in /tmp must never make us unmount, run or remove anything."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode)


def _notes(state: Path) -> list[dict[str, object]]:
    try:
        fd = os.open(state / NOTES, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return []
        lines = f.read(1 << 20).splitlines()
    out: list[dict[str, object]] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue   # torn by the kill
        if isinstance(record, dict):
            out.append(record)
    return out


def sweep_dead(root: str = STATE_ROOT) -> list[str]:
    """Remove the state dead commands left under ``root`` (see the module docstring);
    return the directories removed. A state being set up or closed (no mark file), one
    whose holder is alive, and one we did not make are left alone."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    candidates = [Path(root, n) for n in names if n.startswith(STATE_PREFIXES)]
    candidates = [p for p in candidates if _private(p) and stat.S_ISDIR(os.lstat(p).st_mode)]
    if not candidates:
        return []
    # (mount point, mount id) of the mounts live commands noted: never unmounted here
    live_mounts: set[tuple[object, object]] = set()
    dead: list[Path] = []
    for path in candidates:
        state = held(path / MARK)
        if state is None:
            continue
        if state:
            live_mounts |= {(r.get("mount"), r.get("id")) for r in _notes(path) if "mount" in r}
        else:
            dead.append(path)
    for path in dead:
        _undo(path, live_mounts)
        log.info("removed %s, left by a command that died", path)
    return [str(p) for p in dead]


def _undo(state: Path, live_mounts: set[tuple[object, object]]) -> None:
    mounted = {(e.mountpoint, e.mount_id, e.dev) for e in points.table()}
    for record in _notes(state):
        undo = record.get("undo")
        if undo and isinstance(undo, list) and all(isinstance(a, str) for a in undo):
            try:
                subprocess.run(undo, capture_output=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                log.warning("cleanup of a dead command's state: %s: %s", undo[0], e)
        where = record.get("dir")
        if isinstance(where, str) and _private(Path(where)):
            _kill_users_of(where)
            points.unmount_under(where)
            shutil.rmtree(where, ignore_errors=True)
        mp = record.get("mount")
        if (isinstance(mp, str) and (mp, record.get("id"), record.get("dev")) in mounted
                and (mp, record.get("id")) not in live_mounts):
            points.lazy_unmount(mp)
    points.unmount_under(str(state))
    shutil.rmtree(state, ignore_errors=True)


def _kill_users_of(path: str) -> None:
    """SIGKILL what still runs on a dead command's private directory: the processes that
    name it in their arguments (a podman that survived its parent's death signal, say,
    left waiting on storage that is about to go)."""
    prefix = path.encode() + b"/"
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if any(a == path.encode() or prefix in a for a in args):
            try:
                os.kill(int(entry), signal.SIGKILL)
                log.info("killed %s, left running on %s by a dead command", entry, path)
            except OSError:
                pass


def note_mount(mountpoint: str) -> StateDir:
    """A state directory of its own for a mount this process just made (a FUSE server's,
    a kernel EROFS mount): if the process dies with it mounted, the next command unmounts
    it. ``close()`` it after unmounting."""
    state = StateDir("bsmnt-", sweep=False)
    state.note_mount(mountpoint)
    return state
