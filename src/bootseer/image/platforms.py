"""The trees of a multi-platform image, one per platform, and which one a node takes.

``image convert`` of an index publishes, next to the image's name
(``images/by-name/NAME``: the tree of the converting node's platform, else of the first one
converted), one ref per platform: ``images/platforms/NAME/OS-ARCH[-VARIANT]`` (store refs
take no ``/`` or ``@`` inside a component, so the platform is spelled with ``-``). A node
resolves a name to the tree of its own platform (``mount.platform``, else this machine's);
a name converted for other platforms only is refused, naming those it has."""

from __future__ import annotations

from bootseer.errors import BlobNotFound
from bootseer.image.registry import platform_of

PLATFORM_REFS = "images/platforms/"


def _key(platform: str) -> str:
    return platform.replace("/", "-")


def _platform(key: str) -> str:
    return key.replace("-", "/")


def ref_for(name: str, platform: str) -> str:
    """The ref of ``platform``'s tree of the image named ``name`` (a ``ref_name`` tail)."""
    return f"{PLATFORM_REFS}{name}/{_key(platform)}"


def publish(store, name: str, trees: dict[str, str], *, replace: bool) -> None:
    """Record ``trees`` (platform -> tree digest) under ``name``; ``replace``: the
    platforms not in ``trees`` go, else they keep the trees an earlier convert recorded."""
    for platform, tree in trees.items():
        store.set_ref(ref_for(name, platform), tree)
    if replace:
        for platform in set(recorded(store, name)) - set(trees):
            store.delete_ref(ref_for(name, platform))


def recorded(store, name: str) -> dict[str, str]:
    """platform -> tree of every platform converted under ``name`` (empty: an image
    converted before platforms were recorded, or one whose config names none)."""
    prefix = f"{PLATFORM_REFS}{name}/"
    found = {}
    for ref in store.list_refs(prefix):
        tree = store.get_ref(ref)
        if tree is not None:
            found[_platform(ref[len(prefix):])] = tree
    return found


def pick(store, name: str, image: str, platform: str) -> str | None:
    """The tree of ``platform`` for the image named ``name`` (as typed: ``image``); None
    where no platform is recorded (the plain name's tree is then the one). A variant-less
    ``platform`` takes any variant of its architecture (``linux/arm64`` takes
    ``linux/arm64/v8``)."""
    tree = store.get_ref(ref_for(name, platform))
    if tree is not None:
        return tree
    trees = recorded(store, name)
    if not trees:
        return None
    near = sorted(p for p in trees if p.startswith(platform + "/"))
    if near:
        return trees[near[0]]
    raise BlobNotFound(
        f"{image!r} has no tree for this node's platform {platform} (converted for: "
        f"{', '.join(sorted(trees))}): run 'bootseer image convert {image} --platform "
        f"{platform} --store {store.url}' (or set BOOTSEER_MOUNT_PLATFORM)", url=store.url)


def missing(where, wanted: str, offered: list[dict]) -> str:
    """The error of a platform asked that ``offered`` (index entries) lacks."""
    have = sorted({platform_of(m.get("platform") or {}) or "" for m in offered} - {""})
    return (f"{where}: the image has no {wanted} variant (it has: {', '.join(have) or '?'}); "
            f"pass --platform with one of those")
