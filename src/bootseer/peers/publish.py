"""A set's torrent, made where the set is published, so that on a later start every node
joins at once (``share.SetTransfer``): nobody waits for a maker's whole origin fetch.

* an image's hot set: when a start's profile is pushed (``tree.profile.publish_recorded``),
  by the recording node, from its node cache (it has just read those chunks);
* an environment snapshot: when it is published (``deps.snapshot.publish``), by its
  builder, from the files it built.

The torrent is the same bytes whoever makes it (``torrent.make_torrent``), lives in the
store as a blob under ``peers/torrents/<set key>``, and is made once per set: a set whose
ref exists is skipped. Making it never fails the publish it follows.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


def worth_it(config, stored_bytes: int) -> bool:
    """Whether a set's torrent is worth making under the settings: peers not ``off``, and
    under ``auto`` a set of at least ``min_set_bytes`` (the node count of later starts is
    not known here, so it is not asked)."""
    p = config.peers
    return p.mode == "on" or (p.mode == "auto" and stored_bytes >= p.min_set_bytes)


def publish_torrent(store, refs: list[list], chunk_file: Callable[[list], str | None],
                    chunk_bytes: Callable[[list], bytes], scratch: str) -> str | None:
    """Make the torrent of ``refs`` (tree chunk refs) and publish it; returns its digest.
    ``chunk_file(ref)`` names a file holding exactly the chunk's bytes, to link (None when
    there is none), else ``chunk_bytes(ref)`` gives them."""
    from bootseer.peers.share import torrent_ref
    from bootseer.peers.torrent import layout, make_torrent, put_member, set_items, set_key
    from bootseer.peers.torrent import torrent_name
    from bootseer.store.digest import sha256_digest
    items = set_items(refs)
    key = set_key(items)
    if store.get_ref(torrent_ref(key)) is not None:
        return None
    by_digest = {r[0]: r for r in refs}
    Path(scratch).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="torrent-", dir=scratch))
    try:
        files = work / torrent_name(key)
        files.mkdir()
        for tfile in layout(items):
            for m in tfile.members:
                ref = by_digest[m.digest]
                src = None if tfile.bundle else chunk_file(ref)
                try:
                    if src is None:
                        raise OSError("no file")
                    os.link(src, files / tfile.name)
                except OSError:
                    put_member(files, tfile, m, chunk_bytes(ref))
        data = make_torrent(str(work), items)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    digest = sha256_digest(data)
    store.write(digest, data)
    store.set_ref(torrent_ref(key), digest)
    log.info("peers: published the torrent of set %s (%d chunks)", key[:12], len(items))
    return digest


def publish_for_profile(config, store, profile: dict) -> str | None:
    """The torrent of what a start with ``profile`` prefetches (its plan: the hot chunks,
    or the whole tree when they are most of it), from this node's cache where it holds
    them, else read (and verified) through the tree reader."""
    try:
        from bootseer.store.client import StoreClient
        from bootseer.tree.prefetch import Prefetcher
        from bootseer.tree.reader import TreeReader
        client = StoreClient.of(config)
        cache = client.cache
        with client.lane() as fetcher:
            reader = TreeReader(store, profile["tree"], fetcher, cache)
            plan = Prefetcher(reader, profile).plan
            if not plan or not worth_it(config, sum(r[3] for r in plan)):
                return None
            return publish_torrent(store, plan, lambda r: _str(cache.path(r[0])),
                                   reader.chunk, str(Path(config.cache.dir).parent / "peers"))
    except Exception as e:  # noqa: BLE001 - the profile is published; peers only cost time
        log.warning("peers: the hot set's torrent was not published: %s", e)
        return None


def publish_for_tree_dir(config, store, tree: str, root: str) -> str | None:
    """The torrent of a whole tree (an environment snapshot) just built from ``root``:
    each chunk is a slice of a file there, checked against its digest."""
    try:
        from bootseer.store.digest import verify
        from bootseer.store.client import StoreClient
        from bootseer.tree.reader import TreeReader
        with StoreClient.of(config).lane() as fetcher:
            reader = TreeReader(store, tree, fetcher)
            refs = reader.all_chunks()
            if not refs or not worth_it(config, sum(r[3] for r in refs)):
                return None
            csize = reader.toc["chunk_size"]
            where = {}
            for e in reader.toc["entries"]:
                for i, c in enumerate(e.get("chunks") or ()):
                    where.setdefault(c[0], (e["path"], i * csize))

            def from_root(ref) -> bytes:
                path, offset = where[ref[0]]
                with open(os.path.join(root, path.lstrip("/")), "rb") as f:
                    f.seek(offset)
                    data = f.read(ref[4])
                verify(ref[0], data, source=f"{root}{path}")   # changed since: no torrent
                return data
            return publish_torrent(store, refs, lambda r: None, from_root,
                                   str(Path(config.cache.dir).parent / "peers"))
    except Exception as e:  # noqa: BLE001 - the snapshot is published; peers only cost time
        log.warning("peers: the environment's torrent was not published: %s", e)
        return None


def _str(p) -> str | None:
    return None if p is None else str(p)
