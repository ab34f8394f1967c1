"""Prometheus metrics of the daemon, named as Prometheus' naming guide asks.

Every family is defined once, in :data:`FAMILIES` (name, type, labels, meaning): the daemon's
collectors are built from those definitions, and the README's metrics table is generated from
them (``python -m vkserve.daemon.metrics``; a test keeps the two equal). Names carry the
``vkserve_`` prefix and their unit in base units (``_seconds``, ``_bytes``); durations are
``..._duration_seconds`` histograms, counters end in ``_total``, gauges of work under way
count requests (``..._requests``).

Events (requests, rejections, loads) update counters and histograms as they happen; state
that the scheduler already keeps (queue depths and limits, device health, memory pools,
pipeline-cache counters, discovery's GPU problem) is read at scrape time from its ``Status``
and model reports through `status` and `models`, callables, so nothing has to be kept in sync
by hand. Each `DaemonMetrics` has its own registry, so tests and several daemons in one
process do not collide.
"""

from __future__ import annotations

import dataclasses
import enum
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
from vkserve.scheduler import ModelInfo, ModelState, PlacementState, Status

#: The ``model`` label of requests for a model the daemon does not have: one series for all
#: of them, so a client sending random names cannot grow the metrics without bound.
UNKNOWN_MODEL = "_unknown"

