"""Lifetime-based packing of intermediate blobs into one arena (both engines plan theirs here).

Each *storage* (a blob, or a group of blobs that alias the same bytes) has a size in bytes
and a half-open lifetime ``[start, end)`` in kernel steps: it is written at step ``start``
and last read at step ``end``. Both executors read every input of a step before they write
any output, so a blob last read at step ``i`` and one first written at step ``i`` may share
bytes: that is what makes elementwise layers effectively in place.

Offsets are assigned greedily, largest storage first (the "greedy by size" scheme; compare
the offset lifetime manager in seeds/compute-library-architecture.md, which packs one slot
per blob without time-based reuse): each storage goes into the lowest-waste gap among the
storages already placed whose lifetimes overlap its own. Two storages whose lifetimes
overlap never share a byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALIGNMENT = 64


@dataclass(frozen=True)
class Interval:
    """One storage to place: ``size`` bytes, live over steps ``[start, end)``."""

    size: int
    start: int
    end: int

    def overlaps(self, other: Interval) -> bool:
        return self.start < other.end and other.start < self.end


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def plan_offsets(items: Sequence[Interval], alignment: int = ALIGNMENT) -> tuple[list[int], int]:
    """Assign a byte offset to every interval; returns (offsets, arena size in bytes)."""
    offsets = [0] * len(items)
    placed: list[int] = []
    order = sorted(range(len(items)), key=lambda i: (-items[i].size, items[i].start, i))
    total = 0
    for i in order:
        item = items[i]
        size = align_up(item.size, alignment)
        busy = sorted(
            (offsets[j], offsets[j] + align_up(items[j].size, alignment))
            for j in placed
            if items[j].overlaps(item)
        )
        best: int | None = None
        best_waste = 0
        cursor = 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best is None or gap - size < best_waste):
                best, best_waste = cursor, gap - size
            cursor = max(cursor, hi)
        offsets[i] = cursor if best is None else best
        placed.append(i)
        total = max(total, offsets[i] + size)
    return offsets, total
