"""conv_winograd (F(2, 3)) with its GEMMs on gemm_coopmat (tensor cores) against ncnn, on a device
that has them (lavapipe runs them on gemm.comp: tests/devices/vulkan/test_winograd.py).

Not part of the CI suite; run on the GPU machine. A device without the extension fails here
rather than skipping, so a run on the wrong machine cannot pass unnoticed.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import vulkan_caps, vulkan_ctx  # noqa: F401 (fixtures)
from tests.devices.vulkan.test_vulkan_layers_compute import conv_line, write_param
from tests.devices.vulkan.test_winograd import RESIDUAL
from tests.support.vulkan_engine import (  # noqa: F401 (engine_device: a fixture)
    assert_near_cpu_kernels,
    check_against_ncnn,
    engine_device,
    graph_of,
    run_plan,
)
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS
from vkserve.models.graph import load_model

FP16 = [Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC]

CASES = {
    # id: (input shape, num_output, params): whole K and split K (long K, few tiles)
    "128-to-96-odd": ((128, 15, 13), 96, "4=1 5=1 9=1"),
    "256-at-28": ((256, 28, 28), 256, "4=1 5=1"),
    "512-at-7-split": ((512, 7, 7), 512, "4=1 5=1 9=2 -23310=1,0.1"),
    "64-at-56-valid": ((64, 58, 58), 64, "4=0 5=1"),
}


@pytest.fixture(autouse=True)
def tensor_cores_on(monkeypatch):
    monkeypatch.setenv("VKSERVE_WINOGRAD", "2")  # F(4, 3) only in fp32, off the tensor cores
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")


@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
@pytest.mark.parametrize("case", list(CASES))
def test_winograd_on_tensor_cores(tmp_path, vulkan_ctx, engine_device, case, precision):  # noqa: F811
    """Through a Plan (gemm_coopmat binds its output twice when K is whole, which only an arena
    aliases: the one-layer harness of check_layer copies each binding apart)."""
    shape, out, params = CASES[case]
    line = conv_line("Convolution", shape[0], out, params)
    write_param(tmp_path / "choice.param", {"data": shape}, line)
    graph = load_model(tmp_path / "choice.param", None, {"data": shape}, seed=7)
    vl = VULKAN_LAYERS["Convolution"](graph.layers[-1], [shape], [graph.blob_shapes["out"]], precision)
    vl.specialize(vulkan_ctx.caps)
    shaders = [d.shader for d in vl.dispatches()]
    assert shaders[0] == "winograd_input" and shaders[-1] == "winograd_output"
    assert set(shaders[1:-1]) == {"gemm_coopmat"}
    assert len(shaders) == 3  # K split too: the GEMMs' last work groups add the partials
    check_against_ncnn(tmp_path, engine_device, line, {"data": shape}, precision)


@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
def test_winograd_folds_residual_sums(engine_device, precision):  # noqa: F811
    shapes = {"x": (32, 15, 13)}
    graph = graph_of(RESIDUAL, shapes, seed=4)
    feed = {"x": np.random.default_rng(2).uniform(-1, 1, shapes["x"]).astype(np.float32)}
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["e"])
    assert summary["folded_residuals"] == 1
    assert "gemm_coopmat" in {shader for name, shader in steps if name == "c1"}
    assert_near_cpu_kernels(got, graph, feed, precision)