# Millisecond inference: 0.25 ms .. ~8 s, doubling; identical on every box so they aggregate.
LATENCY_BUCKETS = tuple(0.00025 * 2**k for k in range(16))
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: Batch sizes: powers of two up to 64 (``max_batch_size`` is rarely larger).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class MetricType(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclasses.dataclass(frozen=True)
class Family:
    """One metric family as it appears in the exposition (counters with their ``_total``)."""

    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str

    def gauge(self) -> GaugeMetricFamily:
        """An empty family for a scrape-time collector."""
        assert self.type is MetricType.GAUGE, self.name
        return GaugeMetricFamily(self.name, self.help, labels=list(self.labels))

    def counter(self) -> CounterMetricFamily:
        """An empty family for a scrape-time collector."""
        assert self.type is MetricType.COUNTER, self.name
        return CounterMetricFamily(self.name, self.help, labels=list(self.labels))


_C, _G, _H = MetricType.COUNTER, MetricType.GAUGE, MetricType.HISTOGRAM
OUTCOME = "ok or the error code in lower case"
BUILD_INFO = Family("vkserve_build_info", _G, ("version", "python"),
                    "1, labelled with the version of vkserve and of Python")
REQUESTS = Family("vkserve_requests_total", _C, ("model", "device", "outcome"),
                  f"Finished infer requests by outcome ({OUTCOME}); the model {UNKNOWN_MODEL} "
                  "for names the daemon does not have, the device none when none ran it")
REJECTED = Family("vkserve_rejected_requests_total", _C, ("reason",),
                  "Requests refused before they ran, by reason (overloaded, unauthenticated, "
                  "bad_request, frame_too_large, frame_timeout, shutting_down, "
                  "too_many_connections, too_many_unauthenticated)")
QUEUE_DURATION = Family("vkserve_queue_duration_seconds", _H, ("model",),
                        "Time jobs waited in the queue")
EXECUTION_DURATION = Family("vkserve_execution_duration_seconds", _H, ("model",),
                            "Time jobs ran on a device (the run of their batch)")
REQUEST_DURATION = Family("vkserve_request_duration_seconds", _H, ("model",),
                          "End-to-end time from request to response (buckets 0.25 ms to 8 s, doubling, "
                          "as for the queue and execution durations)")
BATCH_SIZE = Family("vkserve_request_batch_size", _H, ("model",),
                    "Jobs in the execution that answered the request (1: it ran alone)")
MODEL_LOAD_DURATION = Family("vkserve_model_load_duration_seconds", _H, ("model", "device", "cache"),
                             "Model load time per device; cache cold when the load compiled GLSL, "
                             "else warm")
QUEUED = Family("vkserve_queued_requests", _G, ("model",),
                "Jobs (requests, or items of a client's batch) waiting in the model's queue")
QUEUE_LIMIT = Family("vkserve_queue_limit_requests", _G, ("model",),
                     "Jobs the model's queue holds before it refuses more (OVERLOADED)")
MODEL_READY = Family("vkserve_model_ready", _G, ("model",),
                     "1 when the model serves on a healthy device, else 0")
RELOAD_FAILURES = Family("vkserve_model_reload_failures_total", _C, ("model",),
                         "Reloads (SIGHUP rescans) whose new version could not serve; the old "
                         "one kept serving")
IN_FLIGHT = Family("vkserve_in_flight_requests", _G, ("device",), "Jobs running on the device")
RUNS = Family("vkserve_device_runs_total", _C, ("device", "thread"),
              "Executions on the device (a batch is one), by the thread that ran them: worker "
              "(the device's run threads) or loop (the event loop's own: a short run while "
              "nothing else was in flight, scheduler.inline_run_ms)")
SHARED_INPUTS = Family("vkserve_device_shared_inputs_total", _C, ("device", "path"),
                      "Inputs that arrived in a client's shared memory, by how the device read "
                      "them: in_place (a GPU importing the client's pages, "
                      "VK_EXT_external_memory_host) or copied (into its staging buffer: no "
                      "import on the device, or the region or offset off its alignment; logged)")
DEVICE_HEALTHY = Family("vkserve_device_healthy", _G, ("device",),
                        "1 when the device serves, 0 after a fault")
MEMORY_IN_USE = Family("vkserve_device_memory_in_use_bytes", _G, ("device",),
                       "Device memory held by loaded models and running jobs (GPUs only)")
MEMORY_POOLED = Family("vkserve_device_memory_pooled_bytes", _G, ("device",),
                       "Idle device memory kept in the pool for reuse (GPUs only)")
MEMORY_BUDGET = Family("vkserve_device_memory_budget_bytes", _G, ("device",),
                       "Byte budget of the device's memory pool (GPUs only)")
CACHE_HITS = Family("vkserve_pipeline_cache_hits_total", _C, ("device", "tier"),
                    "Pipeline-cache hits by tier (pipeline, spirv)")
CACHE_MISSES = Family("vkserve_pipeline_cache_misses_total", _C, ("device", "tier"),
                      "Pipeline-cache misses by tier (a spirv miss compiles GLSL)")
COMPILE_SECONDS = Family("vkserve_pipeline_compile_seconds_total", _C, ("device",),
                         "Time spent compiling GLSL to SPIR-V")
CACHE_ERRORS = Family("vkserve_pipeline_cache_errors_total", _C, ("device", "op"),
                      "Failed pipeline-cache file operations by op (create, lock, load, save, "
                      "tuning; the cache then works in memory only), and driver_bypass (the "
                      "driver's own pipeline cache is on the known-broken list and not used)")
GPU_UNUSABLE = Family("vkserve_gpu_unusable", _G, ("node", "reason"),
                      "1 per GPU device node present while Vulkan found no GPU")

#: Every ``vkserve_*`` family the daemon exports, in the README's order. Beside them the
#: registry holds prometheus-client's ``process_*`` families (CPU time, memory, open fds).
FAMILIES: tuple[Family, ...] = (
    BUILD_INFO, REQUESTS, REJECTED, REQUEST_DURATION, QUEUE_DURATION, EXECUTION_DURATION,
    BATCH_SIZE, MODEL_LOAD_DURATION, QUEUED, QUEUE_LIMIT, MODEL_READY, RELOAD_FAILURES, IN_FLIGHT,
    RUNS, SHARED_INPUTS, DEVICE_HEALTHY, MEMORY_IN_USE, MEMORY_POOLED, MEMORY_BUDGET, CACHE_HITS, CACHE_MISSES,
    COMPILE_SECONDS, CACHE_ERRORS, GPU_UNUSABLE,
)


def markdown_table() -> str:
    """The README's table of :data:`FAMILIES` (``python -m vkserve.daemon.metrics``)."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    rows += [f"| `{f.name}` | {f.type.value} | {', '.join(f.labels) or '-'} | {f.help} |"
             for f in FAMILIES]
    return "\n".join(rows)


class _StateCollector(Collector):
    def __init__(self, status: Callable[[], Status], models: Callable[[], list[ModelInfo]]) -> None:
        self._status = status
        self._models = models

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        limit = QUEUE_LIMIT.gauge()
        for info in sorted(self._models(), key=lambda m: m.name):
            limit.add_metric([info.name], info.queue_limit)
        yield limit
        s = self._status()
        depth, ready, reload_failures = QUEUED.gauge(), MODEL_READY.gauge(), RELOAD_FAILURES.counter()
        for model, queue in sorted(s.models.items()):
            depth.add_metric([model], queue.queue_depth)
            ready.add_metric([model], float(queue.state is ModelState.READY))
            reload_failures.add_metric([model], queue.reload_failures)
        yield depth
        yield ready
        yield reload_failures
        in_flight, healthy, runs = IN_FLIGHT.gauge(), DEVICE_HEALTHY.gauge(), RUNS.counter()
        shared = SHARED_INPUTS.counter()
        in_use, pooled, budget = MEMORY_IN_USE.gauge(), MEMORY_POOLED.gauge(), MEMORY_BUDGET.gauge()
        hits, misses = CACHE_HITS.counter(), CACHE_MISSES.counter()
        compile_s, cache_errors = COMPILE_SECONDS.counter(), CACHE_ERRORS.counter()
        for d in s.devices:
            label = d.device  # cpu or vulkan:N (devices.names)
            in_flight.add_metric([label], d.in_flight)
            healthy.add_metric([label], float(d.healthy))
            runs.add_metric([label, "worker"], d.runs - d.inline_runs)
            runs.add_metric([label, "loop"], d.inline_runs)
            if d.kind == "vulkan":
                shared.add_metric([label, "in_place"], d.inputs_in_place)
                shared.add_metric([label, "copied"], d.shared_inputs_copied)
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
        yield from (in_flight, runs, shared, healthy, in_use, pooled, budget, hits, misses, compile_s,
                    cache_errors)
        unusable = GPU_UNUSABLE.gauge()
        if s.gpu_problem is not None:
            for node in s.gpu_problem.nodes:
                unusable.add_metric([node, s.gpu_problem.reason.value], 1)
        yield unusable


def _counter(family: Family, registry: CollectorRegistry) -> Counter:
    assert family.type is MetricType.COUNTER, family.name
    return Counter(family.name, family.help, family.labels, registry=registry)


def _histogram(family: Family, buckets: tuple[float, ...], registry: CollectorRegistry) -> Histogram:
    assert family.type is MetricType.HISTOGRAM, family.name
    return Histogram(family.name, family.help, family.labels, buckets=buckets, registry=registry)


@dataclasses.dataclass(frozen=True)
class _ModelChildren:
    """One model's children of the per-request histograms."""

    total: Histogram
    queue: Histogram
    execution: Histogram
    batch_size: Histogram


class DaemonMetrics:
    def __init__(self, status: Callable[[], Status], models: Callable[[], list[ModelInfo]]) -> None:
        # no `_created` series beside every counter and histogram: they double the series and
        # Prometheus derives resets itself (a process-wide switch of the client library)
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, open fds ...
        Gauge(BUILD_INFO.name, BUILD_INFO.help, BUILD_INFO.labels,
              registry=r).labels(__version__, platform.python_version()).set(1)
        self.requests = _counter(REQUESTS, r)
        self.rejected = _counter(REJECTED, r)
        self.request_duration = _histogram(REQUEST_DURATION, LATENCY_BUCKETS, r)
        self.queue_duration = _histogram(QUEUE_DURATION, LATENCY_BUCKETS, r)
        self.execution_duration = _histogram(EXECUTION_DURATION, LATENCY_BUCKETS, r)
        self.batch_size = _histogram(BATCH_SIZE, BATCH_BUCKETS, r)
        self.model_load_duration = _histogram(MODEL_LOAD_DURATION, LOAD_BUCKETS, r)
        r.register(_StateCollector(status, models))
        # the label children each request observes, looked up once per label set (five
        # ``labels()`` calls per request were a measurable share of the event loop's work);
        # bounded like the label values themselves (model names: known models + _unknown)
        self._request_counters: dict[tuple[str, str, str], Counter] = {}
        self._model_children: dict[str, _ModelChildren] = {}

    def observe_request(self, model: str, device: str, outcome: str, *, total: float,
                        queue: float | None = None, execution: float | None = None,
                        batch_size: int | None = None) -> None:
        """One finished request; `outcome` is "ok" or an error code in lower case; `queue`,
        `execution` and `batch_size` come with a request that ran. A model the daemon does
        not have (``not_found``) is labelled UNKNOWN_MODEL."""
        if outcome == "not_found":
            model = UNKNOWN_MODEL
        counter = self._request_counters.get((model, device, outcome))
        if counter is None:
            counter = self._request_counters[(model, device, outcome)] = self.requests.labels(
                model, device, outcome)
        counter.inc()
        per_model = self._model_children.get(model)
        if per_model is None:
            per_model = self._model_children[model] = _ModelChildren(
                self.request_duration.labels(model), self.queue_duration.labels(model),
                self.execution_duration.labels(model), self.batch_size.labels(model))
        per_model.total.observe(total)
        if queue is not None:
            per_model.queue.observe(queue)
        if execution is not None:
            per_model.execution.observe(execution)
        if batch_size is not None:
            per_model.batch_size.observe(batch_size)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class LoadRecorder:
    """Observes each finished model load once into ``vkserve_model_load_duration_seconds``, read from
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
                self.metrics.model_load_duration.labels(m.name, device, p.load_cache or "warm").observe(
                    p.load_seconds)
                new += 1
        return new


if __name__ == "__main__":
    print(markdown_table())
