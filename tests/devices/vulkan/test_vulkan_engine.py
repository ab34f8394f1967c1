"""The Vulkan executor: recorded command buffers replayed with fresh inputs, several instances
in flight, the arena and pool bookkeeping, flat memory over 10,000 inferences, the CPU tail,
error reporting, warm-cache loads and the CLI (lavapipe in CI).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.support.vulkan_engine import MODES, cpu_forward, engine_device, graph_of, storage_round
from vkserve.cli.main import main as cli_main
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.cpu.executor import Plan as CpuPlan
from vkserve.devices.reference import compare
from vkserve.devices.vulkan.context import LIVE_OBJECTS, MemoryKind
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine import load_plan
from vkserve.devices.vulkan.engine.plan import Plan, PlanError, engine_precision
from vkserve.devices.vulkan.engine.pool import MemoryPool, PoolExhausted, size_class
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS
from vkserve.models.graph import Graph

__all__ = ["engine_device"]  # the fixture, imported for pytest

# A small graph of the engine's own layers: branches, aliases, in-place chains, copies, a
# blob read by two layers, a per-channel broadcast from a second input.
GRAPH = [
    "ReLU relu 1 1 x a 0=0.1",
    "Split split 1 3 a a1 a2 a3",
    "Sigmoid sig 1 1 a1 b",
    "BinaryOp add 2 1 b a2 c 0=0",
    "Permute perm 1 1 c d 0=3",
    "Reshape reshape 1 1 d e 0=15 1=6",
    "Slice slice 1 2 e f g -23300=2,2,-233 1=0",
    "Concat concat 2 1 g f h 0=0",
    "Split split2 1 2 h h1 h2",
    "Eltwise sum 3 1 h1 h2 e y 0=1 -23301=3,1.0,0.5,-2.0",
    "ShuffleChannel shuffle 1 1 a3 j 0=2",
    "HardSwish hswish 1 1 j k 0=0.2 1=0.5",
    "BinaryOp scale 2 1 k z w 0=2",
]
SHAPES = {"x": (6, 3, 5), "z": (6,)}


def small_graph() -> Graph:
    return graph_of(GRAPH, SHAPES)


def inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(-2, 2, shape).astype(np.float32) for name, shape in SHAPES.items()}


def expected(graph: Graph, feed: dict[str, np.ndarray], precision: Precision) -> dict[str, np.ndarray]:
    return cpu_forward(graph, {k: storage_round(v, precision) for k, v in feed.items()})


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], precision: Precision) -> None:
    for name, value in got.items():
        tol = 1e-5 if precision is Precision.FP32 else 2e-2
        scale = max(float(np.abs(want[name]).max()), 1.0)
        np.testing.assert_allclose(value, want[name], rtol=tol, atol=tol * scale, err_msg=name)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_graph_matches_the_cpu_executor(engine_device: VulkanDevice, precision: Precision) -> None:
    graph = small_graph()
    feed = inputs(0)
    with Plan(engine_device, graph, None, precision) as plan:
        got = plan.run(feed)
        summary = plan.summary()
    ref = CpuPlan(graph).run(feed)  # the bf16 CPU engine
    for name in graph.output_names:
        report = compare(name, got[name], ref[name])
        assert report.ok, report
    assert_close(got, expected(graph, feed, precision), precision)
    assert plan.arena_bytes < plan.naive_bytes
    # the two branches have independent dispatches, so not every dispatch needs a barrier
    assert summary["barriers"] < summary["dispatches"]


def test_replay_with_new_inputs_gives_new_outputs(engine_device: VulkanDevice) -> None:
    graph = small_graph()
    with Plan(engine_device, graph, None, Precision.FP32, max_instances=1) as plan:
        results = []
        for seed in (1, 2, 1, 3):
            feed = inputs(seed)
            got = plan.run(feed)
            assert_close(got, expected(graph, feed, Precision.FP32), Precision.FP32)
            results.append(got)
    assert not np.allclose(results[0]["y"], results[1]["y"])
    np.testing.assert_array_equal(results[0]["y"], results[2]["y"])


def test_two_instances_in_flight_each_get_their_own_answer(engine_device: VulkanDevice) -> None:
    graph = small_graph()
    with Plan(engine_device, graph, None, Precision.FP16_ARITHMETIC) as plan:
        first, second = plan.acquire(), plan.acquire()
        assert first is not second and first.arena is not second.arena
        with first, second:
            feeds = [inputs(10), inputs(11)]
            first.start(feeds[0])
            second.start(feeds[1])  # both submitted before either is waited for
            out2 = second.finish()
            out1 = first.finish()
        assert_close(out1, expected(graph, feeds[0], Precision.FP16_ARITHMETIC),
                     Precision.FP16_ARITHMETIC)
        assert_close(out2, expected(graph, feeds[1], Precision.FP16_ARITHMETIC),
                     Precision.FP16_ARITHMETIC)


def test_threads_share_a_plan(engine_device: VulkanDevice) -> None:
    graph = small_graph()
    errors: list[str] = []
    with Plan(engine_device, graph, None, Precision.FP32, max_instances=2) as plan:

        def worker(seed: int) -> None:
            feed = inputs(seed)
            want = expected(graph, feed, Precision.FP32)
            for _ in range(50):
                got = plan.run(feed)
                if not np.allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5):
                    errors.append(f"thread {seed}: wrong answer")
                    return

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors


def test_memory_stays_flat_over_10000_inferences(engine_device: VulkanDevice) -> None:
    graph = graph_of(["ReLU r 1 1 x a", "BinaryOp m 1 1 a y 0=2 1=1 2=2.0"], {"x": (5,)})
    pool = engine_device.pool
    x = np.arange(-2, 3, dtype=np.float32)
    want = np.maximum(x, 0) * 2
    with Plan(engine_device, graph, None, Precision.FP32, max_instances=2) as plan:
        np.testing.assert_array_equal(plan.run({"x": x})["y"], want)
        memory, held = LIVE_OBJECTS["VkDeviceMemory"], pool.held_bytes
        allocations = pool.allocations
        for i in range(10_000):
            if i % 2:
                with plan.acquire() as a, plan.acquire() as b:  # two instances in turn
                    a.start({"x": x})
                    b.start({"x": -x})
                    b.finish()
                    got = a.finish()["y"]
            else:
                got = plan.run({"x": x})["y"]
            if i % 1000 == 0:
                np.testing.assert_array_equal(got, want)
                assert LIVE_OBJECTS["VkDeviceMemory"] <= memory + 2  # at most the 2nd arena
        after = LIVE_OBJECTS["VkDeviceMemory"]
        assert after <= memory + 2 and pool.held_bytes <= held + 2 * size_class(plan.arena_bytes)
    # a new plan of the same shapes reuses the idle buffers: no new allocation at all
    grown = pool.allocations
    with Plan(engine_device, graph, None, Precision.FP32) as plan:
        plan.run({"x": x})
    assert pool.allocations == grown and grown <= allocations + 2
    assert LIVE_OBJECTS["VkDeviceMemory"] == after


def test_size_classes() -> None:
    assert size_class(1) == size_class(4096) == 4096
    assert [size_class(n) for n in (4097, 5121, 6145, 7169, 8192, 8193)] == \
        [5120, 6144, 7168, 8192, 8192, 10240]
    for n in range(1, 200_000, 997):
        assert n <= size_class(n) <= max(4096, n * 5 // 4 + 1)


def test_pool_recycles_evicts_and_reclaims(engine_device: VulkanDevice) -> None:
    pool = MemoryPool(engine_device.ctx, budget_bytes=18432)
    try:
        a = pool.acquire(8000, MemoryKind.DEVICE)
        pool.release(a)
        assert pool.acquire(7500, MemoryKind.DEVICE) is a  # same class: reused
        b = pool.acquire(100, MemoryKind.HOST)
        pool.release(b)
        # 8192 busy + 4096 idle: another 8192 fits only after evicting the idle one
        c = pool.acquire(8192, MemoryKind.DEVICE)
        assert pool.stats()["evictions"] == 1 and pool.held_bytes == 2 * 8192
        with pytest.raises(PoolExhausted):
            pool.acquire(10240, MemoryKind.DEVICE)
        held = [c]
        pool.add_reclaimer(lambda: pool.release(held.pop()) if held else None)
        d = pool.acquire(10240, MemoryKind.DEVICE)  # the reclaimer gives c back, then it goes
        assert not held and pool.held_bytes == 8192 + 10240
        with pytest.raises(ValueError):
            pool.release(c)  # evicted, no longer the pool's
        for buf in (a, d):
            pool.release(buf)
    finally:
        pool.close()
    assert pool.held_bytes == 0


def test_host_tail_runs_detection_after_the_vulkan_part(engine_device: VulkanDevice) -> None:
    lines = ["Sigmoid s 1 1 x p",
             "Yolov3DetectionOutput det 1 1 p out 0=2 1=1 2=0.3 3=0.45 -23304=2,10.0,14.0 "
             "-23305=1,0.0 -23306=1,32.0"]
    graph = graph_of(lines, {"x": (7, 4, 5)})
    x = np.random.default_rng(5).uniform(-3, 3, (7, 4, 5)).astype(np.float32)
    with Plan(engine_device, graph, None, Precision.FP32) as plan:
        got = plan.run({"x": x})
        assert plan.summary()["host_tail"] == ["det"] and plan.summary()["dispatches"] == 1
    want = cpu_forward(graph, {"x": x})["out"]
    assert len(want) > 0
    np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5)


def test_unsupported_layers_are_named_together(engine_device: VulkanDevice,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    graph = small_graph()
    for name in ("Sigmoid", "Permute"):
        monkeypatch.delitem(VULKAN_LAYERS, name)
    with pytest.raises(PlanError) as info:
        Plan(engine_device, graph, None, Precision.FP32)
    message = str(info.value)
    assert "Permute (perm)" in message and "Sigmoid (sig)" in message


def test_wrong_inputs_are_refused(engine_device: VulkanDevice) -> None:
    graph = small_graph()
    with Plan(engine_device, graph, None, Precision.FP32) as plan:
        with pytest.raises(ValueError, match="shape"):
            plan.run({"x": np.zeros((3, 5, 6), np.float32), "z": np.zeros(6, np.float32)})
        with pytest.raises(ValueError, match="missing input 'z'"):
            plan.run({"x": np.zeros(SHAPES["x"], np.float32)})
        feed = inputs(4)  # the refused runs left the plan usable
        assert_close(plan.run(feed), expected(graph, feed, Precision.FP32), Precision.FP32)


def test_fp16_means_arithmetic_where_available(vulkan_caps: DeviceCaps) -> None:
    assert engine_precision(vulkan_caps, "fp32") is Precision.FP32
    want = Precision.FP16_ARITHMETIC if vulkan_caps.fp16_arithmetic else Precision.FP16_STORAGE
    assert engine_precision(vulkan_caps, "fp16") is want


def test_warm_cache_compiles_nothing(vulkan_caps: DeviceCaps, tmp_path: Path) -> None:
    graph = small_graph()
    shapes = dict(SHAPES)
    with load_plan(graph, vulkan_caps.index, "fp32", shapes, cache_dir=tmp_path) as cold:
        assert cold.glsl_compiles > 0
        cold_out = cold.plan.run(inputs(0))
    with load_plan(graph, vulkan_caps.index, "fp32", shapes, cache_dir=tmp_path) as warm:
        assert warm.glsl_compiles == 0
        np.testing.assert_array_equal(warm.plan.run(inputs(0))["y"], cold_out["y"])


def test_run_and_verify_cli(vulkan_caps: DeviceCaps, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    param = tmp_path / "model.param"
    body = ["Input data 0 1 data 0=7 1=5 2=3", "ReLU r 1 1 data a 0=0.1",
            "Split sp 1 2 a a1 a2", "Swish s 1 1 a1 b", "Concat c 2 1 b a2 out 0=0"]
    param.write_text(f"7767517\n{len(body)} 6\n" + "\n".join(body) + "\n")
    args = ["run", str(param), "--device", str(vulkan_caps.index), "--precision", "fp16",
            "--random-input", "--repeat", "2", "--json", "--cache-dir", str(tmp_path / "cache")]
    assert cli_main(args) == 0
    cold = json.loads(capsys.readouterr().out)
    assert cli_main(args) == 0
    warm = json.loads(capsys.readouterr().out)
    assert cold["glsl_compiles"] > 0 and warm["glsl_compiles"] == 0
    assert cold["device"] == f"vulkan:{vulkan_caps.index}" and cold["precision"] in ("fp16sa", "fp16s")
    assert cold["outputs"] == [{"name": "out", "shape": [6, 5, 7]}]
    assert warm["load_seconds"] > 0 and warm["arena_bytes"] < warm["naive_bytes"]
    for precision in ("fp32", "fp16"):
        rc = cli_main(["verify", str(param), "--device", str(vulkan_caps.index), "--precision",
                       precision, "--json", "--cache-dir", str(tmp_path / "cache")])
        report = json.loads(capsys.readouterr().out)
        assert rc == 0 and report["ok"], report
