"""Snapshots of environments: a built prefix published as a tree with its manifest (the
refs that find it by key, by portable key, by pins), and the completion marker a built or
restored environment gets last. Restoring one is ``restore``'s."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

from bootseer import trace as tracing
from bootseer.deps import compat, relocate
from bootseer.deps.prefix import MARKER
from bootseer.deps.resolve import FORMAT, DepsError
from bootseer.store.digest import sha256_digest


def env_ref(key: str) -> str:
    return f"deps/env/{key.removeprefix('sha256:')}"


def portable_ref(portable_key: str) -> str:
    return f"deps/portable/{portable_key.removeprefix('sha256:')}"


def pins_ref(pins_key: str) -> str:
    return f"deps/pins/{pins_key.removeprefix('sha256:')}"


def write_marker(prefix: str, key: str, tree: str | None, **extra) -> None:
    """The completion marker, written last. Its ``id`` is copied into the node's record
    of the environment, so ``deps gc`` can prove the directory it removes is this one."""
    tmp = Path(prefix) / f"{MARKER}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "key": key, "tree": tree,
                               "id": secrets.token_hex(16), "created": time.time(),
                               **extra}))
    tmp.rename(Path(prefix) / MARKER)


def load_manifest(store, digest: str, key: str | None = None) -> dict:
    """The manifest ``digest`` (the store verified its bytes). With ``key`` (read through
    that key's ref), its own key must be ``key``: a ref set to another environment's
    manifest, by mistake or by a hostile writer, is refused, never restored as this one."""
    manifest = json.loads(store.read(digest))
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tree"), str):
        raise DepsError(f"{digest} is not an environment manifest")
    if key is not None and manifest.get("key") != key:
        raise DepsError(f"the store's ref {env_ref(key)} names the manifest of environment "
                        f"{str(manifest.get('key'))[:19]}, not {key[:19]}: refusing it (was the "
                        f"ref edited?)")
    return manifest


def check_driver(manifest: dict) -> None:
    compat.check(manifest.get("cuda"), compat.driver_version(),
                 f"the environment {manifest.get('key', '')[:19]}")


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
        tree = b.finish(meta={"kind": "bootseer.env", "key": key, "prefix": prefix},
                        erofs=("env",))   # the image a restore mounts, made once here
        manifest = {"format": FORMAT, "key": key, "tree": tree, "prefix": prefix,
                    "created": time.time(), "relocations": relocate.scan(root, prefix),
                    "cuda": compat.installed_cuda_runtime(root), "python": python}
        d = publish_manifest(store, manifest, key, portable_key)
        if pins_key is not None:
            store.set_ref(pins_ref(pins_key), d)
        if config is not None:
            from bootseer.tree.peers import publish_for_tree_dir
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
