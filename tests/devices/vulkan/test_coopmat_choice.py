"""conv_coopmat's host side: which layers take it, its tile and K split, its weight layout, its
partials and dispatches, and that the shader compiles in both fp16 modes.

The shader itself runs only where the device has VK_KHR_cooperative_matrix (lavapipe has not):
benchmarks/gpu_tests/test_coopmat.py checks its outputs against ncnn on the GPU machine. Here
the layout is checked against conv_gemm's, whose outputs the CI suite checks against ncnn.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

import vkserve.devices.vulkan.layers.conv as conv_layers
from tests.devices.vulkan.test_vulkan_layers_compute import conv_line, write_param
from vkserve.devices.capabilities import CoopMatrixShape, DeviceCaps, Precision
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.coopmat import coopmat_wanted
from vkserve.devices.vulkan.layers import compute_util
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, VULKAN_LAYERS
from vkserve.devices.vulkan.shader_registry import builtin_shader
from vkserve.models.graph import load_model

FP16_PRODUCT = CoopMatrixShape(16, 16, 16, "float16_t", "float16_t", "float", "float")


@pytest.fixture(autouse=True)
def without_winograd(monkeypatch):
    """These cases are conv_gemm's and conv_coopmat's: without the tensor cores (lavapipe, fp32)
    vulkan.winograd's rule would take their deep 3x3 layers (tests/devices/vulkan/test_winograd.py)."""
    monkeypatch.setenv("VKSERVE_WINOGRAD", "0")


@pytest.fixture
def coop_caps(vulkan_caps) -> DeviceCaps:
    """The CI device as if it offered 16 x 16 x 16 fp16 -> fp32 products on 32-wide subgroups."""
    return dataclasses.replace(vulkan_caps, subgroup_size=32, cooperative_matrix_shapes=(FP16_PRODUCT,))


@pytest.mark.parametrize("precision", [Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC], ids=lambda p: p.value)
def test_the_shader_compiles_in_both_fp16_modes(coop_caps, precision):
    spirv = compile_glsl(builtin_shader("conv_coopmat").source, caps=coop_caps, precision=precision,
                         name="conv_coopmat.comp")
    assert spirv[:4] == b"\x03\x02\x23\x07"  # SPIR-V magic, little-endian


