"""A tree's sets through the job's peers (docs/peers.md): their torrents, made where the
set is published, and an environment snapshot's whole tree brought before ``deps ensure``
extracts it. The hot set of a start travels through the prefetch (``tree.prefetch``).

Torrents are made where the set is published, so that on a later start every node joins at
once (``bootseer.peers.transfer``): nobody waits for a maker's whole origin fetch.

* an image's hot set: when a start's profile is pushed (``tree.profile.publish_recorded``),
  by the recording node, from its node cache (it has just read those chunks);
* an environment snapshot: when it is published (``deps.snapshot.publish``), by its
  builder, from the files it built.

The torrent is the same bytes whoever makes it (``peers.torrent.make_torrent``), lives in
the store as a blob under ``peers/torrents/<set key>``, and is made once per set: a set
whose ref exists is skipped. Making it never fails the publish it follows.

An environment snapshot: every chunk of the tree not yet on this node comes from the job's
peers (the origin for what they do not deliver) into the node cache, verified like a chunk
from the store; the extract then finds them local. The node seeds the set for as long as
the process lives (``bootseer run``: while the job runs). Environments have their own swarm
(``ENV_NAMESPACE``), so it never shares alerts with an image's hot set in one process.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from bootseer.peers import share_for, wanted
from bootseer.store.client import StoreClient
from bootseer.store.digest import sha256_digest, verify
from bootseer.tree.peer_source import set_items
from bootseer.tree.prefetch import Prefetcher
from bootseer.tree.reader import TreeReader
from bootseer.tree.toc import ChunkRef

log = logging.getLogger(__name__)

ENV_NAMESPACE = "env"
FIGURES = ("origin_bytes", "peer_bytes", "peers_role", "peers_seen", "peers_banned")


def env_wanted(config, stored_bytes: int, cache_bytes: int) -> bool:
    """Whether peers apply to an environment's tree (before any swarm is made): the set
    (``stored_bytes``, as it crosses the network) is wanted, and the tree fits the node
    cache (``cache_bytes``, as the cache holds it: the chunks wait there for the extract;
    one evicted would be fetched twice)."""
    if not wanted(config.peers, stored_bytes):
        return False
    budget = config.cache.budget_bytes
    if budget and cache_bytes > budget // 2:
        log.info("peers: the environment (%d bytes) is over half the node cache budget: "
                 "origin only", cache_bytes)
        return False
    return True


def fetch_tree(config, store, reader) -> dict | None:
    """Bring every chunk of ``reader``'s tree to the node cache through the job's peers;
    returns figures for the trace (``origin_bytes``, ``peer_bytes``, ``peers_role``,
    ``peers_seen``, ``peers_banned``), or None when peers do not apply (then nothing was
    fetched)."""
    chunks = reader.all_chunks()
    if not env_wanted(config, sum(c.stored for c in chunks), sum(c.size for c in chunks)):
        return None
    share = share_for(config, store, ENV_NAMESPACE)
    if share is None:
        return None
    # Every chunk, in pack order (a profile naming them all makes the plan eager).
    pre = Prefetcher(reader, {"chunks": [[c.digest] for c in chunks]}, peers=share)
    pre.start().wait()
    return {k: v for k, v in pre.stats.items() if k in FIGURES}


def publish_torrent(store, refs: list[ChunkRef], chunk_file: Callable[[ChunkRef], str | None],
                    chunk_bytes: Callable[[ChunkRef], bytes], scratch: str) -> str | None:
    """Make the torrent of ``refs`` (tree chunk refs) and publish it; returns its digest.
    ``chunk_file(ref)`` names a file holding exactly the chunk's bytes, to link (None when
    there is none), else ``chunk_bytes(ref)`` gives them."""
    # libtorrent only where a torrent is made: a node without it restores and publishes
    from bootseer.peers.torrent import layout, make_torrent, put_member, set_key, torrent_name
    from bootseer.peers.transfer import torrent_ref
    items = set_items(refs)
    key = set_key(items)
    if store.get_ref(torrent_ref(key)) is not None:
        return None
    by_digest = {r.digest: r for r in refs}
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


def publish_for_profile(config, store, profile: dict,
                        packed: frozenset[str] = frozenset()) -> str | None:
    """The torrent of what a start with ``profile`` prefetches as whole chunks (its plan:
    the hot chunks, less ``packed``, those whose hot blocks its hot pack holds; or the
    whole tree when they are most of it, and no pack is taken), from this node's cache
    where it holds them, else read (and verified) through the tree reader. So the set's
    key is the one a start taking the pack asks its peers for."""
    try:
        client = StoreClient.of(config)
        cache = client.cache
        with client.lane() as fetcher:
            reader = TreeReader(store, profile["tree"], fetcher, cache)
            pre = Prefetcher(reader, profile)
            plan = pre.plan if pre.eager else [r for r in pre.plan if r.digest not in packed]
            if not plan or not wanted(config.peers, sum(r.stored for r in plan), publishing=True):
                return None
            return publish_torrent(store, plan, lambda r: _str(cache.path(r.digest)),
                                   reader.chunk, str(Path(config.cache.dir).parent / "peers"))
    except Exception as e:  # noqa: BLE001 - the profile is published; peers only cost time
        log.warning("peers: the hot set's torrent was not published: %s", e)
        return None


def publish_for_tree_dir(config, store, tree: str, root: str) -> str | None:
    """The torrent of a whole tree (an environment snapshot) just built from ``root``:
    each chunk is a slice of a file there, checked against its digest."""
    try:
        with StoreClient.of(config).lane() as fetcher:
            reader = TreeReader(store, tree, fetcher)
            refs = reader.all_chunks()
            if not refs or not wanted(config.peers, sum(r.stored for r in refs), publishing=True):
                return None
            csize = reader.toc.chunk_size
            where: dict[str, tuple[str, int]] = {}
            for e in reader.toc.entries:
                for i, c in enumerate(e.chunks or ()):
                    where.setdefault(c.digest, (e.path, i * csize))

            def from_root(ref) -> bytes:
                path, offset = where[ref.digest]
                with open(os.path.join(root, path.lstrip("/")), "rb") as f:
                    f.seek(offset)
                    data = f.read(ref.size)
                verify(ref.digest, data, source=f"{root}{path}")   # changed since: no torrent
                return data
            return publish_torrent(store, refs, lambda r: None, from_root,
                                   str(Path(config.cache.dir).parent / "peers"))
    except Exception as e:  # noqa: BLE001 - the snapshot is published; peers only cost time
        log.warning("peers: the environment's torrent was not published: %s", e)
        return None


def _str(p) -> str | None:
    return None if p is None else str(p)
