"""A load generator in the spirit of Triton's perf_analyzer, for `vkserve bench`.

For each load level (a concurrency: that many requests always outstanding; or a request
rate: requests started at fixed intervals) it measures in windows and stops once the last
`stable_windows` windows agree on throughput and p50 latency within `tolerance` (or after
`max_windows`). Reported per level: throughput, client-side p50/p90/p95/p99 latency, and
the server-side split (queue vs execution seconds from the daemon's infer replies).

Each level first sends one untimed request on its new connection, as perf_analyzer warms up:
the connection's set-up and a model's first run (pipelines or kernels loaded on first use) are
not load, and on a slow box could otherwise fill a short window with nothing answered.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import trio

from vkserve.client.async_client import AsyncClient
from vkserve.client.errors import ServerError


@dataclasses.dataclass
class Sample:
    latency: float  # seconds, client side
    queue: float | None
    run: float | None
    batch: int | None = None  # jobs the daemon ran together with this request's


@dataclasses.dataclass
class Window:
    seconds: float
    samples: list[Sample] = dataclasses.field(default_factory=list)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)

    def count_error(self, exc: ServerError) -> None:
        """One more request answered with ``exc``'s error code in this window."""
        self.errors[exc.code] = self.errors.get(exc.code, 0) + 1

    @property
    def throughput(self) -> float:
        """Requests answered per second in this window."""
        return len(self.samples) / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50(self) -> float:
        """Median client-side latency (seconds) in this window."""
        return percentile([s.latency for s in self.samples], 50)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values``; NaN when there are none."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def stable(windows: Sequence[Window], count: int, tolerance: float) -> bool:
    """The last `count` windows agree within `tolerance` (relative) on throughput and p50."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    for metric in (lambda w: w.throughput, lambda w: w.p50):
        values = [metric(w) for w in last]
        mean = statistics.fmean(values)
        if not all(math.isfinite(v) for v in values) or mean <= 0:
            return False
        if max(abs(v - mean) for v in values) > tolerance * mean:
            return False
    return True


@dataclasses.dataclass
class LevelResult:
    mode: str  # "concurrency" or "rate"
    level: float
    windows: int
    stable: bool
    requests: int
    errors: dict[str, int]
    throughput: float  # requests per second
    items_per_s: float  # inferences per second: requests times the client's batch
    server_batch: float | None  # mean jobs per execution the daemon reported
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    server_queue_ms: float | None
    server_run_ms: float | None

    @classmethod
    def from_windows(cls, mode: str, level: float, windows: Sequence[Window],
                     was_stable: bool, batch: int = 1) -> LevelResult:
        """A level's figures from the windows it is judged on."""
        samples = [s for w in windows for s in w.samples]
        latencies = [s.latency for s in samples]
        errors: dict[str, int] = {}
        for w in windows:
            for code, n in w.errors.items():
                errors[code] = errors.get(code, 0) + n

        def mean_ms(values: list[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return round(statistics.fmean(known) * 1e3, 4) if known else None

        seconds = sum(w.seconds for w in windows)
        throughput = len(samples) / seconds if seconds else 0.0
        batches = [s.batch for s in samples if s.batch is not None]
        return cls(
            mode=mode, level=level, windows=len(windows), stable=was_stable,
            requests=len(samples), errors=errors,
            throughput=round(throughput, 3), items_per_s=round(throughput * batch, 3),
            server_batch=round(statistics.fmean(batches), 2) if batches else None,
            **{f"p{q}_ms": round(percentile(latencies, q) * 1e3, 4) for q in (50, 90, 95, 99)},
            server_queue_ms=mean_ms([s.queue for s in samples]),
            server_run_ms=mean_ms([s.run for s in samples]),
        )


@dataclasses.dataclass
class BenchSettings:
    model: str
    inputs: Mapping[str, np.ndarray]
    window_seconds: float = 2.0
    max_windows: int = 10
    stable_windows: int = 3
    tolerance: float = 0.1
    timeout: float | None = 30.0
    batch: int = 1  # the inputs carry this many items (a leading batch dimension) when > 1


Progress = Callable[[str, float, int, Window], None]


async def measure_level(connect: Callable[[], Any], settings: BenchSettings, *,
                        concurrency: int | None = None, rate: float | None = None,
                        progress: Progress | None = None) -> LevelResult:
    """Drive one load level until stable; `connect()` returns an AsyncClient async context."""
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency or rate")
    mode, level = ("concurrency", float(concurrency)) if concurrency else ("rate", float(rate))
    windows: list[Window] = []
    current = Window(settings.window_seconds)

    inputs = settings.inputs
    if settings.batch > 1:
        inputs = {n: np.stack([a] * settings.batch) for n, a in inputs.items()}

    async def one(client: AsyncClient) -> None:
        t0 = trio.current_time()
        try:
            reply = await client.infer_detailed(settings.model, inputs, timeout=settings.timeout)
        except ServerError as exc:
            current.count_error(exc)
            return
        current.samples.append(Sample(trio.current_time() - t0, reply.queue_seconds,
                                      reply.run_seconds, reply.batch_size))

    async with connect() as client:
        try:
            await client.infer_detailed(settings.model, inputs, timeout=settings.timeout)
        except ServerError as exc:  # counted against the level's first window
            current.count_error(exc)
        async with trio.open_nursery() as nursery:
            if concurrency:
                async def worker() -> None:
                    while True:
                        await one(client)

                for _ in range(concurrency):
                    nursery.start_soon(worker)
            else:
                async def pacer() -> None:
                    interval = 1.0 / rate
                    next_at = trio.current_time()
                    while True:
                        nursery.start_soon(one, client)
                        next_at += interval
                        await trio.sleep_until(next_at)

                nursery.start_soon(pacer)
            while len(windows) < settings.max_windows:
                await trio.sleep(settings.window_seconds)
                windows.append(current)
                current = Window(settings.window_seconds)
                if progress:
                    progress(mode, level, len(windows), windows[-1])
                if stable(windows, settings.stable_windows, settings.tolerance):
                    break
            nursery.cancel_scope.cancel()
    was_stable = stable(windows, settings.stable_windows, settings.tolerance)
    used = windows[-settings.stable_windows:] if was_stable else windows
    return LevelResult.from_windows(mode, level, used, was_stable, settings.batch)


async def sweep(connect: Callable[[], Any], settings: BenchSettings, *,
                concurrencies: Sequence[int] = (), rates: Sequence[float] = (),
                progress: Progress | None = None) -> list[LevelResult]:
    """Every concurrency level, then every rate level, one after the other."""
    results = []
    for c in concurrencies:
        results.append(await measure_level(connect, settings, concurrency=c, progress=progress))
    for r in rates:
        results.append(await measure_level(connect, settings, rate=r, progress=progress))
    return results
