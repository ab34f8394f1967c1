"""conv_winograd (vulkan.winograd): Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions on
lavapipe against ncnn, in every precision mode, through the layer's three passes and through
whole Plans (a folded residual sum, batches); which convolutions can take it; the rule; the
VKSERVE_WINOGRAD switch."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from tests.devices.vulkan.test_coopmat_choice import FP16_PRODUCT
from tests.devices.vulkan.test_vulkan_layers_compute import (  # noqa: F401 (spirv_for: the fixture)
    MODES,
    check_layer,
    conv_line,
    spirv_for,
    write_param,
)
from tests.support.vulkan_engine import (  # noqa: F401 (engine_device: a fixture)
    assert_near_cpu_kernels,
    engine_device,
    graph_of,
    run_plan,
)
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS
from vkserve.devices.vulkan.winograd import matrices, transform_weights, winograd_tile
from vkserve.models.graph import load_model

WINOGRAD = {
    # id: (input shape, num_output, params)
    "pad1-relu-odd": ((3, 9, 11), 5, "4=1 5=1 9=1"),
    "valid-odd": ((4, 9, 12), 6, "4=0 5=1"),
    "pad-value-mish": ((2, 6, 5), 3, "4=2 18=0.5 5=1 9=5"),
    "large-pad-nobias": ((1, 3, 4), 2, "4=3"),
    "deep-leaky": ((40, 6, 11), 70, "4=1 5=1 9=2 -23310=1,0.1"),
    "wide-clip": ((64, 14, 14), 96, "4=1 5=1 9=3 -23310=2,-0.3,0.4"),
    "asym-pad": ((8, 7, 9), 16, "4=1 14=0 15=1 16=0 5=1 9=4"),
}


#: F(2, 3) in every mode; F(4, 3) where the rule takes it: fp32 (in the fp16 storage modes its
#: transformed values lose ~10x the direct kernel's precision, RESULTS.md)
TILE_MODES = [("2", p) for p in MODES] + [("4", Precision.FP32)]


@pytest.mark.parametrize("tile, precision", TILE_MODES, ids=lambda v: v if isinstance(v, str) else v.value)
@pytest.mark.parametrize("case", list(WINOGRAD))
def test_winograd_convolution(tmp_path, vulkan_ctx, spirv_for, monkeypatch, tile, case, precision):  # noqa: F811
    monkeypatch.setenv("VKSERVE_WINOGRAD", tile)
    shape, out, params = WINOGRAD[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, conv_line("Convolution", shape[0], out, params),
                {"data": shape}, precision)


def _layer(tmp_path, line: str, shape: tuple[int, int, int], precision: Precision = Precision.FP32):
    write_param(tmp_path / "choice.param", {"data": shape}, line)
    graph = load_model(tmp_path / "choice.param", None, {"data": shape}, seed=7)
    return VULKAN_LAYERS["Convolution"](graph.layers[-1], [shape], [graph.blob_shapes["out"]], precision)


@pytest.mark.parametrize("params, taken", [
    ("4=1 5=1", True),
    ("4=1 5=1 3=2", False),           # stride 2
    ("4=2 5=1 2=2", False),           # dilation 2
])
def test_which_convolutions_can_take_it(tmp_path, vulkan_caps, monkeypatch, params, taken):
    monkeypatch.setenv("VKSERVE_WINOGRAD", "2")
    vl = _layer(tmp_path, conv_line("Convolution", 16, 24, params), (16, 12, 12))
    vl.specialize(vulkan_caps)
    shaders = [d.shader for d in vl.dispatches()]
    if taken:
        assert vl.kind == "conv_winograd"
        assert shaders == ["winograd_input", "gemm", "winograd_output"]  # lavapipe: no tensor cores
    else:
        assert vl.kind == "conv_gemm" and shaders == ["conv_gemm"]


def test_other_kernel_shapes_and_groups_keep_their_kernels(tmp_path, vulkan_caps, monkeypatch):
    monkeypatch.setenv("VKSERVE_WINOGRAD", "4")
    five = _layer(tmp_path, conv_line("Convolution", 16, 24, "4=2 5=1", (5, 5)), (16, 12, 12))
    five.specialize(vulkan_caps)
    grouped = _layer(tmp_path, conv_line("ConvolutionDepthWise", 16, 16, "4=1 5=1", (3, 3), 2), (16, 12, 12))
    grouped.specialize(vulkan_caps)
    assert (five.kind, grouped.kind) == ("conv_gemm", "conv_gemm")


def test_switch(tmp_path, vulkan_caps, monkeypatch, caplog):
    """0 turns it off; a value that is not auto, 0, 2 or 4 is logged and taken as auto."""
    line = conv_line("Convolution", 64, 64, "4=1 5=1")
    monkeypatch.setenv("VKSERVE_WINOGRAD", "0")
    off = _layer(tmp_path, line, (64, 28, 28))
    off.specialize(vulkan_caps)
    assert off.kind == "conv_gemm"
    monkeypatch.setenv("VKSERVE_WINOGRAD", "yes")
    with caplog.at_level(logging.WARNING, logger="vkserve.devices.vulkan.winograd"):
        auto = _layer(tmp_path, line, (64, 28, 28))
        auto.specialize(vulkan_caps)
    assert "VKSERVE_WINOGRAD='yes' is not auto, 0, 2 or 4" in caplog.text
    monkeypatch.setenv("VKSERVE_WINOGRAD", "auto")
    again = _layer(tmp_path, line, (64, 28, 28))
    again.specialize(vulkan_caps)
    assert auto.kind == again.kind


RESIDUAL = [
    "Convolution c1 1 1 x a 0=32 1=3 4=1 5=1 6=9216",
    "Eltwise s1 2 1 a x b 0=1",
    "ReLU r1 1 1 b c",
    "Convolution c2 1 1 c d 0=32 1=3 4=1 5=1 6=9216 9=1",
    "BinaryOp s2 2 1 d c e 0=0",
]


@pytest.mark.parametrize("tile, precision", [("2", Precision.FP32), ("2", Precision.FP16_STORAGE),
                                             ("4", Precision.FP32)], ids=lambda v: v if isinstance(v, str) else v.value)
def test_plan_folds_residual_sums_and_runs_batches(engine_device, monkeypatch, tile, precision):  # noqa: F811
    """Through a whole Plan: a residual sum (and its ReLU) folded into the output transform,
    a convolution with its own activation left unfolded, against the CPU kernels; a batch of 3
    (the three passes once per item, each with its own transformed blobs) equal to the items
    run alone."""
    monkeypatch.setenv("VKSERVE_WINOGRAD", tile)
    shapes = {"x": (32, 15, 13)}
    graph = graph_of(RESIDUAL, shapes, seed=4)
    feed = {"x": np.random.default_rng(2).uniform(-1, 1, shapes["x"]).astype(np.float32)}
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["e"])
    assert summary["folded_residuals"] == 1
    assert [shader for name, shader in steps if name == "c1"] == ["winograd_input", "gemm", "winograd_output"]
    assert_near_cpu_kernels(got, graph, feed, precision)
    feeds = [{"x": np.random.default_rng(s).uniform(-1, 1, shapes["x"]).astype(np.float32)} for s in range(3)]
    with Plan(engine_device, graph, None, precision, outputs=["e"], max_instances=1) as plan:
        alone = [plan.run(f) for f in feeds]
        together = plan.run_batch(feeds)
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(b["e"], a["e"])
    assert not np.array_equal(alone[0]["e"], alone[1]["e"])


def test_weight_transform_is_exact_for_a_known_kernel():
    """U = G g G^T: a kernel of ones gives G's row sums' outer product (1, 1.5, 0.5, 1)."""
    u = transform_weights(np.ones((2, 3, 3, 3), np.float32), 2)
    sums = np.array([1.0, 1.5, 0.5, 1.0])
    assert u.shape == (16, 2, 3)
    np.testing.assert_array_equal(u[:, 1, 2], np.outer(sums, sums).ravel().astype(np.float32))


@pytest.mark.parametrize("m", [2, 4])
def test_the_matrices_compute_a_correlation(m):
    """A^T [(G g G^T) * (B^T d B)] A is the 3x3 correlation of the patch d (what ncnn's
    Convolution computes), in float64 to rounding."""
    bt, g, at = matrices(m)
    rng = np.random.default_rng(m)
    d, k = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    y = at @ ((g @ k @ g.T) * (bt @ d @ bt.T)) @ at.T
    direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(y, direct, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cin, pixels, coop, fp32, tile", [
    (128, 7 * 7, False, False, 2),
    (512, 28 * 28, False, False, 2),
    (64, 112 * 112, False, False, 2),
    (64, 104 * 104, False, False, 0),   # fp16: 64 channels only from 112 x 112
    (64, 56 * 56, False, False, 0),     # 64 channels on a smaller map: conv_gemm was faster
    (32, 224 * 224, False, False, 0),
    (128, 28 * 28, False, True, 4),     # fp32: F(4, 3) from 28 x 28
    (512, 14 * 14, False, True, 2),     # below it F(2, 3)
    (64, 104 * 104, False, True, 4),
    (64, 56 * 56, False, True, 0),
    (512, 28 * 28, True, False, 2),     # on the tensor cores: only large layers, F(2, 3)
    (256, 56 * 56, True, False, 2),
    (512, 14 * 14, True, False, 0),
    (256, 26 * 26, True, False, 0),
    (128, 56 * 56, True, False, 0),
])
def test_auto_rule(monkeypatch, cin, pixels, coop, fp32, tile):
    monkeypatch.delenv("VKSERVE_WINOGRAD", raising=False)
    assert winograd_tile(cin, pixels, coop, fp32) == tile


def test_auto_rule_on_this_device(tmp_path, vulkan_caps, monkeypatch):
    """lavapipe has no tensor cores: a deep 3x3 layer takes Winograd in every mode by default
    (F(4, 3) in fp32 on a large enough map), a shallow one keeps conv_gemm."""
    monkeypatch.delenv("VKSERVE_WINOGRAD", raising=False)
    for precision in MODES:
        deep = _layer(tmp_path, conv_line("Convolution", 128, 128, "4=1 5=1"), (128, 28, 28), precision)
        deep.specialize(vulkan_caps)
        shallow = _layer(tmp_path, conv_line("Convolution", 64, 64, "4=1 5=1"), (64, 56, 56), precision)
        shallow.specialize(vulkan_caps)
        assert (deep.kind, shallow.kind) == ("conv_winograd", "conv_gemm"), precision
        assert deep.wino_tile == (4 if precision is Precision.FP32 else 2)


def test_the_rule_follows_the_kernel_it_competes_with(tmp_path, vulkan_caps, monkeypatch):
    """On a device with the tensor cores (this one, as if it offered fp16 products) a 128-channel
    layer keeps its kernel in fp16 and takes Winograd in fp32, and with VKSERVE_COOPMAT=0
    (conv_gemm the competitor again) in fp16 as well; its GEMMs then run on gemm.comp."""
    caps = dataclasses.replace(vulkan_caps, subgroup_size=32, cooperative_matrix_shapes=(FP16_PRODUCT,))
    monkeypatch.delenv("VKSERVE_WINOGRAD", raising=False)
    line = conv_line("Convolution", 128, 128, "4=1 5=1")

    def kind(precision: Precision) -> str:
        vl = _layer(tmp_path, line, (128, 14, 14), precision)
        vl.specialize(caps)
        return vl.kind

    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    assert kind(Precision.FP16_STORAGE) != "conv_winograd"
    assert kind(Precision.FP32) == "conv_winograd"
    monkeypatch.setenv("VKSERVE_COOPMAT", "0")
    vl = _layer(tmp_path, line, (128, 14, 14), Precision.FP16_STORAGE)
    vl.specialize(caps)
    assert vl.kind == "conv_winograd"
    assert [d.shader for d in vl.dispatches()] == ["winograd_input", "gemm", "winograd_output"]
