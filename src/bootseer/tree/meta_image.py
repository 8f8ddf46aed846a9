"""A tree's EROFS metadata images, made once when the tree is built and stored beside it.

Writing a metadata image costs some tens of microseconds per file (about a second for a
30k-file image) and depends only on the tree: its entries and its blob layout, which
depends on the TOC alone (``bootseer.tree.blob``). So the builder writes it (``stored``),
puts it in the store as a content-addressed blob and names it in the TOC's ``erofs``
field, part of what the tree's digest covers: the image is as trusted as the tree, never
through a ref. A start fetches it by that digest, verified (``image``); the node's image
cache keeps it with its sum (``bootseer.mount.erofs.images``). A tree without one (built
before they were), one of another image format or layout, one missing from the store or
failing its digest: the node writes its own, as before, and says so once.

Variants: ``tree`` is the tree as a lazy mount serves it; ``env`` the tree as an
environment is restored (``without_privileges``).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from bootseer.config import BootseerConfig
from bootseer.errors import BootseerError
from bootseer.mount.erofs.images import META_FORMAT
from bootseer.mount.erofs.writer import write_image
from bootseer.store.client import StoreClient
from bootseer.store.digest import sha256_digest
from bootseer.store.fetch import fetch_blob
from bootseer.tree.blob import BlobLayout, erofs_root, unsupported
from bootseer.tree.extract import SETID
from bootseer.tree.toc import Toc

log = logging.getLogger(__name__)
VARIANTS = ("tree", "env")
FORMAT = META_FORMAT.decode()


def without_privileges(toc: Toc) -> Toc:
    """The TOC as an environment is restored: no set-id bits, only ``user.*`` xattrs, no
    device nodes or fifos (as an extraction writes it; the mounts are nosuid, nodev)."""
    entries = tuple(replace(e, mode=e.mode & ~SETID,
                            xattrs={k: v for k, v in (e.xattrs or {}).items()
                                    if k.startswith("user.")})
                    for e in toc.entries if e.type not in ("c", "b", "p"))
    return replace(toc, entries=entries)


def image_of(tree: str, toc: Toc, layout: BlobLayout) -> bytes:
    """The EROFS metadata image of ``toc`` with its data in ``layout``'s blob."""
    root, skipped = erofs_root(toc, layout)
    image, stats = write_image(root, chunk_size=layout.chunk_size, blob_blocks=layout.blocks,
                               tag=layout.key.encode())
    if stats.skipped_xattrs or skipped["hardlinks_to_missing"]:
        log.warning("tree %s: %d xattrs outside EROFS's namespaces and %d dangling hard "
                    "links are not in the image", tree[:19], stats.skipped_xattrs,
                    skipped["hardlinks_to_missing"])
    return image


def _as(toc: Toc, variant: str) -> Toc:
    return without_privileges(toc) if variant == "env" else toc


def stored(store, toc: Toc, variants: tuple[str, ...]) -> dict | None:
    """Write the metadata image of each of ``variants`` of ``toc`` to ``store``; the
    TOC's ``erofs`` field naming them (None: this tree cannot be an EROFS image)."""
    if unsupported(toc) is not None:
        return None
    layout = BlobLayout(toc)
    images = {}
    for variant in variants:
        image = image_of("a new tree", _as(toc, variant), layout)
        images[variant] = sha256_digest(image)
        store.write(images[variant], image)
    return {"format": FORMAT, "layout": layout.key, "images": images}


def image(config: BootseerConfig, tree: str, toc: Toc, layout: BlobLayout,
          variant: str) -> bytes:
    """The metadata image of ``variant`` of ``tree`` in ``layout``: the stored one,
    verified against the digest its TOC names, else written here."""
    got = fetch(config, tree, toc, layout, variant)
    return got if got is not None else image_of(tree, _as(toc, variant), layout)


def fetch(config: BootseerConfig, tree: str, toc: Toc, layout: BlobLayout,
          variant: str) -> bytes | None:
    """The stored image, verified; None (said once) when there is none to use."""
    field, short = toc.erofs, tree[:19]
    if not config.mount.stored_metadata:
        log.info("tree %s: mount.stored_metadata is off: writing its %s metadata image here",
                 short, variant)
        return None
    digest = (field or {}).get("images", {}).get(variant)
    if field is None or digest is None:
        log.info("tree %s names no stored %s metadata image (built before they were "
                 "stored): writing it here", short, variant)
        return None
    if field["format"] != FORMAT or field["layout"] != layout.key:
        log.warning("tree %s's stored metadata image is of format %s and layout %s, this "
                    "mount's are %s and %s: writing it here", short, field["format"],
                    field["layout"][:12], FORMAT, layout.key[:12])
        return None
    client = StoreClient.of(config)
    try:
        with client.lane() as f:
            data = fetch_blob(f, client.store(), digest)   # checked against the digest
    except (BootseerError, OSError) as e:   # missing, corrupt, or the store unreachable
        log.warning("tree %s's stored metadata image cannot be used (%s): writing it here",
                    short, e)
        return None
    log.info("tree %s: its stored metadata image %s (%d bytes), verified", short,
             digest[:19], len(data))
    return data
