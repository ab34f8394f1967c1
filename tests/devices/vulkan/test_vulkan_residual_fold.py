"""Residual connections folded into the convolution before them (engine.fusion): where the
fold applies and where it must not, outputs against the CPU kernels in every mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.params import param_text
from tests.support.vulkan_engine import (  # noqa: F401 (engine_device: a fixture)
    MODES,
    assert_near_cpu_kernels,
    engine_device,
    graph_of,
    run_plan,
)
from vkserve.cli.main import main as cli_main
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.device import VulkanDevice

# conv2's (1x1, 256 weights) and conv1's (3x3) GEMM shaders take the residual; comments say
# what each block checks
RESIDUAL_GRAPH = [
    # folded: conv + Eltwise sum with a model input + ReLU
    "Convolution c1 1 1 x a 0=16 1=3 4=1 5=1 6=2304",
    "Eltwise s1 2 1 a x b 0=1",
    "ReLU r1 1 1 b c",
    # folded: BinaryOp add with the conv second + leaky ReLU
    "Convolution c2 1 1 c d 0=16 1=1 5=1 6=256",
    "BinaryOp s2 2 1 c d e 0=0",
    "ReLU r2 1 1 e f 0=0.1",
    # kept: the conv has an activation of its own (it comes before the sum)
    "Convolution c3 1 1 f g 0=16 1=1 5=1 6=256 9=1",
    "Eltwise s3 2 1 g f h 0=1",
    # kept: the conv's output is read by another layer too
    "Convolution c4 1 1 h i 0=16 1=1 5=1 6=256",
    "Eltwise s4 2 1 i h j 0=1",
    "Sigmoid sg 1 1 i k",
    # kept: the shortcut is computed after the conv
    "Convolution c5 1 1 j l 0=16 1=1 5=1 6=256",
    "TanH t5 1 1 k m",
    "Eltwise s5 2 1 l m n 0=1",
    # kept: coefficients other than 1
    "Convolution c6 1 1 n o 0=16 1=1 5=1 6=256",
    "Eltwise s6 2 1 o n p 0=1 -23301=2,1.0,0.5",
    # kept: the conv's output is requested
    "Convolution c7 1 1 p q 0=16 1=1 5=1 6=256",
    "Eltwise s7 2 1 q p r 0=1",
    # folded without an activation: the sum is read twice
    "Convolution c8 1 1 r s 0=16 1=1 5=1 6=256",
    "Eltwise s8 2 1 s r t 0=1",
    "ReLU r8 1 1 t u",
    "Sigmoid sg8 1 1 t v",
]
SHAPES = {"x": (16, 6, 5)}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_residual_sums_fold_into_the_convolution_only_where_nothing_is_lost(
        engine_device: VulkanDevice, precision: Precision) -> None:  # noqa: F811
    graph = graph_of(RESIDUAL_GRAPH, SHAPES, seed=4)
    feed = {"x": np.random.default_rng(2).uniform(-1, 1, SHAPES["x"]).astype(np.float32)}
    outputs = ["k", "q", "u", "v", "f", "h"]
    got, summary, steps = run_plan(engine_device, graph, feed, precision, outputs)
    assert summary["folded_residuals"] == 3
    # the folded sums and activations record nothing; every kept one does
    recorded = {name for name, _ in steps}
    assert not recorded & {"s1", "r1", "s2", "r2", "s8"}
    assert {"s3", "s4", "s5", "s6", "s7", "r8", "sg8"} <= recorded
    assert_near_cpu_kernels(got, graph, feed, precision)


def test_profile_says_what_was_folded(vulkan_caps, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`vkserve profile` counts fewer dispatches than layers: it says why."""
    param = tmp_path / "model.param"
    param.write_text(param_text(SHAPES, RESIDUAL_GRAPH[:6]))  # c1 + s1 + r1, c2 + s2 + r2
    assert cli_main(["profile", str(param), "--device", str(vulkan_caps.index), "--runs", "1",
                     "--shape", "x=16,6,5", "--cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "in 2 dispatches" in out  # six layers: c1 and c2 (fp32: the input is copied, not cast)
    assert "2 residual sums (and their ReLU) in the convolution or Gemm before them, 0 Concats in place" in out
