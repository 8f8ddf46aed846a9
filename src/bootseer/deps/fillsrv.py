"""The lazy restore's blob server: ``python -m bootseer.deps.fillsrv STATE TARGET`` with
the pickled ``(config, Fill)`` on stdin. Serves the filling blob at ``STATE/blobfs/blob``
(``fill``) and prints ``ready`` (or ``error: ...``); the restore then mounts EROFS on it
at TARGET. Serves until that mount is gone (``deps umount``, ``gc``) or SIGTERM/SIGINT,
then unmounts the blob; the fill goes on meanwhile and completes the node's blob."""

from __future__ import annotations

import functools
import logging
import os
import pickle
import signal
import sys
import time

from bootseer.deps.fill import filling_view
from bootseer.mount import fuse
from bootseer.node import mounts

log = logging.getLogger("bootseer.deps.fillsrv")
MOUNT_WAIT_S = 120.0   # the restore mounts EROFS on the blob within this


def main(argv: list[str]) -> int:
    state, target = argv
    config, fill = pickle.load(sys.stdin.buffer)
    stop: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda n, f: stop.append(n))
    blobfs = os.path.join(state, "blobfs")
    os.makedirs(blobfs, exist_ok=True)
    try:
        handle = fuse.mount(functools.partial(filling_view, config, fill), blobfs,
                            name=f"bootseer-envfill-{fill.tree[7:19]}", read_ahead_kb=0)
    except Exception as e:  # noqa: BLE001 - reported to the ensure that started us
        print(f"error: {type(e).__name__}: {e}", flush=True)
        return 1
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)   # the ensure has stopped reading: never die of SIGPIPE
    try:
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not stop and not mounts.is_mount_point(target) and time.monotonic() < deadline:
            time.sleep(0.05)
        while not stop and handle.proc.is_alive() and mounts.is_mount_point(target):
            time.sleep(0.2)
    finally:
        handle.unmount()
        try:
            os.rmdir(blobfs)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(main(sys.argv[1:]))
