"""bench/image's containerd rows (issue #15): the same image and link, started as the
kubelet starts a pod (containerd's CRI: PullImage, RunPodSandbox, CreateContainer,
StartContainer), on a fresh node each (its own containerd root, snapshotter root and node
cache), time from the pull to the job's READY line:

  (5) containerd + overlayfs      containerd's own snapshotter: every layer downloaded
  (6) containerd + bootseer       the bootseer snapshotter, no layer downloaded, the hot
                                  blocks recorded by a first pod (on its own fresh node,
                                  not timed as a row) prefetched
Goals: (6) <= 0.25 x (5) and <= 1.2 x bootseer image run's (3).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from bootseer.testing.containerd import Node, push_pause
from tests.support.cri.pods import CriClient

READY_FILE = "/tmp/bootseer-ready"


def _pod_start(node: Node, ref: str, argv: list[str], logs: Path) -> float:
    """Seconds from PullImage to the container's exit after printing READY."""
    cri = CriClient(node.containerd.sock)
    try:
        t0 = time.monotonic()
        cri.pull(ref)
        code, out = cri.run(ref, argv, str(logs), env={"BOOTSEER_READY_FILE": READY_FILE},
                            timeout=600)
        elapsed = time.monotonic() - t0
    finally:
        cri.close()
    if code != 0 or "READY" not in out:
        raise SystemExit(f"pod on {node.base.name} failed (exit {code}): {out[-20:]}\n"
                         f"{node.snapshotter.log.read_text()[-3000:]}")
    return elapsed


def run(*, scratch: Path, netns: str | None, ref: str, registry_host: str, store: str,
        argv: list[str], say) -> dict[str, dict]:
    """The two rows (and the recording pod), each on a fresh node."""
    pause = push_pause(netns, registry_host, scratch)
    base = Path(f"/tmp/bsbc-{scratch.name[-6:]}")   # unix socket paths must stay short
    shutil.rmtree(base, ignore_errors=True)
    rows: dict[str, dict] = {}
    plans = [("(5) containerd + overlayfs", "overlayfs", []),
             ("containerd + bootseer, recording", "bootseer", ["--store", store]),
             ("(6) containerd + bootseer", "bootseer", ["--store", store])]
    try:
        for i, (name, snapshotter, args) in enumerate(plans):
            node = Node(base / f"n{i}", netns=netns, cri=(pause, registry_host, snapshotter),
                        snapshotter_args=[*args, "--ready-file", READY_FILE, "--window", "300"],
                        env={"BOOTSEER_CACHE_DIR": str(scratch / f"ctd-cache-{i}"),
                             "BOOTSEER_STORE_URL": store})
            try:
                s = _pod_start(node, ref, argv, scratch / f"ctd-logs-{i}")
                if "recording" in name:   # the profile is published once the window closes
                    _wait_published(node)
                log = node.snapshotter.log.read_text()
                rows[name] = {"ready_s": round(s, 3),
                              "prefetch": "prefetching" in log}
                say(f"  {name:34} ready {s:6.2f} s"
                    + ("  (hot blocks prefetched)" if rows[name]["prefetch"] else ""))
            finally:
                node.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def _wait_published(node: Node, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while "profile sha256:" not in node.snapshotter.log.read_text():
        if time.monotonic() > deadline:
            raise SystemExit("the recording pod's profile was never published:\n"
                             + node.snapshotter.log.read_text()[-3000:])
        time.sleep(0.5)
