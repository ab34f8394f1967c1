"""Per-device memory pool: buffers recycled by size class under a byte budget (DESIGN §7).

Plans take their weights, arenas and staging buffers from here and give them back when an
instance or a plan closes. A released buffer is kept idle in its size class and handed out
again to the next request of that class, so a steady stream of jobs allocates nothing and
device memory stays flat. Size classes are 2^k * {4, 5, 6, 7} / 4 (at most 25 % slack), so
arenas of similar plans share buffers.

The budget covers every buffer the pool holds, busy or idle. A request that would exceed it
first frees idle buffers (least recently released first), then asks the registered
reclaimers (plans dropping their idle instances) to give buffers back, and only then fails
with `PoolExhausted`. Vulkan allocations happen outside the pool's lock.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

from vkserve.devices.capabilities import DeviceCaps
from vkserve.devices.vulkan.context import Buffer, MemoryKind, VulkanContext

log = logging.getLogger(__name__)

MIN_CLASS = 4096
BUDGET_FRACTION = 0.8  # of the largest device-local heap (or its reported budget)


class PoolExhausted(MemoryError):
    """A request does not fit the pool's budget even after evicting everything idle."""


def size_class(nbytes: int) -> int:
    """The smallest class >= nbytes: MIN_CLASS, then 2^k * {4, 5, 6, 7} / 4."""
    if nbytes <= MIN_CLASS:
        return MIN_CLASS
    k = (nbytes - 1).bit_length() - 1  # 2^k < nbytes <= 2^(k+1)
    for quarter in (5, 6, 7, 8):
        c = (1 << k) * quarter // 4
        if c >= nbytes:
            return c
    raise AssertionError("unreachable: 2^(k+1) >= nbytes")


def default_budget(caps: DeviceCaps) -> int:
    heaps = [h for h in caps.heaps if h.device_local] or list(caps.heaps)
    if not heaps:
        return 1 << 30
    best = max(heaps, key=lambda h: h.size)
    usable = best.budget if best.budget else best.size
    return int(usable * BUDGET_FRACTION)


class MemoryPool:
    """Recycles `Buffer`s of one VulkanContext by (memory kind, size class)."""

    def __init__(self, ctx: VulkanContext, budget_bytes: int | None = None) -> None:
        self.ctx = ctx
        self.budget_bytes = default_budget(ctx.caps) if budget_bytes is None else budget_bytes
        self._lock = threading.Lock()
        # (kind, class) -> idle buffers; the OrderedDict of all idle buffers keeps LRU order.
        self._idle: dict[tuple[MemoryKind, int], list[Buffer]] = collections.defaultdict(list)
        self._idle_order: collections.OrderedDict[int, tuple[MemoryKind, int, Buffer]] = (
            collections.OrderedDict())
        self._busy: dict[int, tuple[MemoryKind, int, Buffer]] = {}
        self._reserved = 0  # bytes of allocations in flight
        self._reclaimers: list[Callable[[], None]] = []
        self.held_bytes = 0  # busy + idle + reserved
        self.allocations = 0  # VkDeviceMemory allocations made (reuse keeps this flat)
        self.reuses = 0
        self.evictions = 0

    # -- statistics ---------------------------------------------------------------------------

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return sum(c for _, c, _ in self._idle_order.values())

    @property
    def busy_bytes(self) -> int:
        with self._lock:
            return sum(c for _, c, _ in self._busy.values())

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"budget_bytes": self.budget_bytes, "held_bytes": self.held_bytes,
                    "busy_buffers": len(self._busy), "idle_buffers": len(self._idle_order),
                    "allocations": self.allocations, "reuses": self.reuses,
                    "evictions": self.evictions}

    # -- reclaimers ---------------------------------------------------------------------------

    def add_reclaimer(self, fn: Callable[[], None]) -> None:
        """`fn()` is called under memory pressure; it should release idle buffers it holds."""
        with self._lock:
            self._reclaimers.append(fn)

    def remove_reclaimer(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._reclaimers:
                self._reclaimers.remove(fn)

    # -- acquire / release ----------------------------------------------------------------------

    def acquire(self, nbytes: int, kind: MemoryKind) -> Buffer:
        """A buffer of at least `nbytes` (its `size` is the class size)."""
        cls = size_class(nbytes)
        doomed: list[Buffer] = []
        reclaimed = False
        while True:
            with self._lock:
                idle = self._idle.get((kind, cls))
                if idle:
                    buf = idle.pop()
                    del self._idle_order[id(buf)]
                    self._busy[id(buf)] = (kind, cls, buf)
                    self.reuses += 1
                    break
                doomed += self._evict_for(cls)
                if self.held_bytes + cls <= self.budget_bytes:
                    self.held_bytes += cls
                    self._reserved += cls
                    buf = None
                    break
                reclaimers = list(self._reclaimers) if not reclaimed else []
            self._destroy(doomed)
            doomed = []
            if not reclaimers:
                raise PoolExhausted(
                    f"device {self.ctx.caps.index}: {cls} bytes ({kind.value}) do not fit the "
                    f"pool budget of {self.budget_bytes} bytes ({self.held_bytes} held in use)")
            reclaimed = True
            for fn in reclaimers:
                fn()
        self._destroy(doomed)
        if buf is not None:
            return buf
        try:
            buf = self.ctx.create_buffer(cls, kind)
        except BaseException:
            with self._lock:
                self.held_bytes -= cls
                self._reserved -= cls
            raise
        with self._lock:
            self._reserved -= cls
            self._busy[id(buf)] = (kind, cls, buf)
            self.allocations += 1
        return buf

    def _evict_for(self, cls: int) -> list[Buffer]:
        """Take idle buffers (oldest first) off the books until `cls` more bytes fit; the
        caller destroys them outside the lock. Called with the lock held."""
        out = []
        while self.held_bytes + cls > self.budget_bytes and self._idle_order:
            _, (kind, c, buf) = self._idle_order.popitem(last=False)
            self._idle[(kind, c)].remove(buf)
            self.held_bytes -= c
            self.evictions += 1
            out.append(buf)
        return out

    def release(self, buf: Buffer) -> None:
        """Give a buffer back: it stays allocated, idle, for the next request of its class."""
        with self._lock:
            entry = self._busy.pop(id(buf), None)
            if entry is None:
                raise ValueError("buffer was not acquired from this pool (or released twice)")
            kind, cls, _ = entry
            self._idle[(kind, cls)].append(buf)
            self._idle_order[id(buf)] = entry

    def trim(self) -> int:
        """Free every idle buffer; returns the bytes freed."""
        with self._lock:
            doomed = [b for _, _, b in self._idle_order.values()]
            freed = sum(c for _, c, _ in self._idle_order.values())
            self._idle.clear()
            self._idle_order.clear()
            self.held_bytes -= freed
        self._destroy(doomed)
        return freed

    def close(self) -> None:
        """Free everything, busy buffers included (their owners must be closed already)."""
        with self._lock:
            busy = [b for _, _, b in self._busy.values()]
            self._busy.clear()
            self._reclaimers.clear()
        if busy:
            log.warning("device %d: memory pool closed with %d buffer(s) still in use",
                        self.ctx.caps.index, len(busy))
        self._destroy(busy)
        self.trim()
        with self._lock:
            self.held_bytes = self._reserved

    @staticmethod
    def _destroy(buffers: list[Buffer]) -> None:
        for buf in buffers:
            buf.destroy()
