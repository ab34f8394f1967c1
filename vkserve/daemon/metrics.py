"""Prometheus metrics of the daemon (names `vkserve_*`, base units, `_total` counters).

Events (requests, rejections, loads) update counters and histograms as they happen; state
that the scheduler already keeps (queue depths, device health, memory pools, pipeline-cache
counters, discovery's GPU problem) is read at scrape time from its ``Status`` through
`status`, a callable, so nothing has to be kept in sync by hand. Each `DaemonMetrics` has its
own registry, so tests and several daemons in one process do not collide.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from vkserve import __version__
from vkserve.scheduler import DeviceStatus, ModelInfo, ModelState, PlacementState, Status

#: The ``model`` label of requests for a model the daemon does not have: one series for all
#: of them, so a client sending random names cannot grow the metrics without bound.
UNKNOWN_MODEL = "_unknown"

# Millisecond inference: 0.25 ms .. ~8 s, doubling; identical on every box so they aggregate.
LATENCY_BUCKETS = tuple(0.00025 * 2**k for k in range(16))
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def device_label(device: DeviceStatus) -> str:
    """The ``device`` label: ``cpu`` for the CPU, else kind and index (``vulkan0``)."""
    return "cpu" if device.kind == "cpu" else f"{device.kind}{device.index}"


class _StateCollector(Collector):
    def __init__(self, status: Callable[[], Status]) -> None:
        self._status = status

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._status()
        depth = GaugeMetricFamily("vkserve_queue_depth", "Jobs waiting, per model",
                                  labels=["model"])
        ready = GaugeMetricFamily("vkserve_model_ready",
                                  "1 when the model serves on a healthy device, else 0",
                                  labels=["model"])
        reload_failures = CounterMetricFamily(
            "vkserve_model_reload_failures",
            "Reloads (SIGHUP rescans) whose new version could not serve; the old one kept serving",
            labels=["model"])
        for model, queue in sorted(s.models.items()):
            depth.add_metric([model], queue.queue_depth)
            ready.add_metric([model], float(queue.state is ModelState.READY))
            reload_failures.add_metric([model], queue.reload_failures)
        yield depth
        yield ready
        yield reload_failures
        in_flight = GaugeMetricFamily("vkserve_in_flight", "Jobs running on the device",
                                      labels=["device"])
        healthy = GaugeMetricFamily("vkserve_device_healthy",
                                    "1 when the device serves, 0 after a fault", labels=["device"])
        in_use = GaugeMetricFamily("vkserve_device_memory_in_use_bytes",
                                   "Device memory held by loaded models and running jobs",
                                   labels=["device"])
        pooled = GaugeMetricFamily("vkserve_device_memory_pooled_bytes",
                                   "Idle device memory kept in the pool for reuse", labels=["device"])
        budget = GaugeMetricFamily("vkserve_device_memory_budget_bytes",
                                   "Byte budget of the device's memory pool", labels=["device"])
        hits = CounterMetricFamily("vkserve_pipeline_cache_hits", "Pipeline-cache hits by tier",
                                   labels=["device", "tier"])
        misses = CounterMetricFamily("vkserve_pipeline_cache_misses",
                                     "Pipeline-cache misses by tier", labels=["device", "tier"])
        compile_s = CounterMetricFamily("vkserve_pipeline_compile_seconds",
                                        "Time spent compiling GLSL to SPIR-V",
                                        labels=["device"])
        cache_errors = CounterMetricFamily(
            "vkserve_pipeline_cache_errors",
            "Failed pipeline-cache file operations by op (create, lock, load, save, tuning); "
            "the cache then works in memory only", labels=["device", "op"])
        for d in s.devices:
            label = device_label(d)
            in_flight.add_metric([label], d.in_flight)
            healthy.add_metric([label], float(d.healthy))
            if d.memory is not None:  # none on the CPU, nor before the Vulkan device opens
                in_use.add_metric([label], d.memory.in_use_bytes)
                pooled.add_metric([label], d.memory.pooled_bytes)
                budget.add_metric([label], d.memory.budget_bytes)
            cache = d.pipeline_cache
            if cache is not None:
                hits.add_metric([label, "pipeline"], cache.pipeline_hits)
                misses.add_metric([label, "pipeline"], cache.pipeline_misses)
                hits.add_metric([label, "spirv"], cache.spirv_hits)
                misses.add_metric([label, "spirv"], cache.glsl_compiles)
                compile_s.add_metric([label], cache.compile_seconds)
                for op, count in cache.errors().items():
                    cache_errors.add_metric([label, op], count)
        yield from (in_flight, healthy, in_use, pooled, budget, hits, misses, compile_s,
                    cache_errors)
        unusable = GaugeMetricFamily("vkserve_gpu_unusable",
                                     "1 per GPU device node present while Vulkan found no GPU",
                                     labels=["node", "reason"])
        if s.gpu_problem is not None:
            for node in s.gpu_problem.nodes:
                unusable.add_metric([node, s.gpu_problem.reason.value], 1)
        yield unusable


class DaemonMetrics:
    def __init__(self, status: Callable[[], Status]) -> None:
        # no `_created` series beside every counter and histogram: they double the series and
        # Prometheus derives resets itself (a process-wide switch of the client library)
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, open fds ...
        Gauge("vkserve_build_info", "1, labelled with the version of vkserve and of Python",
              ["version", "python"], registry=r).labels(__version__, platform.python_version()).set(1)
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
        r.register(_StateCollector(status))

    def observe_request(self, model: str, device: str, outcome: str, *, total: float,
                        queue: float | None = None, execution: float | None = None) -> None:
        """One finished request; `outcome` is "ok" or an error code in lower case. A model
        the daemon does not have (``not_found``) is labelled UNKNOWN_MODEL."""
        if outcome == "not_found":
            model = UNKNOWN_MODEL
        self.requests.labels(model, device, outcome).inc()
        self.request_seconds.labels(model).observe(total)
        if queue is not None:
            self.queue_seconds.labels(model).observe(queue)
        if execution is not None:
            self.execution_seconds.labels(model).observe(execution)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class LoadRecorder:
    """Observes each finished model load once into ``vkserve_model_load_seconds``, read from
    the placements of ``Scheduler.models()`` (``load_seconds``, ``load_cache``)."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics
        self._seen: set[tuple[str, int, float]] = set()

    def record(self, models: list[ModelInfo], labels: Mapping[int, str]) -> int:
        new = 0
        for m in models:
            for p in m.placements:
                if p.state is not PlacementState.READY or p.load_seconds is None:
                    continue
                key = (m.name, p.device, p.load_seconds)
                if key in self._seen:
                    continue
                self._seen.add(key)
                device = labels.get(p.device, str(p.device))
                self.metrics.model_load_seconds.labels(m.name, device, p.load_cache or "warm").observe(
                    p.load_seconds)
                new += 1
        return new
