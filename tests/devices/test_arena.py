"""Arena planner: blobs with overlapping lifetimes never share bytes (property tests)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vkserve.devices.arena import ALIGNMENT, Interval, align_up, plan_offsets

intervals = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(1, 10)).map(
        lambda t: Interval(t[0], t[1], t[1] + t[2])
    ),
    min_size=0,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(intervals)
def test_no_overlap_in_time_and_space(items: list[Interval]) -> None:
    offsets, total = plan_offsets(items)
    for i, a in enumerate(items):
        assert offsets[i] % ALIGNMENT == 0
        assert offsets[i] + a.size <= total
        for j in range(i + 1, len(items)):
            b = items[j]
            if a.overlaps(b):
                disjoint = offsets[i] + a.size <= offsets[j] or offsets[j] + b.size <= offsets[i]
                assert disjoint, (a, b, offsets[i], offsets[j])


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_bounds(items: list[Interval]) -> None:
    _, total = plan_offsets(items)
    naive = sum(align_up(it.size) for it in items)
    assert total <= naive
    # never below the largest set of blobs alive at one step
    steps = {s for it in items for s in range(it.start, it.end)}
    peak = max((sum(it.size for it in items if it.start <= s < it.end) for s in steps), default=0)
    assert total >= peak


def test_chain_reuses_memory() -> None:
    # a chain a -> b -> c -> d: each blob is read by the next step only
    items = [Interval(1024, i, i + 1) for i in range(4)]
    offsets, total = plan_offsets(items)
    assert total == 1024
    assert len(set(offsets)) == 1


def test_half_open_lifetimes() -> None:
    # read at step 3 and written at step 3: may share (inputs are read before outputs are written)
    assert not Interval(10, 0, 3).overlaps(Interval(10, 3, 5))
    assert Interval(10, 0, 4).overlaps(Interval(10, 3, 5))
