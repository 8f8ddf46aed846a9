"""Property tests of how the origin's segments are dealt among a job's nodes (rendezvous
hashing): nodes that see the same view fetch every segment from the origin exactly once
between them; a node dropping out of the view moves only its own segments; a node alone
takes all of them, each once."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from bootseer.peers.share import SetTransfer, _hash

ips = st.ip_addresses(v=4).map(str)


def transfer(ip: str, segments: list[str]) -> SimpleNamespace:
    """The part of a SetTransfer that dealing reads: this node's address, the segments'
    first names and their hashes."""
    return SimpleNamespace(share=SimpleNamespace(swarm=SimpleNamespace(ip=ip)),
                           segments=[[s] for s in segments],
                           _segment_hashes=[_hash(s) for s in segments])


def mine(ip: str, segments: list[str], view: list[str]) -> list[int]:
    return SetTransfer._mine(transfer(ip, segments), view)


segment_names = st.lists(st.text("0123456789abcdef", min_size=8, max_size=8), unique=True,
                         min_size=1, max_size=40)


@given(st.lists(ips, unique=True, min_size=2, max_size=8), segment_names)
def test_a_shared_view_deals_each_segment_to_exactly_one_node(view, segments):
    view = sorted(view)
    dealt = [i for ip in view for i in mine(ip, segments, view)]
    assert sorted(dealt) == list(range(len(segments)))
    for ip in view:
        m = mine(ip, segments, view)
        assert m == sorted(m)                     # in set order: origin reads coalesce


@given(st.lists(ips, unique=True, min_size=3, max_size=8), segment_names, st.data())
def test_a_node_leaving_moves_only_its_own_segments(view, segments, data):
    view = sorted(view)
    gone = data.draw(st.sampled_from(view))
    rest = [ip for ip in view if ip != gone]
    for ip in rest:
        before, after = set(mine(ip, segments, view)), set(mine(ip, segments, rest))
        assert before <= after
        assert after - before <= set(mine(gone, segments, view))


@given(ips, segment_names)
def test_a_node_alone_takes_every_segment_once(ip, segments):
    m = mine(ip, segments, [ip])
    assert sorted(m) == list(range(len(segments)))
    # from a point of its own, then in order round the set
    assert all((b - a) % len(segments) == 1 for a, b in zip(m, m[1:], strict=False))
