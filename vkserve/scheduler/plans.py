"""The Plans of one model on one device, one set per distinct input shape, LRU-bounded.

A Plan is compiled for fixed input shapes (the engines plan memory and record commands for
them). A model with dynamic inputs (``vkserve.scheduler.shapes``) therefore gets a Plan set per
shape key on first use: the scheduler marks the key BUILDING, compiles it in a worker thread
(other shapes keep running meanwhile) and marks it READY. The set is bounded by count and by
device memory (``plan_cache_shapes``, ``plan_cache_mb`` in the model's config.toml): past the
bound the least recently used idle key is evicted and its Plans closed, which gives their
memory back to the device's pool. Shapes built at load (``prebuilt``) are never evicted, nor is
a key some job is waiting for or running on. A rebuilt shape costs no GLSL compile: the
pipeline cache holds its SPIR-V and pipelines.

This module is pure bookkeeping (no I/O, no trio): the scheduler owns the tasks.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Collection, Iterator

from vkserve.scheduler.engine import Executor
from vkserve.scheduler.shapes import ShapeKey

__all__ = ["BuildState", "ShapePlans", "ShapeSlots"]


class BuildState(enum.StrEnum):
    BUILDING = "building"
    READY = "ready"


@dataclasses.dataclass(eq=False)
class ShapeSlots:
    """One shape key's Plan instances on a device (one executor per device slot)."""

    key: ShapeKey
    state: BuildState = BuildState.BUILDING
    executors: list[Executor] = dataclasses.field(default_factory=list)
    free: list[Executor] = dataclasses.field(default_factory=list)
    nbytes: int = 0  # device memory the Plans hold
    pinned: bool = False  # built at load: never evicted

    @property
    def idle(self) -> bool:
        return self.state is BuildState.READY and len(self.free) == len(self.executors)


class ShapePlans:
    """Shape key -> ShapeSlots, most recently used last."""

    def __init__(self, max_shapes: int, max_bytes: int) -> None:
        self.max_shapes = max_shapes
        self.max_bytes = max_bytes
        self._slots: collections.OrderedDict[ShapeKey, ShapeSlots] = collections.OrderedDict()
        self.evictions = 0

    def __iter__(self) -> Iterator[ShapeSlots]:
        return iter(list(self._slots.values()))

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, key: ShapeKey) -> ShapeSlots | None:
        return self._slots.get(key)

    def use(self, key: ShapeKey) -> ShapeSlots | None:
        """The key's slots, marked most recently used."""
        slots = self._slots.get(key)
        if slots is not None:
            self._slots.move_to_end(key)
        return slots

    def building(self, key: ShapeKey, *, pinned: bool = False) -> ShapeSlots:
        slots = ShapeSlots(key, pinned=pinned)
        self._slots[key] = slots
        return slots

    def ready(self, key: ShapeKey, executors: list[Executor], nbytes: int) -> ShapeSlots:
        slots = self._slots[key]
        slots.state, slots.executors, slots.free, slots.nbytes = (
            BuildState.READY, list(executors), list(executors), nbytes)
        return slots

    def discard(self, key: ShapeKey) -> None:
        """Forget a key whose build failed (the next request for it builds anew)."""
        self._slots.pop(key, None)

    def ready_keys(self) -> list[ShapeKey]:
        return [k for k, s in self._slots.items() if s.state is BuildState.READY]

    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._slots.values())

    def evict(self, wanted: Collection[ShapeKey]) -> list[ShapeSlots]:
        """Remove least recently used idle keys (not pinned, not in ``wanted``) until the set is
        within its bounds or nothing more can go; the caller closes the returned Plans."""
        evicted: list[ShapeSlots] = []
        for key, slots in list(self._slots.items()):
            if len(self._slots) <= self.max_shapes and self.nbytes() <= self.max_bytes:
                break
            if slots.pinned or key in wanted or not slots.idle:
                continue
            del self._slots[key]
            evicted.append(slots)
        self.evictions += len(evicted)
        return evicted

    def take_all(self) -> list[Executor]:
        """Every executor (to close them all); the set is empty afterwards."""
        executors = [e for s in self._slots.values() for e in s.executors]
        self._slots.clear()
        return executors
