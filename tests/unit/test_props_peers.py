"""Property tests of the peers' packing and dealing: a set's items laid out as torrent
files (large ones alone, runs of small ones in bundles) keep set order, each item once,
back to back in its file; segments cover the files in order without splitting one; the
origin's segments are dealt among nodes sharing a view so that each is fetched by exactly
one of them, a node leaving moves only its own, a node alone takes all."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from bootseer.peers.deal import SEGMENT_BYTES, Deal
from bootseer.peers.source import SetItem
from bootseer.peers.torrent import BUNDLE_BYTES, SMALL_ITEM, file_name, layout, piece_size

ips = st.ip_addresses(v=4).map(str)
sizes = st.one_of(st.integers(1, SMALL_ITEM - 1), st.integers(SMALL_ITEM, 3 * SEGMENT_BYTES))


@st.composite
def item_sets(draw, max_size: int = 60) -> list[SetItem]:
    n = draw(st.integers(1, max_size))
    items = []
    for i in range(n):
        size = draw(sizes)
        items.append(SetItem("sha256:" + hashlib.sha256(b"%d" % i).hexdigest(), size, size))
    return items


@settings(max_examples=50)
@given(item_sets())
def test_layout_keeps_every_item_once_in_order_back_to_back(items):
    files = layout(items)
    assert [m.digest for f in files for m in f.members] == [i.digest for i in items]
    for f in files:
        assert [m.offset for m in f.members] == [0, *(m.offset + m.size for m in f.members[:-1])]
        assert f.size == sum(m.size for m in f.members)
        if f.bundle:
            assert all(m.size < SMALL_ITEM for m in f.members) and f.size <= BUNDLE_BYTES
        else:
            (m,) = f.members
            assert m.size >= SMALL_ITEM and f.name.endswith(file_name(m.digest))
    assert [f.name[:6] for f in files] == [f"{i:06d}" for i in range(len(files))]
    # one bundle is one piece: the piece size is at least the largest bundle
    assert piece_size(files) >= max((f.size for f in files if f.bundle), default=0)


@settings(max_examples=50)
@given(item_sets(), ips)
def test_segments_cover_the_files_in_order_and_never_split_one(items, ip):
    files = layout(items)
    deal = Deal(files, ip)
    assert [n for seg in deal.segments for n in seg] == [file_name(i.digest) for i in items]
    file_of = {file_name(m.digest): k for k, f in enumerate(files) for m in f.members}
    segment_of = {name: s for s, seg in enumerate(deal.segments) for name in seg}
    for f in files:                                 # a file (a bundle) never split
        assert len({segment_of[file_name(m.digest)] for m in f.members}) == 1
    for seg in deal.segments:                       # more than one file: within the bound
        held = sorted({file_of[name] for name in seg})
        assert len(held) == 1 or sum(files[k].size for k in held) <= SEGMENT_BYTES


def segments(n: int) -> list[SetItem]:
    """``n`` items of one segment each (a segment is about SEGMENT_BYTES of files)."""
    return [SetItem("sha256:" + hashlib.sha256(b"s%d" % i).hexdigest(), SEGMENT_BYTES,
                    SEGMENT_BYTES) for i in range(n)]


def mine(ip: str, n: int, view: list[str]) -> list[int]:
    return Deal(layout(segments(n)), ip).mine(view)


@settings(max_examples=50)
@given(st.lists(ips, unique=True, min_size=2, max_size=8), st.integers(1, 40))
def test_a_shared_view_deals_each_segment_to_exactly_one_node(view, n):
    view = sorted(view)
    dealt = [i for ip in view for i in mine(ip, n, view)]
    assert sorted(dealt) == list(range(n))
    for ip in view:
        m = mine(ip, n, view)
        assert m == sorted(m)                     # in set order: origin reads coalesce


@settings(max_examples=50)
@given(st.lists(ips, unique=True, min_size=3, max_size=8), st.integers(1, 40), st.data())
def test_a_node_leaving_moves_only_its_own_segments(view, n, data):
    view = sorted(view)
    gone = data.draw(st.sampled_from(view))
    rest = [ip for ip in view if ip != gone]
    for ip in rest:
        before, after = set(mine(ip, n, view)), set(mine(ip, n, rest))
        assert before <= after
        assert after - before <= set(mine(gone, n, view))


@settings(max_examples=50)
@given(ips, st.integers(1, 40))
def test_a_node_alone_takes_every_segment_once(ip, n):
    m = mine(ip, n, [ip])
    assert sorted(m) == list(range(n))
    # from a point of its own, then in order round the set
    assert all((b - a) % n == 1 for a, b in zip(m, m[1:], strict=False))
