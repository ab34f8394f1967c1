"""Budgets that keep one client (or a crowd of them) from starving the others (issue 11).

- :class:`BufferBudget`: the bytes all connections together may hold in partial frames
  (``server.max_buffered_bytes``). A connection reserves a frame's size once its header
  arrived and before it reads the payload; while the budget is spent it stops reading (TCP
  backpressure) instead of growing.
- :class:`AuthThrottle`: wrong-token attempts per source address (a token bucket,
  ``server.auth_failures_per_second``); an attempt waits for a token before it is checked.
- :class:`RateLimitedLog`: one WARNING per interval and kind of event, with the number of
  the ones left out since.
- :func:`address_key`: the "source address" the per-address budgets count (an IPv6 /64).
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import time

import trio

__all__ = ["AUTH_FAILURE_BURST", "LOG_INTERVAL", "AuthThrottle", "BufferBudget", "RateLimitedLog",
           "address_key"]

#: Wrong tokens one address may try at once before the rate of ``auth_failures_per_second``.
AUTH_FAILURE_BURST = 5
#: Seconds between two WARNING lines of one kind (the others are counted and summed up).
LOG_INTERVAL = 5.0
#: Addresses remembered by the throttle before idle (refilled) entries are forgotten.
_MAX_TRACKED = 4096


def address_key(host: str) -> str:
    """What counts as one source: the IPv4 address, or the /64 of an IPv6 one (a host gets a
    whole /64); an IPv4-mapped IPv6 address is its IPv4 address."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)


class _Waiter:
    __slots__ = ("event", "granted", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.event = trio.Event()
        self.granted = False


class BufferBudget:
    """Bytes that connections may buffer, shared by all; reservations are granted in FIFO
    order (a big frame is not starved by a stream of smaller ones)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiters: collections.deque[_Waiter] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, size: int) -> None:
        """Reserve ``size`` bytes (at most ``capacity``), waiting while they are not free."""
        size = min(size, self.capacity)
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._waiters and self.used + size <= self.capacity:
            self.used += size  # taken: a cancellation from here on would leak it
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter(size)
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self.release(size)
            else:
                self._waiters.remove(waiter)
                self._grant()  # the head may have left: the next one may fit
            raise

    def release(self, size: int) -> None:
        size = min(size, self.capacity)
        self.used = max(0, self.used - size)
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0].size <= self.capacity:
            waiter = self._waiters.popleft()
            self.used += waiter.size
            waiter.granted = True
            waiter.event.set()


class AuthThrottle:
    """Per address: a bucket of ``burst`` attempts refilled at ``rate`` a second. An attempt
    takes one (waiting until there is one) and a right token gives it back, so only wrong
    tokens spend the bucket and a client with the right token from a quiet address never
    waits."""

    def __init__(self, rate: float, burst: int = AUTH_FAILURE_BURST) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)

    def _level(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    async def acquire(self, key: str) -> None:
        while True:
            now = trio.current_time()
            tokens = self._level(key, now)
            if tokens >= 1.0:
                await trio.lowlevel.checkpoint_if_cancelled()
                self._buckets[key] = (tokens - 1.0, now)
                self._forget_idle(now)
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
            await trio.sleep((1.0 - tokens) / self.rate)

    def refund(self, key: str) -> None:
        now = trio.current_time()
        self._buckets[key] = (min(self.burst, self._level(key, now) + 1.0), now)

    def _forget_idle(self, now: float) -> None:
        if len(self._buckets) > _MAX_TRACKED:
            full = [k for k in self._buckets if self._level(k, now) >= self.burst]
            for k in full:
                del self._buckets[k]


class RateLimitedLog:
    """``warning(kind, fmt, *args)``: the first event of a kind logs at once; the ones within
    ``interval`` after it are counted, and the next line (or :meth:`flush`, once the interval
    is over) says how many were left out."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL) -> None:
        self.logger = logger
        self.interval = interval
        self._next: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, fmt: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next.get(kind, 0.0):
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        left_out = self._suppressed.pop(kind, 0)
        if left_out:
            fmt += " (and %d more %s in the last %g s, not logged)"
            args = (*args, left_out, kind, self.interval)
        self.logger.warning(fmt, *args)
        self._next[kind] = now + self.interval

    def flush(self) -> None:
        """One line per kind whose interval is over with events left out."""
        now = time.monotonic()
        for kind, count in list(self._suppressed.items()):
            if now >= self._next.get(kind, 0.0):
                del self._suppressed[kind]
                self.logger.warning("%d more %s in the last %g s, not logged", count, kind,
                                    self.interval)
                self._next[kind] = now + self.interval
