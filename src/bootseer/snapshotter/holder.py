"""A converted image's tree served by a process of its own, which outlives the snapshotter.

Running containers read their image through the tree's mount (EROFS on a FUSE-served
blob, or the FUSE tree view) for as long as they run. Were its servers children of the
snapshotter, an upgrade, a crash or a SIGKILL of the snapshotter would make every running
container's next uncached read fail. So each top layer's tree is mounted by a **holder**
(``python -m bootseer.snapshotter.holder``): a process in its own session, started with no
parent-death signal, that makes the mount (its FUSE servers are its own children, gone with
it) and keeps it until it is told to go (SIGTERM: unmount, then exit) or its server dies.

Its state sits in the snapshot's own ``lazy/`` directory, where the next snapshotter looks:

    holder.alive   a liveness mark (``bootseer.node.alive``: a flock the kernel drops when
                   the holder dies, SIGKILL included)
    holder.json    pid, mount point, tree, how it is served, start time

A new snapshotter adopts a holder whose mark is held (its tree goes on being served, not
even re-mounted) and starts a new one where the mark is dead (the old mount is detached
first: containers that read through the dead one fail loudly, new ones get the new
mount). The spec crosses the pipe as a pickle: parent and holder are the same program.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.errors import MountError
from bootseer.node import alive, handoff

log = logging.getLogger(__name__)
MARK, RECORD = "holder.alive", "holder.json"
START_TIMEOUT_S = 300.0
"""A holder that has neither mounted nor failed by then is stopped (a store that hangs)."""
STOP_TIMEOUT_S = 30.0
"""How long a holder gets to unmount before it is killed."""


@dataclass(frozen=True, slots=True)
class HolderSpec:
    """What a holder serves: tree ``tree`` at ``mountpoint``, its session's files in
    ``state`` (the recording, the start's figures and counters)."""
    config: BootseerConfig
    tree: str
    mountpoint: str
    state: str
    window_s: float


@dataclass(frozen=True, slots=True)
class HolderRecord:
    """``holder.json``: written by the holder once its mount serves."""
    pid: int
    mountpoint: str
    tree: str
    serving: str
    started: float
    hot_chunks: int


class Holder:
    """A holder process, started here (``popen``) or adopted from a snapshotter before."""

    def __init__(self, record: HolderRecord, state: str,
                 popen: subprocess.Popen[bytes] | None = None):
        self.record, self.state, self._popen = record, state, popen

    @property
    def pid(self) -> int:
        return self.record.pid

    @classmethod
    def start(cls, spec: HolderSpec, timeout_s: float = START_TIMEOUT_S) -> Holder:
        """Start a holder for ``spec``; return once its mount serves. Raises MountError
        (what the holder said) when it cannot mount; nothing of it is left running."""
        if Holder.adopt(spec.state) is not None:
            raise MountError(f"a live holder already serves {spec.mountpoint}")
        # own session, no parent-death signal, nothing inherited: it outlives us
        p, text = handoff.start([sys.executable, "-m", "bootseer.snapshotter.holder"], spec,
                                timeout_s=timeout_s)
        if not text.startswith("ok"):
            if p.poll() is None:
                p.kill()
            p.wait(10)
            why = text.removeprefix("error: ") or f"its holder exited ({p.returncode})"
            raise MountError(f"cannot serve tree {spec.tree} at {spec.mountpoint}: {why}")
        record = _read_record(spec.state)
        if record is None:
            p.kill()
            p.wait(10)
            raise MountError(f"the holder of {spec.mountpoint} wrote no {RECORD}")
        return cls(record, spec.state, p)

    @classmethod
    def adopt(cls, state: str) -> Holder | None:
        """The live holder whose state is ``state``, or None (never started, or dead)."""
        if alive.held(Path(state, MARK)) is not True:
            return None
        record = _read_record(state)
        return cls(record, state) if record is not None else None

    def alive(self) -> bool:
        if self._popen is not None and self._popen.poll() is not None:
            return False   # our child exited (reaped here, so no zombie stays)
        return alive.held(Path(self.state, MARK)) is True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask the holder to unmount and end (SIGTERM); kill it when it hangs. The mark
        proves the pid is still the holder's (held only while it lives)."""
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout_s
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.alive():
                log.warning("holder %d of %s did not stop: killed", self.pid,
                            self.record.mountpoint)
                os.kill(self.pid, signal.SIGKILL)
        if self._popen is not None:
            try:
                self._popen.wait(10)
            except subprocess.TimeoutExpired:
                pass


def _read_record(state: str) -> HolderRecord | None:
    try:
        doc = json.loads(Path(state, RECORD).read_text())
        return HolderRecord(**doc)
    except (OSError, ValueError, TypeError):
        return None


def release_all(root: str) -> int:
    """Stop every live holder under the snapshotter root ``root`` (its trees are
    unmounted); the number stopped. For removal and ``--cleanup-on-close``."""
    n = 0
    for mark in Path(root, "snapshots").glob(f"*/lazy/{MARK}"):
        h = Holder.adopt(str(mark.parent))
        if h is not None:
            h.stop()
            n += 1
    return n


# -- the holder process ---------------------------------------------------------------------
def _say(text: str) -> None:
    try:
        os.write(1, (text.replace("\n", " ") + "\n").encode())
    except OSError:
        pass   # the snapshotter that started us is gone: nobody waits for the line
    # stdout goes nowhere from now on: a write to a dead snapshotter's pipe fails
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def main() -> int:
    """The holder: read the spec, take the mark, mount, say ``ok``, serve until SIGTERM
    (or the server's death), unmount."""
    spec: HolderSpec = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=logging.INFO,
                        format=f"bootseer: holder[{os.getpid()}] %(levelname)s %(name)s: "
                               f"%(message)s")
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda n, f: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.makedirs(spec.state, exist_ok=True)
    mark = alive.Mark(Path(spec.state, MARK))
    from bootseer.image.session import mount_image
    try:
        handle, tree, profile, _ = mount_image(spec.config, spec.tree, spec.mountpoint,
                                               spec.state, record=True, prefetch=True,
                                               window_timeout_s=spec.window_s)
    except Exception as e:   # noqa: BLE001 - said to the snapshotter, which falls back
        _say(f"error: {type(e).__name__}: {e}"[:4000])
        mark.release()
        return 3
    record = HolderRecord(pid=os.getpid(), mountpoint=spec.mountpoint, tree=tree,
                          serving=handle.backend, started=time.time(),
                          hot_chunks=len(profile["chunks"]) if profile else 0)
    tmp = Path(spec.state, f".{RECORD}.tmp")
    tmp.write_text(json.dumps(asdict(record)))
    tmp.rename(Path(spec.state, RECORD))
    _say("ok")
    try:
        while not stop.wait(0.5):
            if not handle.proc.is_alive():
                log.error("the server of %s died: unmounted, for the snapshotter to serve "
                          "it again", spec.mountpoint)
                break
    finally:
        try:
            handle.unmount()
        finally:
            Path(spec.state, RECORD).unlink(missing_ok=True)
            mark.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
