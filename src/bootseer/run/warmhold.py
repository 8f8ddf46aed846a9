"""The image a kept zygote runs on, when the run serves it itself (a lazy image whose blob a
FUSE server in the run's process serves): held by a process of its own for as long as the
zygote lives.

A zygote kept between containers reads its image after the run that started it has ended
(the pages of its libraries it has not read yet, the files its workers open). The run's own
mount goes with the run, so the zygote gets a second mount of the same tree, made and kept
by a **holder** (``python -m bootseer.run.warmhold STATE``): a process in its own session,
with no parent-death signal, that mounts the tree (its FUSE servers are its children), then
starts the zygote's container on that mount as its own child, and, once the container has
ended (the zygote idled out, or was stopped by its PID), unmounts and removes what it made.
SIGTERM stops the container first. The tree's chunks the run has read are in the node cache,
so the second mount reads them locally. The spec crosses the pipe as a pickle: parent and
holder are the same program.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

from bootseer.config import BootseerConfig
from bootseer.errors import MountError
from bootseer.node import handoff
from bootseer.run import container as C

log = logging.getLogger(__name__)
START_TIMEOUT_S = 120.0
"""A holder that has neither mounted nor failed by then is stopped (a store that hangs)."""
STOP_TIMEOUT_S = 30.0
"""How long a holder gets to unmount once its zygote's container has ended."""


@dataclass(frozen=True)
class HoldSpec:
    """Mount ``ref`` at ``container.rootfs`` (in ``folder``, removed at the end), then run
    ``container`` (``chroot_command`` with ``state``, which names the zygote's process);
    its output to ``log``."""
    config: BootseerConfig
    ref: str
    folder: str
    container: C.Container
    state: str
    log: str


def start(spec: HoldSpec, timeout_s: float = START_TIMEOUT_S) -> tuple[int, int]:
    """Start a holder; return (its PID, the zygote container's PID) once the mount serves
    and the container was started. MountError: it could not mount (nothing is left)."""
    with open(os.path.join(spec.folder, "holder.log"), "wb") as err:
        # own session, no parent-death signal: it outlives this run by design
        p, text = handoff.start([sys.executable, "-m", "bootseer.run.warmhold", spec.state],
                                spec, timeout_s=timeout_s, stderr=err)
    if not text.startswith("ok "):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)   # it unmounts what it mounted
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        else:
            p.wait()
        shutil.rmtree(spec.folder, ignore_errors=True)
        raise MountError(text.removeprefix("error: ") or f"its holder exited ({p.returncode})")
    return p.pid, int(text.split()[1])


def _say(text: str) -> None:
    try:
        os.write(1, (text.replace("\n", " ") + "\n").encode())
    except OSError:
        pass   # the run that started us is gone
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def main() -> int:
    """The holder: mount, start the container, say ``ok PID``, wait for the container (or
    SIGTERM, or the mount's server's death: then stop it), unmount, remove the folder."""
    spec: HoldSpec = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=logging.INFO,
                        format=f"bootseer: warm holder[{os.getpid()}] %(message)s")
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda n, f: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from bootseer.image.session import mount_image
    session = os.path.join(spec.folder, "session")
    os.makedirs(spec.container.rootfs, exist_ok=True)
    try:
        handle, *_ = mount_image(spec.config, spec.ref, spec.container.rootfs, session,
                                 record=False, prefetch=False)
    except Exception as e:   # noqa: BLE001 - said to the run, whose zygote starts cold
        _say(f"error: {type(e).__name__}: {e}"[:4000])
        return 3
    try:
        with open(spec.log, "wb") as out:
            child = subprocess.Popen(C.chroot_command(spec.container, spec.state),
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        _say(f"ok {child.pid}")
        while child.poll() is None:
            if stop.wait(0.5) or not handle.proc.is_alive():
                # --kill-child: the zygote's namespace goes with its unshare
                child.kill()
                child.wait()
        log.info("zygote container %d ended (%s): unmounting its image", child.pid,
                 child.returncode)
    finally:
        handle.unmount()
        shutil.rmtree(spec.folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
