"""Reduction, PixelShuffle, Reorg and GLU through a Vulkan Plan against the ncnn package, in fp32 and the engine's fp16
modes: every operation, every axes combination of 1-D..4-D blobs (and reduce_all, negative
axes, no axes), keepdims, coeff, and runs longer than the work group of 64.

Inputs keep each operation well conditioned (as the CPU test: sums over values of one sign
bias, logsum over positive values, prod over fp16-exact values near +-1); the output must match
ncnn's within 1e-4 of the reference's max abs in fp32 and 2e-2 in the fp16 modes.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from tests.support.vulkan_engine import MODES, engine_device
from vkserve.devices.capabilities import Precision
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.graph import load_model
from vkserve.models.weights import write_bin

__all__ = ["engine_device"]  # the fixture, imported for pytest

SHAPES = [(7,), (5, 9), (6, 5, 7), (3, 4, 5, 6)]
OPS = range(11)


def tolerance(precision: Precision) -> float:
    return 1e-4 if precision is Precision.FP32 else 2e-2


def reduction_input(op: int, shape: tuple[int, ...], seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if op == 6:
        mag = rng.uniform(0.85, 1.15, size=shape)
        x = (mag * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32)
        return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    if op == 9:
        return rng.uniform(0.1, 2.0, size=shape).astype(np.float32)
    return rng.uniform(-1.0, 2.0, size=shape).astype(np.float32)


def axes_cases(dims: int) -> list[str]:
    out = ["1=1", "1=0 5=1"]
    for n in range(1, dims + 1):
        for combo in itertools.combinations(range(dims), n):
            out.append(f"1=0 -23303={n}," + ",".join(map(str, combo)) + " 5=1")
    out.append("1=0 -23303=1,-1 5=1")
    return out


def check(tmp_path: Path, device: VulkanDevice, op: int, shape: tuple[int, ...], params: str,
          precision: Precision) -> None:
    check_line(tmp_path, device, f"Reduction op 1 1 data out 0={op} {params}", shape, precision,
               reduction_input(op, shape))


def check_line(tmp_path: Path, device: VulkanDevice, line: str, shape: tuple[int, ...],
               precision: Precision, x: np.ndarray | None = None) -> None:
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text("7767517\n2 2\nInput data 0 1 data\n" + line + "\n")
    graph = load_model(param, None, {"data": shape}, seed=7)
    write_bin(graph.layers, bin_path)
    if x is None:
        x = np.random.default_rng(5).uniform(-2.0, 2.0, size=shape).astype(np.float32)
    inputs = {"data": x}
    ref = run_ncnn(param, bin_path, inputs, ["out"])["out"]
    with Plan(device, graph, None, precision) as plan:
        got = plan.run(inputs)["out"]
    assert tuple(got.shape) == tuple(graph.blob_shapes["out"]) == tuple(ref.shape)
    want = ref.reshape(got.shape)
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))  # NaN fails too
    assert err <= tolerance(precision) * scale + 1e-6, (err, scale)


CASES = [(shape, axes, keep) for shape in SHAPES for axes in axes_cases(len(shape))
         for keep in (0, 1)]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, axes, keepdims", CASES, ids=str)
def test_reduction(tmp_path, engine_device, shape, axes, keepdims, op, precision):
    check(tmp_path, engine_device, op, shape, f"{axes} 4={keepdims}", precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("params", ["1=0 -23303=2,0,2 5=1 2=-0.5", "1=1 2=3.0 4=1"])
def test_reduction_coeff(tmp_path, engine_device, params, op, precision):
    check(tmp_path, engine_device, op, (4, 5, 6), params, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("op", [0, 3, 4, 8, 10])
@pytest.mark.parametrize("shape, params", [
    ((70, 33, 5), "1=0 -23303=2,0,1 5=1"),  # 2310-long strided runs
    ((70, 33, 5), "1=0 -23303=1,2 5=1"),  # many short runs
    ((3, 130, 7), "1=0 -23303=1,1 5=1 4=1"),
], ids=str)
def test_reduction_large(tmp_path, engine_device, shape, params, op, precision):
    check(tmp_path, engine_device, op, shape, params, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("r, shape", [(1, (3, 4, 5)), (2, (8, 3, 5)), (3, (18, 4, 3)),
                                      (2, (5, 3, 4)), (2, (4, 70, 33))], ids=str)
def test_pixelshuffle(tmp_path, engine_device, r, shape, mode, precision):
    check_line(tmp_path, engine_device, f"PixelShuffle op 1 1 data out 0={r} 1={mode}", shape,
               precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("s, shape", [(1, (3, 4, 5)), (2, (3, 4, 6)), (3, (2, 9, 6)),
                                      (2, (3, 5, 7)), (2, (5, 70, 66))], ids=str)
def test_reorg(tmp_path, engine_device, s, shape, mode, precision):
    check_line(tmp_path, engine_device, f"Reorg op 1 1 data out 0={s} 1={mode}", shape, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("line, shape", [
    ("PixelShuffle op 1 1 data out", (4, 3, 5)), ("Reorg op 1 1 data out", (3, 4, 5)),
    ("GLU op 1 1 data out", (4, 6)),
], ids=str)
def test_misc_defaults(tmp_path, engine_device, line, shape, precision):
    check_line(tmp_path, engine_device, line, shape, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape, axis", [
    ((8,), 0), ((8,), -1), ((4, 6), 0), ((4, 6), 1), ((4, 6), -2), ((6, 4, 6), 0), ((3, 4, 6), 1),
    ((3, 4, 6), 2), ((3, 4, 6), -1), ((2, 4, 6, 8), 0), ((3, 4, 6, 8), 1), ((3, 5, 6, 8), 2),
    ((3, 5, 6, 8), 3), ((3, 5, 6, 8), -1), ((64, 34, 70), 1),
], ids=str)
def test_glu(tmp_path, engine_device, shape, axis, precision):
    check_line(tmp_path, engine_device, f"GLU op 1 1 data out 0={axis}", shape, precision)


TILE_SHAPES = [(5,), (3, 4), (2, 3, 4), (2, 3, 4, 5)]
TILE_PARAMS = ["", "0=0 1=3", "1=2", "-23302=1,2", "-23302=2,2,3", "-23302=3,1,2,3",
               "-23302=4,2,1,1,2", "-23302=4,2,3,1,2", "-23302=4,1,1,2,1", "0=0 1=2 -23302=1,3"]
TILE_CASES = ([(s, p) for s in TILE_SHAPES for p in TILE_PARAMS]
              + [(s, f"0={a} 1=3") for s in TILE_SHAPES for a in range(1, len(s))]
              + [((3, 70, 33), "-23302=2,40,3")])


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape, params", TILE_CASES, ids=str)
def test_tile(tmp_path, engine_device, shape, params, precision):
    check_line(tmp_path, engine_device, f"Tile op 1 1 data out {params}", shape, precision)
