"""Prometheus metrics of the daemon (names `vkserve_*`, base units, `_total` counters).

Events (requests, rejections, loads) update counters and histograms as they happen; state
that other parts already keep (queue depths, device health, memory pools, pipeline-cache
counters) is read at scrape time through `snapshot`, a callable returning a `StateSnapshot`,
so nothing has to be kept in sync by hand. Each `DaemonMetrics` has its own registry, so
tests and several daemons in one process do not collide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Millisecond inference: 0.25 ms .. ~8 s, doubling; identical on every box so they aggregate.
LATENCY_BUCKETS = tuple(0.00025 * 2**k for k in range(16))
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclasses.dataclass
class DeviceState:
    device: str  # label value, e.g. "vulkan0" or "cpu"
    healthy: bool
    in_flight: int = 0
    memory_in_use_bytes: int = 0
    memory_pooled_bytes: int = 0
    memory_budget_bytes: int = 0
    # tier -> (hits, misses); tiers "pipeline", "spirv"
    cache: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    compile_seconds: float = 0.0
    memory_known: bool = True  # False: no memory pool (the CPU, a GPU not opened yet)


@dataclasses.dataclass
class StateSnapshot:
    devices: list[DeviceState] = dataclasses.field(default_factory=list)
    queue_depth: dict[str, int] = dataclasses.field(default_factory=dict)  # model -> jobs


class _StateCollector(Collector):
    def __init__(self, snapshot: Callable[[], StateSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._snapshot()
        depth = GaugeMetricFamily("vkserve_queue_depth", "Jobs waiting, per model",
                                  labels=["model"])
        for model, n in sorted(s.queue_depth.items()):
            depth.add_metric([model], n)
        yield depth
        gauges = {
            "in_flight": ("vkserve_in_flight", "Jobs running on the device"),
            "healthy": ("vkserve_device_healthy", "1 when the device serves, 0 after a fault"),
            "memory_in_use_bytes": ("vkserve_device_memory_in_use_bytes",
                                    "Device memory held by loaded models and running jobs"),
            "memory_pooled_bytes": ("vkserve_device_memory_pooled_bytes",
                                    "Idle device memory kept in the pool for reuse"),
            "memory_budget_bytes": ("vkserve_device_memory_budget_bytes",
                                    "Byte budget of the device's memory pool"),
        }
        for attr, (name, doc) in gauges.items():
            family = GaugeMetricFamily(name, doc, labels=["device"])
            for d in s.devices:
                if d.memory_known or not attr.startswith("memory_"):
                    family.add_metric([d.device], float(getattr(d, attr)))
            yield family
        hits = CounterMetricFamily("vkserve_pipeline_cache_hits", "Pipeline-cache hits by tier",
                                   labels=["device", "tier"])
        misses = CounterMetricFamily("vkserve_pipeline_cache_misses",
                                     "Pipeline-cache misses by tier", labels=["device", "tier"])
        compile_s = CounterMetricFamily("vkserve_pipeline_compile_seconds",
                                        "Time spent compiling GLSL to SPIR-V",
                                        labels=["device"])
        for d in s.devices:
            for tier, (h, m) in sorted(d.cache.items()):
                hits.add_metric([d.device, tier], h)
                misses.add_metric([d.device, tier], m)
            if d.cache:
                compile_s.add_metric([d.device], d.compile_seconds)
        yield hits
        yield misses
        yield compile_s


class DaemonMetrics:
    def __init__(self, snapshot: Callable[[], StateSnapshot] = StateSnapshot) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("vkserve_requests", "Finished requests by outcome",
                                ["model", "device", "outcome"], registry=r)
        self.rejected = Counter("vkserve_rejected_requests",
                                "Requests refused before running, by reason", ["reason"],
                                registry=r)
        self.queue_seconds = Histogram("vkserve_queue_seconds", "Time jobs waited in the queue",
                                       ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.execution_seconds = Histogram("vkserve_execution_seconds",
                                           "Time jobs ran on a device", ["model"],
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.request_seconds = Histogram("vkserve_request_seconds",
                                         "End-to-end time from request to response",
                                         ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.model_load_seconds = Histogram("vkserve_model_load_seconds",
                                            "Model load time per device, cold or warm cache",
                                            ["model", "device", "cache"],
                                            buckets=LOAD_BUCKETS, registry=r)
        r.register(_StateCollector(snapshot))

    def observe_request(self, model: str, device: str, outcome: str, *, total: float,
                        queue: float | None = None, execution: float | None = None) -> None:
        """One finished request; `outcome` is "ok" or an error code in lower case."""
        self.requests.labels(model, device, outcome).inc()
        self.request_seconds.labels(model).observe(total)
        if queue is not None:
            self.queue_seconds.labels(model).observe(queue)
        if execution is not None:
            self.execution_seconds.labels(model).observe(execution)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# ------------------------------------------------------------------ from the scheduler's state


def device_label(kind: str, index: int) -> str:
    """The ``device`` label: ``cpu`` for the CPU, else kind and index (``vulkan0``)."""
    return "cpu" if kind == "cpu" else f"{kind}{index}"


def snapshot_from_status(status: Mapping[str, Any]) -> StateSnapshot:
    """A StateSnapshot from ``Scheduler.status()`` (devices with ``memory`` and
    ``pipeline_cache`` when their Vulkan device is open; per-model queue depths)."""
    devices = []
    for d in status.get("devices", []):
        if not isinstance(d, Mapping):
            continue
        state = DeviceState(device_label(str(d.get("kind", "")), int(d.get("index", -1))),
                            bool(d.get("healthy")), in_flight=int(d.get("in_flight") or 0))
        memory = d.get("memory")
        state.memory_known = isinstance(memory, Mapping)
        if isinstance(memory, Mapping):
            state.memory_in_use_bytes = int(memory.get("in_use_bytes", 0))
            state.memory_pooled_bytes = int(memory.get("pooled_bytes", 0))
            state.memory_budget_bytes = int(memory.get("budget_bytes", 0))
        cache = d.get("pipeline_cache")
        if isinstance(cache, Mapping):
            state.cache = {
                "pipeline": (int(cache.get("pipeline_hits", 0)),
                             int(cache.get("pipeline_misses", 0))),
                "spirv": (int(cache.get("spirv_hits", 0)), int(cache.get("glsl_compiles", 0))),
            }
            state.compile_seconds = float(cache.get("compile_seconds", 0.0))
        devices.append(state)
    models = status.get("models", {})
    depth = {str(name): int(m.get("queue_depth", 0)) for name, m in models.items()
             if isinstance(m, Mapping)} if isinstance(models, Mapping) else {}
    return StateSnapshot(devices=devices, queue_depth=depth)


class LoadRecorder:
    """Observes each finished model load once into ``vkserve_model_load_seconds``, read from
    the placements of ``Scheduler.models()`` (``load_seconds``, ``load_cache``)."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics
        self._seen: set[tuple[str, int, float]] = set()

    def record(self, models: list[dict[str, Any]], labels: Mapping[int, str]) -> int:
        new = 0
        for m in models:
            for p in m.get("placements") or []:
                seconds = p.get("load_seconds")
                if p.get("state") != "ready" or seconds is None:
                    continue
                key = (str(m.get("name")), int(p.get("device", -1)), float(seconds))
                if key in self._seen:
                    continue
                self._seen.add(key)
                device = labels.get(key[1], str(key[1]))
                cache = p.get("load_cache") or "warm"
                self.metrics.model_load_seconds.labels(key[0], device, cache).observe(key[2])
                new += 1
        return new
