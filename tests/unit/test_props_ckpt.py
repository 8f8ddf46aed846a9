"""Property tests of the checkpoint's range and stripe arithmetic: a plan merged or split
among ranks still names every byte it named, once; stripes tile a file; a demanded
stripe's parts are never smaller than the floor nor more than the part count."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from bootseer.ckpt.engine import DEMAND_PART_MIN_BYTES, DEMAND_PARTS, demand_part_bytes
from bootseer.ckpt.plan import Range, file_plan, merge, split
from bootseer.ckpt.staging import StagedFile, StagingArea


def covered(plan: list[Range]) -> list[tuple[str, int]]:
    """Every (path, byte) a plan names, in plan order (a byte named twice appears twice)."""
    return [(r.path, b) for r in plan for b in range(r.start, r.end)]


@st.composite
def sorted_plans(draw) -> list[Range]:
    """Disjoint ranges per file, in file order, as a metadata plan lists them."""
    plan = []
    for path in draw(st.lists(st.sampled_from("abcd"), unique=True, max_size=4)):
        pos = 0
        for _ in range(draw(st.integers(0, 6))):
            start = pos + draw(st.integers(0, 20))
            end = start + draw(st.integers(1, 30))
            plan.append(Range(path, start, end))
            pos = end
    return plan


@given(sorted_plans(), st.integers(0, 25))
def test_merge_covers_the_plan_and_only_fills_small_gaps(plan, gap):
    merged = merge(plan, gap)
    before, after = set(covered(plan)), covered(merged)
    assert len(after) == len(set(after))                  # no byte twice
    assert before <= set(after)
    # what merging added lies in gaps of at most ``gap`` bytes between ranges of one file
    for path, b in set(after) - before:
        left = max(r.end for r in plan if r.path == path and r.end <= b)
        right = min(r.start for r in plan if r.path == path and r.start > b)
        assert right - left <= gap
    # nothing left to merge
    for x, y in zip(merged, merged[1:], strict=False):
        assert x.path != y.path or y.start - x.end > gap
    assert merge(merged, gap) == merged


@given(sorted_plans(), st.integers(1, 9))
def test_split_deals_every_byte_to_exactly_one_rank_in_order(plan, world):
    shares = [split(plan, rank, world) for rank in range(world)]
    assert [b for s in shares for b in covered(s)] == covered(plan)
    total = sum(r.length for r in plan)
    for s in shares:
        assert abs(sum(r.length for r in s) - total / world) < 1
        assert all(r.length > 0 for r in s)


@given(st.dictionaries(st.text("abc/", min_size=1, max_size=5), st.integers(0, 10**9),
                       max_size=8))
def test_file_plan_names_each_file_whole_smallest_first(files):
    plan = file_plan(files)
    assert {r.path: (r.start, r.end) for r in plan} == {p: (0, n) for p, n in files.items()}
    assert [r.length for r in plan] == sorted(files.values())


@given(st.integers(1, 1 << 34))
def test_demand_parts_have_a_floor_and_a_count(stripe):
    part = demand_part_bytes(stripe)
    assert part >= DEMAND_PART_MIN_BYTES
    assert -(-stripe // part) <= DEMAND_PARTS              # at most DEMAND_PARTS parts
    if stripe >= DEMAND_PARTS * DEMAND_PART_MIN_BYTES:
        assert part * (DEMAND_PARTS - 1) < stripe            # and not fewer than needed


@settings(max_examples=60)
@given(size=st.integers(0, 5000), stripe=st.integers(1, 700), data=st.data())
def test_stripes_tile_the_file_and_has_range_means_every_stripe_staged(size, stripe, data):
    with tempfile.TemporaryDirectory() as d:
        f = StagedFile(StagingArea(d), f"k|{size}|{stripe}", size, stripe)
        spans = [f.span(i) for i in range(f.nstripes)]
        assert [b for a, e in spans for b in range(a, e)] == list(range(size))
        assert all(a % stripe == 0 and 0 < e - a <= stripe for a, e in spans)
        payload = bytes(i % 251 for i in range(size))
        written = data.draw(st.sets(st.integers(0, max(f.nstripes - 1, 0)))
                            if f.nstripes else st.just(set()))
        for i in written:
            a, e = f.span(i)
            f.write(i, payload[a:e])
        if size:
            start = data.draw(st.integers(0, size - 1))
            end = data.draw(st.integers(start + 1, size))
            touched = {i for i, (a, e) in enumerate(spans) if a < end and start < e}
            assert f.has_range(start, end) == (touched <= written)
            if touched <= written:
                assert f.pread(start, end - start) == payload[start:end]
        assert f.complete == (len(written) == f.nstripes)
