"""The Vulkan activation / element-wise math layers (activation.comp: TanH, AbsVal, ELU, SELU,
Mish, Softplus, GELU, Exp, Log, Power, Erf, Threshold; prelu.comp: PReLU) through a Plan,
against the ncnn package on the same (storage-rounded) inputs and weights.

1-D to 4-D blobs of awkward sizes (element counts not multiples of 4 or of the local size).
fp32 must match within float rounding of the transcendental functions; the fp16 modes within
fp16 rounding of the result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_activations import EDGE, LINES
from tests.support.vulkan_engine import MODES, engine_device, graph_of, storage_round
from vkserve.devices.capabilities import Precision
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.layers import Shape
from vkserve.models.weights import write_bin

__all__ = ["engine_device"]  # the fixture, imported for pytest

SHAPES: list[Shape] = [(7,), (5, 3), (7, 5, 3), (2, 13, 11), (3, 2, 5, 7)]


def check(device: VulkanDevice, tmp_path: Path, line: str | list[str], x: np.ndarray,
          precision: Precision) -> None:
    """One layer (or a chain ending in blob "out") from input blob "data"."""
    lines = [line] if isinstance(line, str) else line
    graph = graph_of(lines, {"data": x.shape})
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text(f"7767517\n{len(lines) + 1} {len(lines) + 1}\nInput data 0 1 data\n"
                     + "".join(f"{t}\n" for t in lines))
    write_bin(graph.layers, bin_path)
    rounded = storage_round(x, precision)
    want = run_ncnn(param, bin_path, {"data": rounded}, ["out"])["out"].reshape(x.shape)
    with Plan(device, graph, None, precision) as plan:
        got = plan.run({"data": x})["out"]
    assert got.shape == want.shape
    finite = np.abs(want[np.isfinite(want)])
    scale = max(float(finite.max(initial=0.0)), 1.0)
    if precision is Precision.FP32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * scale, err_msg=str(line))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=4e-3 * scale, err_msg=str(line))


def _rand(shape: Shape, lo: float, hi: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", LINES, ids=lambda c: c[0].replace(" op 1 1 data out", ""))
def test_activation(engine_device: VulkanDevice, tmp_path: Path,
                    case: tuple[str, tuple[float, float]], precision: Precision) -> None:
    line, (lo, hi) = case
    for i, shape in enumerate(SHAPES):
        check(engine_device, tmp_path, line, _rand(shape, lo, hi, i), precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("per_channel", [False, True])
def test_prelu(engine_device: VulkanDevice, tmp_path: Path, per_channel: bool,
               precision: Precision) -> None:
    for i, shape in enumerate(SHAPES):
        n = shape[0] if per_channel else 1
        check(engine_device, tmp_path, f"PReLU op 1 1 data out 0={n}",
              _rand(shape, -3.0, 3.0, i), precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", EDGE + [("Softplus op 1 1 data out", np.array([89.0, 100.0], np.float32))],
                         ids=lambda c: c[0].replace(" op 1 1 data out", "") + f"-{c[1].size}")
def test_activation_edge_values(engine_device: VulkanDevice, tmp_path: Path,
                                case: tuple[str, np.ndarray], precision: Precision) -> None:
    """Overflowing exp inside (Softplus gives inf like ncnn), signed zeros, powf's cases."""
    line, x = case
    check(engine_device, tmp_path, line, x, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_chain_in_place(engine_device: VulkanDevice, tmp_path: Path, precision: Precision) -> None:
    """Each layer's output may take over its dying input's bytes."""
    lines = ["TanH a 1 1 data t", "PReLU b 1 1 t u 0=5", "GELU c 1 1 u v", "ELU d 1 1 v w 0=0.5",
             "Exp e 1 1 w out 1=2.0"]
    check(engine_device, tmp_path, lines, _rand((5, 3, 7), -3.0, 3.0, 9), precision)
