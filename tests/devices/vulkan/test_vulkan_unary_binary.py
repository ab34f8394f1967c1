"""UnaryOp, BinaryOp and Clip through a Vulkan Plan against the ncnn package, in fp32 and the
engine's fp16 modes, on the CPU tests' inputs (inside each op's domain; exact in fp16, with
the ties of round and no rounding edges for fmod / remainder / floor_divide): every op, the
with_scalar form, every broadcast form of 1-D..4-D operand pairs; Clip over every rank.

The output must match ncnn's within 1e-4 of the reference's max abs in fp32 and 2e-2 in the
fp16 modes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_unary_binary import (
    BROADCASTS,
    ROUNDING,
    UNARY_SHAPES,
    binary_inputs,
    binary_values,
    unary_input,
)
from tests.support.params import param_text
from tests.support.vulkan_engine import MODES, engine_device, tolerance
from vkserve.devices.capabilities import Precision
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.graph import load_model
from vkserve.models.layers import BINARY_OPS, UNARY_OPS
from vkserve.models.weights import write_bin

__all__ = ["engine_device"]  # the fixture, imported for pytest


def check(tmp_path: Path, device: VulkanDevice, line: str, inputs: dict[str, np.ndarray],
          precision: Precision, exact: bool = False) -> None:
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text(param_text(inputs, [line]))
    graph = load_model(param, None, {k: v.shape for k, v in inputs.items()}, seed=7)
    write_bin(graph.layers, bin_path)
    ref = run_ncnn(param, bin_path, inputs, ["out"])["out"]
    with Plan(device, graph, None, precision) as plan:
        got = plan.run(inputs)["out"]
    assert got.shape == graph.blob_shapes["out"]
    want = ref.reshape(got.shape)
    if exact:
        np.testing.assert_array_equal(got, want)
        return
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))  # NaN fails too
    assert err <= tolerance(precision) * scale + 1e-6, (err, scale)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("op", sorted(UNARY_OPS), ids=lambda op: UNARY_OPS[op])
def test_unaryop(engine_device: VulkanDevice, tmp_path: Path, op: int, precision: Precision) -> None:
    shape = UNARY_SHAPES[op % len(UNARY_SHAPES)]
    check(tmp_path, engine_device, f"UnaryOp u 1 1 x out 0={op}", {"x": unary_input(op, shape)},
          precision, exact=op in ROUNDING)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("op", sorted(BINARY_OPS), ids=lambda op: BINARY_OPS[op])
def test_binaryop(engine_device: VulkanDevice, tmp_path: Path, op: int, precision: Precision) -> None:
    check(tmp_path, engine_device, f"BinaryOp b 2 1 a b out 0={op}",
          binary_inputs(op, (3, 4, 5), (3, 4, 5)), precision)
    check(tmp_path, engine_device, f"BinaryOp b 2 1 a b out 0={op}",
          binary_inputs(op, (3, 4, 5), (3, 1, 5)), precision)
    scalar = "1.25" if op in (6, 9) else "-1.1875" if op in (13, 16, 18) else "-1.25"
    x = binary_values(op, (2, 3, 2, 5), op, divisor=op in (13, 16, 18))
    check(tmp_path, engine_device, f"BinaryOp b 1 1 a out 0={op} 1=1 2={scalar}", {"a": x},
          precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_binaryop_broadcast(engine_device: VulkanDevice, tmp_path: Path, precision: Precision) -> None:
    for i, shapes in enumerate(BROADCASTS):
        op = (1, 11)[i % 2]  # sub and ratan2: asymmetric, so swapped operands would show
        check(tmp_path, engine_device, f"BinaryOp b 2 1 a b out 0={op}",
              binary_inputs(op, *shapes, seed=i), precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_clip_every_rank(engine_device: VulkanDevice, tmp_path: Path, precision: Precision) -> None:
    """Bounds given, one side, and min > max (max wins, as ncnn)."""
    for i, (shape, params) in enumerate(zip(UNARY_SHAPES, ["0=-0.5 1=0.7", "0=0.25", "1=-0.25",
                                                           "0=1.0 1=-1.0"])):
        x = np.random.default_rng(i).uniform(-2, 2, shape).astype(np.float32)
        check(tmp_path, engine_device, f"Clip c 1 1 x out {params}", {"x": x}, precision)
