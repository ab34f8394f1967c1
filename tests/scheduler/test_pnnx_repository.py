"""A pnnx export dropped into the model repository as pnnx wrote it (no Input shape, no
config.toml [inputs]) loads, and serves requests of two different shapes on the CPU and on
lavapipe, each answer matching the ncnn package run on the same seeded weights and input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import trio

from tests.support.paths import PNNX_DIR
from vkserve.devices.reference import run_ncnn
from vkserve.models.graph import load_model
from vkserve.models.weights import write_bin
from vkserve.scheduler import ModelRepository, Scheduler, SchedulerConfig, discover_handles

SHAPES = [(3, 64, 64), (3, 48, 80)]


@pytest.mark.parametrize("devices", ["cpu", "gpu"])
async def test_a_shapeless_pnnx_export_serves_two_shapes_like_ncnn(tmp_path: Path, devices: str) -> None:
    folder = tmp_path / "repo" / "convnext"
    folder.mkdir(parents=True)
    shutil.copy(PNNX_DIR / "convnext_tiny.param", folder / "model.param")
    (folder / "config.toml").write_text(
        f'random_weights = true\nseed = 5\ndevices = "{devices}"\nprecision = "fp32"\n')
    handles, _ = discover_handles(use_vulkan=devices == "gpu", cache_dir=str(tmp_path / "cache"))
    sched = Scheduler(handles, SchedulerConfig(), ModelRepository(tmp_path / "repo"))
    answers: dict[tuple[int, ...], np.ndarray] = {}
    inputs = {s: np.random.default_rng(sum(s)).uniform(-1, 1, s).astype(np.float32) for s in SHAPES}
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        with trio.fail_after(120):
            await sched.wait_until(sched.ready)
            (info,) = sched.models()
            assert info.state == "ready", info.error
            assert info.inputs == {"in0": []}  # any shape
            for shape, data in inputs.items():
                result = await sched.infer("convnext", {"in0": data})
                ran_on = next(h for h in handles if h.index == result.device_index)
                assert ran_on.is_cpu == (devices == "cpu"), result.device
                answers[shape] = result.outputs["out0"]
        (placement,) = sched.models()[0].placements
        assert sorted(placement.shapes) == ["in0=3x48x80", "in0=3x64x64"]
        await sched.aclose(timeout=10)
    for shape, data in inputs.items():
        graph = load_model(folder / "model.param", None, {"in0": shape}, seed=5)
        write_bin(graph.layers, tmp_path / "model.bin")
        want = run_ncnn(folder / "model.param", tmp_path / "model.bin", {"in0": data}, ["out0"])["out0"]
        got = answers[shape]
        assert got.size == want.size
        want = want.reshape(got.shape)
        err = float(np.max(np.abs(got - want)))
        # bf16 storage on the CPU; fp32 on lavapipe
        assert err <= (3e-2 if devices == "cpu" else 1e-3) * float(np.max(np.abs(want))), (shape, err)
