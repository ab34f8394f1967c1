import re

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import REPO
from vkserve.cache.pipeline_cache import CacheStats
from vkserve.daemon.metrics import FAMILIES, DaemonMetrics, MetricType, markdown_table
from vkserve.daemon.metrics_http import parse_listen, route, serve_metrics
from vkserve.devices.discovery import GpuFailure, GpuProblem
from vkserve.scheduler import (
    DeviceStatus,
    JobTotals,
    MemoryStats,
    ModelInfo,
    ModelQueue,
    ModelState,
    SchedulerState,
    Status,
)


def snapshot() -> Status:
    gpu = DeviceStatus(index=0, name="GPU", kind="vulkan", software=False, healthy=True, in_flight=2,
                       runs=7, inline_runs=3,
                       memory=MemoryStats(in_use_bytes=1000, pooled_bytes=24, budget_bytes=4096),
                       pipeline_cache=CacheStats(pipeline_hits=5, pipeline_misses=3, spirv_hits=3,
                                                 compile_seconds=1.5))
    cpu = DeviceStatus(index=1, name="CPU", kind="cpu", software=False, healthy=False)
    return Status(SchedulerState.RUNNING, True, [gpu, cpu],
                  {"digits": ModelQueue(ModelState.READY, queue_depth=4, in_flight=0)}, 4, 2,
                  JobTotals(), GpuProblem(("/dev/dri/renderD129",), GpuFailure.NO_DRIVER, "no ICD"))


def models() -> list[ModelInfo]:
    return [ModelInfo("digits", ModelState.READY, {"data": [1, 8, 8]}, {"prob": [10]}, [0], [],
                      queue_depth=4, in_flight=0, queue_limit=64, precision="fp32", error=None)]


def test_exposition_has_every_family():
    m = DaemonMetrics(snapshot, models)
    m.observe_request("digits", "vulkan:0", "ok", total=0.004, queue=0.001, execution=0.002,
                      batch_size=3)
    m.observe_request("digits", "cpu", "deadline_exceeded", total=0.5)
    for name in ("nosuch-1", "nosuch-2"):  # names clients made up: one series for all
        m.observe_request(name, "none", "not_found", total=0.001)
    m.rejected.labels("overloaded").inc()
    m.model_load_duration.labels("digits", "vulkan:0", "warm").observe(0.2)
    text = m.exposition().decode()
    for line in [
        'vkserve_requests_total{device="vulkan:0",model="digits",outcome="ok"} 1.0',
        'vkserve_requests_total{device="cpu",model="digits",outcome="deadline_exceeded"} 1.0',
        'vkserve_rejected_requests_total{reason="overloaded"} 1.0',
        'vkserve_queue_duration_seconds_count{model="digits"} 1.0',
        'vkserve_execution_duration_seconds_bucket{le="0.002",model="digits"} 1.0',
        'vkserve_request_duration_seconds_count{model="digits"} 2.0',
        'vkserve_request_batch_size_bucket{le="2.0",model="digits"} 0.0',
        'vkserve_request_batch_size_bucket{le="4.0",model="digits"} 1.0',
        'vkserve_request_batch_size_count{model="digits"} 1.0',
        'vkserve_model_load_duration_seconds_count{cache="warm",device="vulkan:0",model="digits"} 1.0',
        'vkserve_queued_requests{model="digits"} 4.0',
        'vkserve_queue_limit_requests{model="digits"} 64.0',
        'vkserve_in_flight_requests{device="vulkan:0"} 2.0',
        'vkserve_device_healthy{device="cpu"} 0.0',
        'vkserve_device_runs_total{device="vulkan:0",thread="worker"} 4.0',
        'vkserve_device_runs_total{device="vulkan:0",thread="loop"} 3.0',
        'vkserve_device_memory_budget_bytes{device="vulkan:0"} 4096.0',
        'vkserve_pipeline_cache_hits_total{device="vulkan:0",tier="pipeline"} 5.0',
        'vkserve_pipeline_cache_misses_total{device="vulkan:0",tier="pipeline"} 3.0',
        'vkserve_pipeline_compile_seconds_total{device="vulkan:0"} 1.5',
        'vkserve_gpu_unusable{node="/dev/dri/renderD129",reason="no_driver"} 1.0',
        'vkserve_model_ready{model="digits"} 1.0',
        'vkserve_requests_total{device="none",model="_unknown",outcome="not_found"} 2.0',
    ]:
        assert line in text, line
    # no `_created` series; build and process information
    assert "_created" not in text
    assert 'vkserve_build_info{python="' in text and "process_cpu_seconds_total" in text


