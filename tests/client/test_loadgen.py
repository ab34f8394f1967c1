"""The load generator's statistics (no sockets) and its driver against an in-process server."""

import csv
import math

import numpy as np
import pytest
import trio

from vkserve.cli.commands.bench import format_table, write_csv, write_plot
from vkserve.client.loadgen import BenchSettings, LevelResult, Sample, Window, measure_level, stable


def window(latencies, seconds=1.0, queue=0.001, run=0.002):
    return Window(seconds, [Sample(x, queue, run) for x in latencies])


def test_stability_needs_agreeing_windows():
    steady = [window([0.010] * 100) for _ in range(3)]
    assert stable(steady, 3, 0.1)
    assert not stable(steady[:2], 3, 0.1)
    noisy = steady[:2] + [window([0.010] * 50)]  # throughput halved
    assert not stable(noisy, 3, 0.1)
    slower = steady[:2] + [window([0.020] * 100)]  # p50 doubled
    assert not stable(slower, 3, 0.1)
    assert not stable([Window(1.0)] * 3, 3, 0.1)  # no samples is never stable


def test_level_result_percentiles_and_server_split():
    lat = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    r = LevelResult.from_windows("concurrency", 4, [window(lat[:50]), window(lat[50:])], True)
    assert r.requests == 100 and r.throughput == 50.0
    assert r.p50_ms == pytest.approx(50.5) and r.p99_ms == pytest.approx(99.01)
    assert r.p90_ms < r.p95_ms < r.p99_ms
    assert r.server_queue_ms == 1.0 and r.server_run_ms == 2.0


def test_outputs_table_csv_plot(tmp_path):
    results = [LevelResult.from_windows("concurrency", c, [window([0.001 * c] * 10)], False)
               for c in (1, 4)]
    table = format_table(results).splitlines()
    assert table[0].split()[:5] == ["load", "req/s", "items/s", "batch", "p50"]
    assert len(table) == 3 and "concurrency 4" in table[2]
    write_csv(tmp_path / "b.csv", results)
    rows = list(csv.DictReader((tmp_path / "b.csv").open()))
    assert [float(r["level"]) for r in rows] == [1.0, 4.0]
    assert float(rows[1]["p50_ms"]) == pytest.approx(4.0)
    write_plot(tmp_path / "b.png", "m", results)
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class FakeClient:
    """Answers after a fixed delay (the first call after `first_delay`, when given: a model's
    cold first run); records concurrency and calls."""

    def __init__(self, delay: float, first_delay: float | None = None) -> None:
        self.delay = delay
        self.first_delay = first_delay
        self.outstanding = 0
        self.max_outstanding = 0
        self.calls = 0

    async def infer_detailed(self, model, inputs, timeout=None):
        from vkserve.client.messages import InferReply

        self.outstanding += 1
        self.calls += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        first = self.calls == 1 and self.first_delay is not None
        await trio.sleep(self.first_delay if first else self.delay)
        self.outstanding -= 1
        return InferReply({"y": np.zeros(1)}, "fake", 0.0, self.delay)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


async def test_concurrency_level_keeps_n_outstanding(autojump_clock):
    fake = FakeClient(0.01)
    settings = BenchSettings("m", {}, window_seconds=1.0, max_windows=6)
    r = await measure_level(lambda: fake, settings, concurrency=4)
    assert fake.max_outstanding == 4
    assert r.stable and r.throughput == pytest.approx(400, rel=0.05)
    assert r.p50_ms == pytest.approx(10, rel=0.05) and r.server_run_ms == pytest.approx(10)


async def test_a_cold_first_request_is_not_measured(autojump_clock):
    """The first request takes longer than both windows: it is the level's untimed warm-up, so
    the windows hold the model's steady answers, not nothing (a NaN p99 before)."""
    fake = FakeClient(0.01, first_delay=3.0)
    settings = BenchSettings("m", {}, window_seconds=1.0, max_windows=2, stable_windows=2)
    r = await measure_level(lambda: fake, settings, concurrency=1)
    assert r.stable and r.requests == pytest.approx(200, rel=0.05) and fake.calls >= r.requests + 1
    assert r.p99_ms == pytest.approx(10, rel=0.05)


async def test_rate_level_paces_requests(autojump_clock):
    fake = FakeClient(0.05)
    settings = BenchSettings("m", {}, window_seconds=1.0, max_windows=6)
    r = await measure_level(lambda: fake, settings, rate=100)
    assert r.throughput == pytest.approx(100, rel=0.05)
    assert fake.max_outstanding == pytest.approx(5, abs=1)  # rate x latency
    assert math.isfinite(r.p99_ms)
