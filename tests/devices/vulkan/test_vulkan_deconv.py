"""Deconvolution and DeconvolutionDepthWise through a Vulkan Plan against the ncnn package, in
fp32 and the engine's fp16 modes.

Each case (tests/support/deconv_cases.py: strides 1-3, dilation 1-2, symmetric and asymmetric
pads, output_pad, output_w / output_h with SAME_UPPER / SAME_LOWER, groups, bias on / off,
fused activations) is a one-layer .param with the models package's seeded random weights
(written to a .bin for ncnn); the output must match ncnn's within 1e-4 of the reference's max
abs in fp32 and 2e-2 in the fp16 modes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.deconv_cases import CASES, deconv_line
from tests.support.vulkan_engine import MODES, engine_device
from vkserve.devices.capabilities import Precision
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.graph import load_model
from vkserve.models.weights import write_bin

__all__ = ["engine_device"]  # the fixture, imported for pytest


def tolerance(precision: Precision) -> float:
    return 1e-4 if precision is Precision.FP32 else 2e-2


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_deconv(tmp_path: Path, engine_device, case, precision) -> None:
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text("7767517\n2 2\nInput data 0 1 data\n" + deconv_line(case) + "\n")
    shapes = {"data": case.shape}
    graph = load_model(param, None, shapes, seed=7)
    write_bin(graph.layers, bin_path)
    rng = np.random.default_rng(11)
    inputs = {"data": rng.uniform(-2.0, 2.0, size=case.shape).astype(np.float32)}
    ref = run_ncnn(param, bin_path, inputs, ["out"])["out"]
    with Plan(engine_device, graph, None, precision) as plan:
        got = plan.run(inputs)["out"]
    want = ref.reshape(got.shape)
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))  # NaN fails too
    assert err <= tolerance(precision) * scale + 1e-6, (err, scale)
