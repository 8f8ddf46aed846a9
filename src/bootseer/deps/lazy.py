"""The lazy restore: an environment mounted as soon as its metadata is local, while its
blob is filled (``fill``, served by ``fillsrv``), ending with the node's verified blob and
record as a whole-blob restore leaves them (``blobs``), so the next restore on the node is
the local kernel mount.

The metadata image is written while the blob's server starts (each takes about a second
on a large tree); EROFS is then mounted on the FUSE-served blob with O_DIRECT, under the
same overlay as a local one. The server outlives the command and stops with the mount
(``mounts``): the sidecar names it, and a mount whose server died is not warm.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from bootseer.config import BootseerConfig
from bootseer.deps.fill import Fill, blob_file
from bootseer.deps.mounts import mount_kernel, start_server
from bootseer.deps.prefix import write_json
from bootseer.errors import StoreError
from bootseer.tree import profile as prof
from bootseer.tree.blob import BlobLayout

log = logging.getLogger(__name__)
RECORD = "fill-record.json"
"""In the mount's state directory: the node record the fill writes once complete."""


def hot_chunks(store, tree: str) -> tuple[str, ...]:
    """The tree's recorded profile's chunks, in recorded order (none: no profile)."""
    try:
        p = prof.latest(store, tree)
        if p is None:
            return ()
        prof.check(p, tree)
    except (StoreError, ValueError) as e:
        log.info("no usable profile for %s (%s): filling in blob order", tree[:19], e)
        return ()
    return tuple(row[0] for row in p.get("chunks", ()))


def restore(config: BootseerConfig, store, manifest: dict, prefix: str, key: str,
            layout: BlobLayout, write_meta, made: dict, blob: str, state: Path, *,
            writable: bool, relocated: dict | None) -> None:
    """Mount ``key``'s environment at ``prefix`` on its blob as it is filled into
    ``blob``. ``write_meta`` writes the metadata image into ``made["meta"]`` (or
    ``made["error"]``)."""
    from bootseer.deps.place import clear
    tree = manifest["tree"]
    writer = threading.Thread(target=write_meta, name="bootseer-erofs-meta")
    writer.start()
    try:
        fill = Fill(tree=tree, key=key, layout=layout.key, blob=blob,
                    record=str(state / RECORD), hot=hot_chunks(store, tree))
        target = str(state / "lower") if writable else prefix
        pid = start_server("bootseer.deps.fillsrv", [str(state), target], (config, fill),
                           str(state), f"cannot serve the environment's blob for {prefix}")
    finally:
        writer.join()
    try:
        if "error" in made:
            raise made["error"]
        clear(prefix)   # what was there stays until the new environment is mountable
        mount_kernel(prefix, key, tree, made["meta"], blob_file(str(state / "blobfs")),
                     writable=writable, relocated=relocated, server=pid)
        # after clear(): unmounting a previous lazy mount at the prefix (a killed fill's)
        # removes its fill-record.json, the same path (the new fill waits for this one)
        write_json(state / RECORD, {"tree": tree, "meta": made["meta"],
                                    "cuda": manifest.get("cuda"), "relocated": relocated})
    except BaseException:
        _stop(pid)
        raise
    log.info("%s: mounted at %s on its blob as it is filled (%d profile chunks first)",
             key[:19], prefix, len(fill.hot))


def _stop(pid: int) -> None:
    import signal
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