@pytest.mark.parametrize("tiles", [1, 2, 7, 50, 131, 132, 264, 5000])
@pytest.mark.parametrize("steps", [1, 3, 4, 9, 18, 72, 144, 1000])
def test_a_split_is_never_empty_and_nears_the_target_when_k_allows(tiles, steps):
    ksplit, per = compute_util.split_k(tiles, steps)
    assert ksplit >= 1 and per >= 1
    assert (ksplit - 1) * per < steps <= ksplit * per  # every split has steps, K is covered
    if ksplit > 1:
        assert per >= compute_util.COOP_MIN_SPLIT_STEPS
    if tiles >= compute_util.COOP_TARGET_GROUPS:
        assert ksplit == 1
    elif steps >= compute_util.COOP_MIN_SPLIT_STEPS * -(-compute_util.COOP_TARGET_GROUPS // tiles):
        # whole steps per split: within 4/5 of the target (at least 4 steps each)
        assert tiles * ksplit >= 0.8 * compute_util.COOP_TARGET_GROUPS


def test_the_tile_follows_k_and_fits_the_grid():
    assert conv_layers.choose_coop_tile(256, 3136, 16, 1).fm == 1      # short K: 32 x 64
    assert conv_layers.choose_coop_tile(256, 3136, 72, 1).fm == 2      # long K: 64 x 64
    assert conv_layers.choose_coop_tile(512, 196, 144, 1).ksplit > 1   # few tiles: K split
    assert conv_layers.choose_coop_tile(64, 50176, 18, 1).ksplit == 1  # many tiles: not
    assert conv_layers.choose_coop_tile(64, 64 * MAX_GROUPS + 1, 18, 1) is None


@pytest.mark.parametrize("shape, wanted", [
    ((256, 256, 3136, 2304), True),   # vgg16 conv3_2 (measured 0.37x of conv_gemm's GPU time)
    ((512, 512, 49, 4608), True),     # resnet18 res5b_branch2b (0.33x)
    ((3, 64, 12544, 147), False),     # resnet50 conv1: 3 channels padded to 32 (2.2x slower)
    ((96, 96, 196, 576), False),      # mobilenet_v2 conv5_1/linear: 10.8 M multiply-adds (1.26x)
    ((64, 256, 3136, 64), False),     # resnet50 res2a_branch1: K = 64
    ((40, 128, 784, 360), False),     # 40 channels padded to 64
])
def test_the_automatic_rule_takes_the_measured_winners(monkeypatch, shape, wanted):
    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    icg, m, n, k = shape
    assert coopmat_wanted(icg, -(-icg // 32) * 32, m, n, k) is wanted


def test_the_environment_forces_it_either_way_and_names_a_bad_value(monkeypatch, caplog):
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")
    assert coopmat_wanted(3, 32, 64, 12544, 147)
    monkeypatch.setenv("VKSERVE_COOPMAT", "0")
    assert not coopmat_wanted(256, 256, 256, 3136, 2304)
    monkeypatch.setenv("VKSERVE_COOPMAT", "yes")
    with caplog.at_level(logging.WARNING, logger="vkserve.devices.vulkan.coopmat"):
        assert coopmat_wanted(256, 256, 256, 3136, 2304)
    assert "VKSERVE_COOPMAT='yes'" in caplog.text


CASES = {
    # (kind, input shape, num_output, params, kernel (kh, kw), group): one long-K layer that
    # splits, one grouped layer with channels padded per tap, one 1x1
    "3x3-split": ("Convolution", (256, 14, 14), 256, "4=1 5=1 9=1", (3, 3), 1),
    "grouped-5x3-padded": ("ConvolutionDepthWise", (120, 9, 11), 64, "4=1 5=1 9=2 -23310=1,0.1", (5, 3), 2),
    "1x1": ("Convolution", (512, 28, 28), 128, "5=1", (1, 1), 1),
}


def layers(tmp_path, case: str, caps: DeviceCaps):
    """The case's layer as conv_coopmat (specialized for `caps`) and as conv_gemm."""
    kind, shape, out, params, k, group = CASES[case]
    write_param(tmp_path / "case.param", {"data": shape}, conv_line(kind, shape[0], out, params, k, group))
    graph = load_model(tmp_path / "case.param", None, {"data": shape}, seed=3)
    layer = graph.layers[-1]
    make = VULKAN_LAYERS[kind]
    coop = make(layer, [shape], [graph.blob_shapes["out"]], Precision.FP16_STORAGE)
    coop.specialize(caps)
    gemm = make(layer, [shape], [graph.blob_shapes["out"]], Precision.FP16_STORAGE)
    return coop, gemm


@pytest.mark.parametrize("case", list(CASES))
def test_weights_are_conv_gemms_tap_major_and_zero_padded(tmp_path, coop_caps, monkeypatch, case):
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")
    coop, gemm = layers(tmp_path, case, coop_caps)
    assert (coop.kind, gemm.kind) == ("conv_coopmat", "conv_gemm")
    g, icg, ocg = coop.groups, coop.icg, coop.ocg
    taps = coop.params.kernel_h * coop.params.kernel_w
    cpad = -(-icg // 32) * 32
    kpad, mpad = coop._padded_km()
    assert kpad == taps * cpad and mpad % coop.coop_tile.bm == 0
    a = coop.weights()["weight"].reshape(g, mpad, taps, cpad)
    gk, gm = gemm._padded_km()
    b = gemm.weights()["weight"].reshape(g, gk, gm)[:, :icg * taps, :ocg]  # A[g][c * taps + tap][m]
    want = b.reshape(g, icg, taps, ocg).transpose(0, 3, 2, 1)             # -> [g][m][tap][c]
    np.testing.assert_array_equal(a[:, :ocg, :, :icg], want)
    assert not a[:, ocg:].any() and not a[:, :, :, icg:].any()
    np.testing.assert_array_equal(coop.weights()["bias"], gemm.weights()["bias"])


@pytest.mark.parametrize("case", list(CASES))
def test_dispatches_cover_the_output_and_the_partials_fit(tmp_path, coop_caps, monkeypatch, case):
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")
    coop, _ = layers(tmp_path, case, coop_caps)
    t = coop.coop_tile
    n = coop.outh * coop.outw
    npad = -(-n // t.bn) * t.bn
    _, mpad = coop._padded_km()
    coop.item_stride = 12345  # what the Plan sets: the batch's items' distance in the arena
    dispatches = coop.dispatches()
    assert [d.shader for d in dispatches] == ["conv_coopmat"] * (1 if t.ksplit == 1 else 2)
    assert all(d.batched for d in dispatches)
    main = dispatches[0]
    assert main.bindings[4:] == ("s:partial", coop.layer.inputs[0])  # no residual folded: the input, unread
    # the GEMM pass, no residual, item stride, where the gathered values are bounded
    assert main.spec_constants[-4:] == (0, 0, 12345, int(conv_layers.coop_defers(t, main.global_size)))
    assert main.global_size == (npad // t.bn * 256, mpad // t.bm, coop.groups * t.ksplit)
    assert t.ksplit * t.split_steps >= coop._padded_km()[0] // conv_layers.COOP_BK
    partial_halves = coop.scratch()["partial"]
    if t.ksplit > 1:
        # fp32 partials [split][group][mpad][npad], counted in fp16 storage elements
        assert partial_halves == 2 * t.ksplit * coop.groups * mpad * npad
        reduce = dispatches[1]
        assert reduce.spec_constants[-4:-1] == (1, 0, 12345) and reduce.bindings == main.bindings
        assert reduce.global_size == (n, coop.ocg, coop.groups)
    else:
        assert partial_halves == 2


def test_gathered_values_are_bounded_when_stored_where_the_grid_is_small_or_k_split():
    split, whole = conv_layers.CoopTile(2, 1, 3, 6), conv_layers.CoopTile(2, 1, 1, 18)
    units = compute_util.GEMM_UNITS
    assert conv_layers.coop_defers(split, (784 * 256, 1, 3))  # K split: the reduce pass's epilogue
    assert conv_layers.coop_defers(whole, (2 * units * 256, 1, 1))
    assert not conv_layers.coop_defers(whole, (units * 256, 2, 2))  # 4 work groups a compute unit


def test_without_the_products_or_in_fp32_the_layer_keeps_conv_gemm(tmp_path, vulkan_caps, coop_caps, monkeypatch):
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")
    assert layers(tmp_path, "3x3-split", vulkan_caps)[0].kind == "conv_gemm"
    kind, shape, out, params, k, group = CASES["3x3-split"]
    write_param(tmp_path / "f.param", {"data": shape}, conv_line(kind, shape[0], out, params, k, group))
    graph = load_model(tmp_path / "f.param", None, {"data": shape}, seed=3)
    fp32 = VULKAN_LAYERS[kind](graph.layers[-1], [shape], [graph.blob_shapes["out"]], Precision.FP32)
    fp32.specialize(coop_caps)
    assert fp32.kind == "conv_gemm"
