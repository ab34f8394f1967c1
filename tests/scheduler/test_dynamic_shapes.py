"""Dynamic input shapes: a model whose Input declares no shape (as pnnx writes it) serves any
shape its graph takes, with a Plan set per shape built on first use, kept in a bounded LRU per
(model, device), bounded by config.toml's min/max; bad shapes are BAD_REQUEST naming the layer.
Real engines (the CPU, and lavapipe for the pipeline-cache check)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from tests.support.scheduler import serving
from vkserve.devices.cpu.executor import Plan
from vkserve.models.graph import Graph, load_model
from vkserve.models.weights import write_random_bin
from vkserve.scheduler import (
    BadInput,
    DeviceHandle,
    Scheduler,
    discover_handles,
)
from vkserve.scheduler import core as scheduler_core

# fully convolutional, no Input shape: any (3, h, w) with h, w >= 3 runs
FCN = ("7767517\n3 3\n"
       "Input in 0 1 data\n"
       "Convolution conv 1 1 data c 0=4 1=3 4=1 5=1 6=108\n"
       "ReLU relu 1 1 c out\n")


def write_fcn(repo: Path, config: str | None = None) -> Path:
    folder = repo / "fcn"
    folder.mkdir(parents=True)
    (folder / "model.param").write_text(FCN)
    write_random_bin(folder / "model.param", folder / "model.bin", seed=4)
    if config is not None:
        (folder / "config.toml").write_text(config)
    return folder


def x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def reference(folder: Path, data: np.ndarray) -> np.ndarray:
    graph = load_model(folder / "model.param", folder / "model.bin", {"data": data.shape})
    return Plan(graph).run({"data": data})["out"]


def built(sched: Scheduler, device: int = 0) -> list[str]:
    (info,) = sched.models()
    return next(p.shapes for p in info.placements if p.device == device)


async def test_a_shapeless_model_serves_every_shape_and_builds_each_once(tmp_path: Path) -> None:
    folder = write_fcn(tmp_path)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        (info,) = sched.models()
        assert info.state == "ready" and info.inputs == {"data": []} and built(sched) == []
        for shape in [(3, 8, 8), (3, 5, 11), (3, 8, 8), (3, 3, 3)]:
            data = x(shape, seed=sum(shape))
            result = await sched.infer("fcn", {"data": data})
            assert result.outputs["out"].shape == (4, *shape[1:])
            np.testing.assert_array_equal(result.outputs["out"], reference(folder, data))
        assert sorted(built(sched)) == ["data=3x3x3", "data=3x5x11", "data=3x8x8"]


async def test_shapes_the_graph_cannot_take_are_bad_request_naming_the_layer(tmp_path: Path) -> None:
    write_fcn(tmp_path)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        with pytest.raises(BadInput, match=r"input shapes data=4x8x8: .*layer 'conv' Convolution"):
            await sched.infer("fcn", {"data": x((4, 8, 8))})
        with pytest.raises(BadInput, match=r"input 'data': shape \[3, 8, 8, 8, 8\]: expected 1 to 4"):
            await sched.infer("fcn", {"data": x((3, 8, 8, 8, 8))})
        result = await sched.infer("fcn", {"data": x((3, 8, 8))})  # still serving
        assert result.outputs["out"].shape == (4, 8, 8) and built(sched) == ["data=3x8x8"]


async def test_min_and_max_bound_each_dimension(tmp_path: Path) -> None:
    write_fcn(tmp_path, "[inputs.data]\nmin = [3, 4, 4]\nmax = [3, 16, 16]\n")
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        assert sched.models()[0].inputs == {"data": [3, -1, -1]}
        with pytest.raises(BadInput, match=r"shape \[3, 20, 8\] is outside the model's max \[3, 16, 16\]"):
            await sched.infer("fcn", {"data": x((3, 20, 8))})
        with pytest.raises(BadInput, match=r"outside the model's min \[3, 4, 4\]"):
            await sched.infer("fcn", {"data": x((3, 3, 8))})
        await sched.infer("fcn", {"data": x((3, 16, 4))})
        assert built(sched) == ["data=3x16x4"]


async def test_shapes_named_in_config_are_built_and_warmed_at_load(tmp_path: Path) -> None:
    write_fcn(tmp_path, "warmup = 2\n[inputs.data]\nshapes = [[3, 8, 8], [3, 6, 10]]\n")
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        placement = sched.models()[0].placements[0]
        assert placement.shapes == ["data=3x8x8", "data=3x6x10"]
        assert placement.latency_ms is not None  # warmed: latency measured before any job
        assert sched.models()[0].outputs == {"out": [4, -1, -1]}


async def test_the_plan_cache_evicts_the_least_recently_used_shape(tmp_path: Path) -> None:
    folder = write_fcn(tmp_path, "plan_cache_shapes = 2\n")
    a, b, c = x((3, 8, 8), 1), x((3, 9, 9), 2), x((3, 10, 10), 3)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        for data in (a, b, a, c):  # b is the least recently used when c arrives
            await sched.infer("fcn", {"data": data})
        assert sorted(built(sched)) == ["data=3x10x10", "data=3x8x8"]
        result = await sched.infer("fcn", {"data": b})  # rebuilt on demand; evicts a
        np.testing.assert_array_equal(result.outputs["out"], reference(folder, b))
        assert sorted(built(sched)) == ["data=3x10x10", "data=3x9x9"]


async def test_a_new_shape_waits_for_its_build_while_other_shapes_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build of 3x9x9 is held (an injected slow compile); jobs of the built shape keep
    completing meanwhile, then the held job completes once its Plans exist."""
    folder = write_fcn(tmp_path, "[inputs.data]\nshapes = [[3, 8, 8]]\n")
    release = threading.Event()
    load = scheduler_core.load_executors

    def slow_for_9x9(device: DeviceHandle, graph: Graph, *args: Any) -> Any:
        if graph.blob_shapes["data"] == (3, 9, 9):
            assert release.wait(20), "the test never released the build"
        return load(device, graph, *args)

    monkeypatch.setattr(scheduler_core, "load_executors", slow_for_9x9)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        got: dict[str, np.ndarray] = {}

        async def new_shape() -> None:
            got["new"] = (await sched.infer("fcn", {"data": x((3, 9, 9))})).outputs["out"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(new_shape)
            for i in range(5):
                result = await sched.infer("fcn", {"data": x((3, 8, 8), i)})
                np.testing.assert_array_equal(result.outputs["out"], reference(folder, x((3, 8, 8), i)))
            assert "new" not in got and sched.models()[0].queue_depth == 1
            release.set()
        np.testing.assert_array_equal(got["new"], reference(folder, x((3, 9, 9))))


async def test_lavapipe_rebuilds_an_evicted_shape_without_compiling_glsl(tmp_path: Path) -> None:
    handles, _ = discover_handles(use_vulkan=True, cache_dir=str(tmp_path / "cache"))
    gpus = [h for h in handles if not h.is_cpu]
    assert gpus, "lavapipe expected"
    repo = tmp_path / "repo"
    folder = write_fcn(repo, 'precision = "fp32"\ndevices = "gpu"\nplan_cache_shapes = 1\n')
    gpu = gpus[0]
    async with serving([gpu], repo) as sched:
        a, b = x((3, 8, 8), 1), x((3, 7, 12), 2)
        for data in (a, b):
            result = await sched.infer("fcn", {"data": data})
            np.testing.assert_allclose(result.outputs["out"], reference(folder, data), rtol=2e-2, atol=2e-2)
        assert built(sched, gpu.index) == ["data=3x7x12"]  # a was evicted
        compiles = gpu.glsl_compiles()
        result = await sched.infer("fcn", {"data": a})
        np.testing.assert_allclose(result.outputs["out"], reference(folder, a), rtol=2e-2, atol=2e-2)
        assert built(sched, gpu.index) == ["data=3x8x8"]
        assert gpu.glsl_compiles() == compiles  # SPIR-V and pipelines came from the cache