def test_the_exposition_holds_exactly_the_defined_families():
    m = DaemonMetrics(snapshot, models)
    m.observe_request("digits", "vulkan:0", "ok", total=0.004, queue=0.001, execution=0.002,
                      batch_size=1)
    m.rejected.labels("overloaded").inc()
    m.model_load_duration.labels("digits", "vulkan:0", "cold").observe(0.2)
    exported = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        if family.name.startswith("vkserve_"):
            labels = {k for s in family.samples for k in s.labels if k != "le"}
            exported[family.name] = (family.type, labels)
    # the parser drops a counter's `_total` from the family name
    defined = {f.name.removesuffix("_total") if f.type is MetricType.COUNTER else f.name:
               (f.type.value, set(f.labels)) for f in FAMILIES}
    assert exported == defined


def test_family_names_follow_the_naming_guide():
    for f in FAMILIES:
        assert re.fullmatch(r"vkserve_[a-z0-9_]+", f.name), f.name
        assert f.name.endswith("_total") == (f.type is MetricType.COUNTER), f.name
        if f.type is MetricType.HISTOGRAM and f.name.endswith("_seconds"):
            assert f.name.endswith("_duration_seconds"), f.name
        assert not re.search(r"_(ms|milliseconds|kb|mb|percent)(_|$)", f.name), f.name
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


def test_readme_table_is_generated_from_the_definitions():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"<!-- metrics: python -m vkserve.daemon.metrics -->\n(.*?)\n<!-- /metrics -->",
                      readme, re.DOTALL)
    assert block is not None, "README.md lacks the metrics table markers"
    assert block.group(1) == markdown_table(), "README.md's metrics table is stale: " \
        "paste the output of `python -m vkserve.daemon.metrics`"


def test_route_and_listen_parsing():
    ready = lambda: (False, "digits: loading")  # noqa: E731
    assert route(b"GET /readyz HTTP/1.1\r\n\r\n", bytes, ready).startswith(b"HTTP/1.0 503")
    assert route(b"GET /healthz HTTP/1.1\r\n\r\n", bytes, ready).startswith(b"HTTP/1.0 200")
    assert route(b"POST /metrics HTTP/1.1\r\n\r\n", bytes, ready).startswith(b"HTTP/1.0 405")
    assert route(b"\xff\xfe\r\n\r\n", bytes, ready).startswith(b"HTTP/1.0 400")
    assert route(b"GET /nope HTTP/1.1\r\n\r\n", bytes, ready).startswith(b"HTTP/1.0 404")
    assert parse_listen("off") is None
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen("localhost")


async def http_get(port: int, path: str) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def test_metrics_listener_serves_scrapes():
    m = DaemonMetrics(snapshot, models)
    state = {"ready": False}
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, "127.0.0.1", 0, m.exposition,
                                   lambda: (state["ready"], "models loading"))
        body = await http_get(port, "/metrics")
        assert body.startswith(b"HTTP/1.0 200") and b"vkserve_queued_requests" in body
        assert (await http_get(port, "/readyz")).startswith(b"HTTP/1.0 503")
        state["ready"] = True
        assert (await http_get(port, "/readyz")).startswith(b"HTTP/1.0 200")
        nursery.cancel_scope.cancel()
