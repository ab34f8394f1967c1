"""The timing loops the benchmarks share."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(fn: Callable[[], object], repeat: int, warmup: int = 3) -> float:
    """Median wall time of `fn` in milliseconds over `repeat` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def interleaved_ms(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1, repeat: int = 1,
                   quiet_s: float = 0.0) -> dict[str, float]:
    """Each function's median wall time in milliseconds over ``rounds`` rounds that call every
    one of them in turn (``repeat`` timed calls a turn), after ``warmup`` untimed rounds: a
    drift of the machine's speed reaches each alike, where timing them one after another
    compares different moments. With ``quiet_s`` each turn starts with that pause and one
    untimed call: engines with thread pools of their own find the machine quiet (the other's
    workers stopped spinning) and their own pool and caches back."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(warmup + rounds):
        for name, fn in fns.items():
            if quiet_s:
                time.sleep(quiet_s)
                fn()
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                if r >= warmup:
                    times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
