"""ArgMax, Cast, Normalize, MVN and Embed through a Vulkan Plan against the ncnn package (ArgMax
against ncnn's definition: the package is built without it), in fp32 and the engine's fp16
modes, on the CPU tests' cases. Inputs ncnn reads by their bits (Cast from narrow types,
Embed's int32 ids) are fed to ncnn packed and to the engine as the values they stand for.

The output must match within 1e-4 of the reference's max abs in fp32 and 2e-2 in the fp16
modes; ArgMax exactly (its inputs are fp16-exact).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_vector_ops import NORMALIZE, SHAPES, argmax_reference, packed, rand
from tests.support.params import param_text
from tests.support.vulkan_engine import MODES, engine_device, tolerance
from vkserve.devices.capabilities import Precision
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan, PlanError
from vkserve.models.graph import load_model
from vkserve.models.weights import write_bin

__all__ = ["engine_device"]  # the fixture, imported for pytest


def run_both(tmp_path: Path, device: VulkanDevice, lines: list[str], ours: np.ndarray,
             theirs: np.ndarray, precision: Precision) -> tuple[np.ndarray, np.ndarray]:
    """(the Plan's output for input ``ours``, ncnn's for ``theirs``)."""
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text(param_text(["x"], lines))
    graph = load_model(param, None, {"x": ours.shape}, seed=7)
    write_bin(graph.layers, bin_path)
    ref = run_ncnn(param, bin_path, {"x": theirs}, ["out"])["out"]
    with Plan(device, graph, None, precision) as plan:
        got = plan.run({"x": ours})["out"]
    assert got.shape == graph.blob_shapes["out"]
    return got, ref.reshape(got.shape)


def check(tmp_path: Path, device: VulkanDevice, lines: list[str], x: np.ndarray,
          precision: Precision, theirs: np.ndarray | None = None) -> None:
    got, want = run_both(tmp_path, device, lines, x, x if theirs is None else theirs, precision)
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))  # NaN fails too
    assert err <= tolerance(precision) * scale + 1e-6, (err, scale)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_argmax(engine_device: VulkanDevice, tmp_path: Path, precision: Precision) -> None:
    """Ties (values on a coarse grid) go to the larger index; runs longer than the group."""
    for shape, topk, out_max_val in (((37,), 1, 0), ((6, 11), 5, 1), ((4, 5, 8), 7, 0),
                                     ((3, 2, 5, 8), 1, 1), ((1000,), 3, 1)):
        x = (np.random.default_rng(topk).integers(-20, 20, shape) / 4).astype(np.float32)
        param = tmp_path / "case.param"
        param.write_text(param_text(["x"], [f"ArgMax a 1 1 x out 0={out_max_val} 1={topk}"]))
        graph = load_model(param, None, {"x": shape})
        with Plan(engine_device, graph, None, precision) as plan:
            got = plan.run({"x": x})["out"]
        np.testing.assert_array_equal(got, argmax_reference(x, topk, out_max_val))


def test_argmax_past_fp16_integers_is_refused(engine_device: VulkanDevice, tmp_path: Path) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], ["ArgMax a 1 1 x out"]))
    graph = load_model(param, None, {"x": (3000,)})
    with pytest.raises(PlanError, match="up to 2048"):
        Plan(engine_device, graph, None, Precision.FP16_STORAGE)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_cast(engine_device: VulkanDevice, tmp_path: Path, precision: Precision) -> None:
    """To float16, to float16 and back, through bfloat16, and to the same type."""
    for i, shape in enumerate(SHAPES):
        x = rand(shape, i, -300.0, 300.0)
        check(tmp_path, engine_device, ["Cast c 1 1 x out 0=1 1=2"], x, precision)
        check(tmp_path, engine_device, ["Cast c 1 1 x y 0=1 1=2", "Cast d 1 1 y out 0=2 1=1"], x,
              precision)
        check(tmp_path, engine_device, ["Cast c 1 1 x y 0=1 1=4", "Cast d 1 1 y out 0=4 1=1"], x,
              precision)
        check(tmp_path, engine_device, ["Cast c 1 1 x out 0=1 1=1"], x, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_cast_from_narrow_types(engine_device: VulkanDevice, tmp_path: Path,
                                precision: Precision) -> None:
    rng = np.random.default_rng(3)
    for shape in SHAPES:
        for type_from, narrow in ((2, rng.uniform(-50, 50, shape).astype(np.float16)),
                                  (3, rng.integers(-128, 128, shape).astype(np.int8))):
            check(tmp_path, engine_device, [f"Cast c 1 1 x out 0={type_from} 1=1"],
                  narrow.astype(np.float32), precision, theirs=packed(narrow, shape))


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_normalize(engine_device: VulkanDevice, tmp_path: Path, precision: Precision) -> None:
    for k, params in enumerate(NORMALIZE):
        shape = SHAPES[k % len(SHAPES)]
        size = 1 if "1=1" in params.split() else (shape[0] if len(shape) >= 3 else 1)
        check(tmp_path, engine_device, [f"Normalize n 1 1 x out {params} 3={size} 2=0.001"],
              rand(shape, k), precision)
    for eps_mode in (0, 1, 2):  # a large eps: each mode's formula shows
        check(tmp_path, engine_device,
              [f"Normalize n 1 1 x out 0=0 4=1 1=0 3=2 2=1.5 9={eps_mode}"],
              rand((2, 4, 5), 9, -0.8, 0.8), precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_mvn(engine_device: VulkanDevice, tmp_path: Path, precision: Precision) -> None:
    for params in ("0=0 1=0", "0=1 1=0", "0=0 1=1", "0=1 1=1 2=0.01"):
        for i, shape in enumerate(SHAPES + [(3, 300)]):
            check(tmp_path, engine_device, [f"MVN m 1 1 x out {params}"],
                  rand(shape, i, -1.0, 3.0), precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_embed(engine_device: VulkanDevice, tmp_path: Path, precision: Precision) -> None:
    """Ids in range, negative and past input_dim (clamped as ncnn); a 2-D input's first row."""
    for bias in (0, 1):
        for shape in ((9,), (2, 9)):
            ids = np.random.default_rng(bias).integers(-3, 60, shape).astype(np.int32)
            ids.ravel()[:3] = (0, 49, 257)
            check(tmp_path, engine_device, [f"Embed e 1 1 x out 0=6 1=50 2={bias} 3=300"],
                  ids.astype(np.float32), precision, theirs=ids.view(np.float32))


