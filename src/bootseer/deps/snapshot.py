"""Snapshots of environments: publish a built prefix as a tree, restore one into place.

A restore extracts into a temporary sibling of the prefix and renames it into place with
the completion marker written last, so a killed restore leaves nothing half-visible. A
snapshot made at another prefix is relocated on the way (see ``relocate``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Callable

from bootseer import trace as tracing
from bootseer.config import BootseerConfig
from bootseer.deps import compat, place, relocate
from bootseer.deps.resolve import FORMAT
from bootseer.store.digest import sha256_digest

log = logging.getLogger(__name__)
MARKER = ".bootseer-env.json"


def env_ref(key: str) -> str:
    return f"deps/env/{key.removeprefix('sha256:')}"


def portable_ref(portable_key: str) -> str:
    return f"deps/portable/{portable_key.removeprefix('sha256:')}"


def pins_ref(pins_key: str) -> str:
    return f"deps/pins/{pins_key.removeprefix('sha256:')}"


def read_marker(prefix: str) -> dict | None:
    """The completion marker of a restored or built prefix, or of a live lazy mount."""
    try:
        return json.loads((Path(prefix) / MARKER).read_text())
    except (OSError, ValueError):
        from bootseer.deps.mounted import mounted_info
        return mounted_info(prefix)


def write_marker(prefix: str, key: str, tree: str | None, **extra) -> None:
    """The completion marker, written last. Its ``id`` is copied into the node's record
    of the environment, so ``deps gc`` can prove the directory it removes is this one."""
    tmp = Path(prefix) / f"{MARKER}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "key": key, "tree": tree,
                               "id": secrets.token_hex(16), "created": time.time(),
                               **extra}))
    tmp.rename(Path(prefix) / MARKER)


def load_manifest(store, digest: str) -> dict:
    return json.loads(store.read(digest))


def check_driver(manifest: dict) -> None:
    compat.check(manifest.get("cuda"), compat.driver_version(),
                 f"the environment {manifest.get('key', '')[:19]}")


def restore(store, manifest: dict, prefix: str, config: BootseerConfig, key: str,
            progress: Callable[[int, int], None] | None = None) -> None:
    """Fetch and extract the snapshot into a temporary sibling, relocate it if it was
    made at another prefix, then rename it into place. ``progress(bytes, total)`` is
    called as chunks arrive."""
    from bootseer.store.client import StoreClient
    from bootseer.tree.extract import extract
    from bootseer.tree.reader import TreeReader
    made_at = manifest["prefix"]
    relocate.check(manifest.get("relocations"), made_at, prefix)   # before fetching
    sweep_leftovers(prefix)
    with place.Sibling(prefix, "restoring") as tmp:
        # Fetching and extracting overlap (files are written as their chunks arrive): two
        # phases, deps.fetch up to the last chunk's arrival, deps.extract until written.
        t0 = time.time()
        timing: dict = {}
        client = StoreClient.of(config)
        with tracing.phase("deps.extract") as span, client.lane() as f:
            reader = TreeReader(store, manifest["tree"], f, client.cache)
            total = sum(c[4] for c in reader.all_chunks())
            from bootseer.peers.whole_tree import fetch_tree   # the job's peers first
            span.set(**(fetch_tree(config, store, reader) or {}))
            n = extract(reader, tmp.path, readonly=True, timing=timing,
                        progress=(lambda b: progress(b, total)) if progress else None)
            span.set(bytes=n)
            counters = f.counters()
        tracing.emit("deps.fetch", t0, timing.get("fetched_at", t0),
                     chunks=timing.get("chunks", 0), bytes=counters["bytes"],
                     requests=counters["requests"])
        extra = {}
        if made_at != prefix:
            with tracing.phase("deps.relocate") as span:
                span.set(paths=relocate.rewrite(tmp.path, manifest["relocations"], made_at,
                                                prefix))
            extra["relocated"] = {"from": made_at, **manifest["relocations"]}
        os.chmod(tmp.path, 0o755)
        write_marker(tmp.path, key, manifest["tree"], **extra)
        place.put(tmp.path, prefix, key)


def sweep_leftovers(prefix: str) -> None:
    """Remove what a killed build, restore or removal at ``prefix`` left beside it (the
    prefix itself is only ever renamed into place whole, so it is never partial)."""
    place.sweep_leftovers(prefix)


rmtree = place.rmtree


def publish(store, prefix: str, key: str, portable_key: str | None = None, *,
            pins_key: str | None = None, python: str | None = None,
            root: str | None = None, config=None) -> str:
    """Snapshot the environment built for ``prefix`` (its files at ``root``, by default
    the prefix itself) and publish it under ``key`` (and ``portable_key``, so that the same
    pins wanted at another prefix are relocated, not rebuilt; and ``pins_key``, so that a
    node with another interpreter can say why it builds). With ``config``, also the
    snapshot's torrent for restores through peers (docs/peers.md)."""
    from bootseer.tree.build import TreeBuilder, add_directory
    root = root or prefix
    with tracing.phase("deps.publish"):
        b = TreeBuilder(store)
        add_directory(b, root)
        tree = b.finish(meta={"kind": "bootseer.env", "key": key, "prefix": prefix})
        manifest = {"format": FORMAT, "key": key, "tree": tree, "prefix": prefix,
                    "created": time.time(), "relocations": relocate.scan(root, prefix),
                    "cuda": compat.installed_cuda_runtime(root), "python": python}
        d = publish_manifest(store, manifest, key, portable_key)
        if pins_key is not None:
            store.set_ref(pins_ref(pins_key), d)
        if config is not None:
            from bootseer.peers.publish import publish_for_tree_dir
            publish_for_tree_dir(config, store, tree, root)
        return tree


def publish_manifest(store, manifest: dict, key: str, portable_key: str | None = None) -> str:
    blob = json.dumps({**manifest, "key": key}).encode()
    d = sha256_digest(blob)
    store.write(d, blob)
    store.set_ref(env_ref(key), d)
    if portable_key is not None:
        store.set_ref(portable_ref(portable_key), d)
    return d
