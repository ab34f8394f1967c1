"""MultiHeadAttention through a Vulkan Plan against the ncnn package, in fp32 and the fp16
modes: the CPU test's cases (1, 2, 3 inputs, shared and per-head masks, kdim / vdim / qdim
apart from embed_dim, head counts, odd sequence lengths, the scale param, a 1-D query), a
causal mask of -inf / -1e9 (in fp16 storage -1e9 becomes -inf too) and vit_tiny's size (197 tokens: softmax rows longer than a work group). The output must match
ncnn's within 1e-4 of the reference's max abs in fp32 and 2e-2 in the fp16 modes.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_attention import (
    CASES,
    CAUSAL_LINE,
    CAUSAL_SHAPES,
    causal_inputs,
    line_for,
)
from tests.support.params import param_text
from tests.support.vulkan_engine import MODES, check_against_ncnn, engine_device, tolerance
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.graph import load_model
from vkserve.models.weights import write_bin

__all__ = ["engine_device"]  # the fixture, imported for pytest

VIT = ("0=192 1=3 2=36864 3=192 4=192", {"q": (197, 192)})
# a long masked cross-attention: softmax rows of 70 (cooperative), per-head mask
LONG_MASKED = ("0=32 1=4 2=640 3=24 4=40 5=1", {"q": (67, 20), "k": (70, 24), "v": (70, 40),
                                                "m": (4, 67, 70)})


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("params, shapes", [*CASES, VIT, LONG_MASKED],
                         ids=[c[0] for c in CASES] + ["vit", "long-masked"])
def test_attention(tmp_path, engine_device, params, shapes, precision):
    check_against_ncnn(tmp_path, engine_device, line_for(params, shapes), shapes, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("fill", [-np.inf, -1e9])
def test_causal_mask(tmp_path, engine_device, fill, precision):
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text(param_text(CAUSAL_SHAPES, [CAUSAL_LINE]))
    graph = load_model(param, None, CAUSAL_SHAPES, seed=7)
    write_bin(graph.layers, bin_path)
    inputs = causal_inputs(fill)
    want = run_ncnn(param, bin_path, inputs, ["out"])["out"]
    with Plan(engine_device, graph, None, precision) as plan:
        got = plan.run(inputs)["out"]
    scale = float(np.max(np.abs(want)))
    assert float(np.max(np.abs(got - want))) <= tolerance(precision) * scale  # NaN fails too