def test_embed_vocabulary_past_fp16_integers_is_refused(engine_device: VulkanDevice,
                                                         tmp_path: Path) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], ["Embed e 1 1 x out 0=4 1=3000 3=12000"]))
    graph = load_model(param, None, {"x": (5,)})
    with pytest.raises(PlanError, match="input_dim 3000"):
        Plan(engine_device, graph, None, Precision.FP16_STORAGE)


def test_cast_to_float16_rounds_to_nearest_even_on_every_driver(engine_device: VulkanDevice,
                                                                 tmp_path: Path) -> None:
    """float16's edges, exactly as IEEE rounding (numpy's) gives them: ties to even, subnormals,
    the largest value, rounding to infinity (GLSL leaves packHalf2x16's rounding to the driver)."""
    edges = np.array([1 + 2**-11, 1 + 3 * 2**-11, 2049, 2051, 3e-8, 6e-8, 1e-5, 2**-14 - 2**-25,
                      65504, 65519, 65520, 1e5, -1 - 2**-11, -3e-8, 0.1, -0.3], np.float32)
    param = tmp_path / "cast.param"
    param.write_text(param_text({"x": edges.shape}, ["Cast c 1 1 x out 0=1 1=2"]))
    graph = load_model(param, None, {"x": edges.shape})
    with Plan(engine_device, graph, None, Precision.FP32) as plan:
        got = plan.run({"x": edges})["out"]
    with np.errstate(over="ignore"):  # 65520 and 1e5 round to infinity, as intended
        want = edges.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, want)
