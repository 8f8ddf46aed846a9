"""The lazy environment's server: ``python -m bootseer.deps.mountd PREFIX TREE KEY STATE
WINDOW_S`` with the pickled config on stdin. Prints ``ready`` once the mount is visible
(or ``error: ...``), then serves until SIGTERM/SIGINT; when the recording window closes
it publishes the tree's hot-block profile, so the next node's mount prefetches."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import sys
import time

from bootseer.deps.prefix import sidecar
from bootseer.tree.profile import publish_recorded
from bootseer.tree.session import mount_tree

log = logging.getLogger("bootseer.deps.mountd")


def main(argv: list[str]) -> int:
    prefix, tree, key, state, window_s = argv
    config = pickle.load(sys.stdin.buffer)
    stop: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda n, f: stop.append(n))
    rec = os.path.join(state, "rec")
    try:
        handle, profile, _ = mount_tree(config, tree, prefix, rec, record=True, prefetch=True,
                                     window_timeout_s=float(window_s), name="bootseer-env")
    except Exception as e:  # noqa: BLE001 - reported to the ensure that started us
        print(f"error: {type(e).__name__}: {e}", flush=True)
        return 1
    tmp = sidecar(prefix) + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"key": key, "tree": tree, "pid": os.getpid(), "started": time.time(),
                   "prefetch_chunks": len(profile["chunks"]) if profile else 0}, f)
    os.rename(tmp, sidecar(prefix))
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)   # the ensure has stopped reading: never die of SIGPIPE
    published = None

    def publish() -> None:
        nonlocal published
        published = ""
        try:
            published = publish_recorded(config, os.path.join(rec, "profile.json"))
            log.info("published the environment's hot-block profile %s", published)
        except Exception as e:  # noqa: BLE001 - a profile is an optimisation
            log.warning("cannot publish the hot-block profile: %s", e)
    try:
        while not stop and handle.proc.is_alive():
            if published is None and os.path.exists(os.path.join(rec, "figures.json")):
                publish()
            time.sleep(0.2)
    finally:
        handle.unmount()    # closes the window if it was still open
        try:
            os.unlink(sidecar(prefix))
        except FileNotFoundError:
            pass
    if published is None and os.path.exists(os.path.join(rec, "figures.json")):
        publish()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(main(sys.argv[1:]))
