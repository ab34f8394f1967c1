"""gemm_coopmat's host side: which products take it (device, mode, ``VKSERVE_COOPMAT``, shape),
its tile, its spec constants, and that the shader compiles in both fp16 modes.

The shader runs only where the device has VK_KHR_cooperative_matrix (lavapipe has not):
benchmarks/gpu_tests/test_gemm_coopmat.py checks its outputs against ncnn on the GPU machine
(every Gemm / MatMul / attention case of the CI suite, forced onto it).
"""

from __future__ import annotations

import pytest

import vkserve.devices.vulkan.layers.attention  # noqa: F401 (registers MultiHeadAttention)
from tests.devices.vulkan.test_coopmat_choice import coop_caps  # noqa: F401 (fixture)
from tests.support.vulkan_engine import graph_of
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, VULKAN_LAYERS
from vkserve.devices.vulkan.layers.compute_util import GEMM_UNITS
from vkserve.devices.vulkan.layers.matmul import (
    COOP_GEMM_BK,
    COOP_GEMM_PREFETCH,
    COOP_GEMM_TILES,
    choose_coop_gemm,
    choose_coop_gemm_tile,
    whole_quads,
)
from vkserve.devices.vulkan.shader_registry import buildable, builtin_shader

FP16 = [Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC]
LINEAR = "Gemm g 1 1 a out 10=4 2=0 3=1 4=0 5=1 6=1 7={m} 8={n} 9={k}"


def shaders(caps, line: str, shapes: dict, precision: Precision) -> list:
    graph = graph_of([line], shapes)
    layer = graph.layers[-1]
    vl = VULKAN_LAYERS[layer.type](layer, [graph.blob_shapes[b] for b in layer.inputs],
                                   [graph.blob_shapes[b] for b in layer.outputs], precision)
    vl.specialize(caps)
    return vl.dispatches()


@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
def test_the_shader_compiles_in_both_fp16_modes(coop_caps, precision):  # noqa: F811
    spirv = compile_glsl(builtin_shader("gemm_coopmat").source, caps=coop_caps, precision=precision,
                         name="gemm_coopmat.comp")
    assert spirv[:4] == b"\x03\x02\x23\x07"  # SPIR-V magic, little-endian
    assert buildable("gemm_coopmat", coop_caps, precision)
    assert not buildable("gemm_coopmat", coop_caps, Precision.FP32)


def linear(caps, m: int, n: int, k: int, precision: Precision = Precision.FP16_STORAGE) -> list[str]:
    return [d.shader for d in shaders(caps, LINEAR.format(m=m, n=n, k=k), {"a": (m, k)}, precision)]


@pytest.mark.parametrize("m, n, k, coop", [
    # measured faster on the H200 (RESULTS.md, issue 17): short K on many tiles, long K split
    (784, 768, 192, True), (196, 1536, 384, True), (196, 384, 1536, True), (49, 768, 3072, True),
    (784, 192, 768, True), (49, 3072, 768, True),
    (3136, 384, 96, False),  # three steps of K: gemm.comp was faster
    (49, 64, 32, False),
])
def test_the_rule_takes_the_shapes_measured_faster(coop_caps, monkeypatch, m, n, k, coop):  # noqa: F811
    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    assert set(linear(coop_caps, m, n, k)) == ({"gemm_coopmat"} if coop else {"gemm"})


def test_a_gemm_with_few_tiles_splits_k_into_partials_that_its_last_work_groups_add(coop_caps, monkeypatch):  # noqa: F811
    """One dispatch: each tile's work groups store fp32 partials and count themselves in the
    tile's counter, which the Plan zeroes before every run; the last of them adds the partials."""
    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    m, n, k = 196, 384, 1536
    graph = graph_of([LINEAR.format(m=m, n=n, k=k)], {"a": (m, k)})
    vl = VULKAN_LAYERS["Gemm"](graph.layers[-1], [(m, k)], [(m, n)], Precision.FP16_STORAGE)
    vl.specialize(coop_caps)
    launch = choose_coop_gemm(m, n, k, 1, split=True)
    assert launch is not None and launch.ksplit > 1
    assert (launch.ksplit - 1) * launch.split_steps < -(-k // COOP_GEMM_BK) <= launch.ksplit * launch.split_steps
    (product,) = vl.dispatches()
    assert product.shader == "gemm_coopmat"
    assert (product.bindings[4], product.bindings[8]) == ("s:partial", "s:tile_count")
    mpad, npad = launch.padded(m, n)
    assert (mpad, npad) == (224, 384)  # 7 x 32 rows, 6 x 64 columns
    # fp32 partials and a uint32 counter a tile, in fp16 elements; the counters zeroed
    assert vl.scratch() == {"partial": launch.ksplit * mpad * npad * 2, "tile_count": 7 * 6 * 2}
    assert vl.zeroed_scratch() == {"tile_count"}
    assert product.global_size == (npad // 64 * 256, mpad // 32, launch.ksplit)
    # .., residual, activation (type, two parameters), values of K per step, both operands
    # read by whole quads (K, 1536, a multiple of 4), no row norm, steps in flight
    assert product.spec_constants[6:] == (launch.ksplit, launch.split_steps, mpad, npad, 0, 0, 0.0, 0.0,
                                          COOP_GEMM_BK, 1, 1, 0, 0.0, COOP_GEMM_PREFETCH)


def test_a_split_product_into_a_transposed_output_adds_its_partials_along_its_rows(coop_caps, monkeypatch):  # noqa: F811
    """output_transpose (a folded Permute): the output's unit stride is along M, so the last
    work groups' additions walk M (the partials are stored column-major for them) and their
    stores coalesce."""
    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    m, n, k = 196, 384, 1536
    (product,) = shaders(coop_caps, LINEAR.format(m=m, n=n, k=k) + " 14=1", {"a": (m, k)},
                         Precision.FP16_STORAGE)
    assert product.shader == "gemm_coopmat"
    o_jfast, ksplit = product.spec_constants[5:7]
    assert o_jfast == 0 and ksplit > 1


def test_matmul_and_attention_products_keep_k_whole(coop_caps, monkeypatch):  # noqa: F811
    """They have no partials in scratch: the same shape as a split Gemm above stays whole."""
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")
    (product,) = shaders(coop_caps, "MatMul mm 2 1 a b out", {"a": (196, 1536), "b": (1536, 384)},
                         Precision.FP16_STORAGE)
    assert product.shader == "gemm_coopmat" and product.spec_constants[6] == 1
    # the unread partial and counter bindings: the output
    assert product.bindings[4] == product.bindings[8] == product.bindings[3]


def test_never_in_fp32_or_without_the_extension_or_when_off(coop_caps, vulkan_caps, monkeypatch):  # noqa: F811
    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    assert linear(coop_caps, 3136, 96, 384, Precision.FP32) == ["gemm"]
    assert linear(vulkan_caps, 3136, 96, 384) == ["gemm"]  # lavapipe: no cooperative matrices
    monkeypatch.setenv("VKSERVE_COOPMAT", "0")
    assert linear(coop_caps, 3136, 96, 384) == ["gemm"]
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")  # every product it can run (for measuring)
    assert linear(coop_caps, 49, 64, 32) == ["gemm_coopmat"]


def test_same_push_constants_as_gemm_and_stride_orders_in_spec_constants(coop_caps, monkeypatch):  # noqa: F811
    """transA / transB / output_transpose: which operand is k-contiguous, which output axis is."""
    line = "Gemm g 2 1 a b out 2=1 3=1 14=1"
    shapes = {"a": (40, 30), "b": (50, 40)}
    monkeypatch.setenv("VKSERVE_COOPMAT", "0")
    (fma,) = shaders(coop_caps, line, shapes, Precision.FP16_STORAGE)
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")
    (coop,) = shaders(coop_caps, line, shapes, Precision.FP16_STORAGE)
    assert coop.shader == "gemm_coopmat" and coop.push_constants == fma.push_constants
    # + the partial slot (K whole: the output, unread) before the residual slot (none: input 0),
    # the row norm's gamma and beta (none: input 0, unread) and the tile counters (the output)
    assert coop.bindings == (*fma.bindings[:4], fma.bindings[3], fma.bindings[4], fma.bindings[0], fma.bindings[0],
                             fma.bindings[3])
    (has_c, fm, fn, a_kfast, b_kfast, o_jfast, ksplit, _, _, _, residual, *activation, bk,
     a_vec, b_vec, a_norm, eps, prefetch) = coop.spec_constants
    assert (a_norm, eps, prefetch) == (0, 0.0, COOP_GEMM_PREFETCH)
    assert activation == [0, 0.0, 0.0] and bk == COOP_GEMM_BK
    assert (has_c, a_kfast, b_kfast, o_jfast, ksplit, residual) == (0, 0, 1, 0, 1, 0)
    # A (transposed) by quads along M = 30: not whole; B's along K = 40 are
    assert (a_vec, b_vec) == (0, 1)
    assert coop.global_size == (-(-50 // (64 * fn)) * 256, -(-30 // (32 * fm)), 1)  # M 30, N 50


def test_attention_products_follow_the_rule(coop_caps, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")
    line = "MultiHeadAttention att 1 1 q out 0=192 1=3 2=36864 3=192 4=192"
    used = [d.shader for d in shaders(coop_caps, line, {"q": (197, 192)}, Precision.FP16_STORAGE)]
    assert used.count("gemm_coopmat") == 6  # q, k, v, scores, mix, out


@pytest.mark.parametrize("m, n, batches", [(3136, 384, 1), (197, 768, 1), (197, 192, 1), (16, 16, 1),
                                           (197, 197, 3), (10, 10, 70000), (5_000_000, 8, 1)])
def test_the_tile_fills_the_device_and_the_grid_fits(m, n, batches):
    tile = choose_coop_gemm_tile(m, n, batches)
    if batches > MAX_GROUPS or -(-m // 64) > MAX_GROUPS:
        assert tile is None
        return
    fm, fn = tile
    groups = -(-n // (64 * fn)) * -(-m // (32 * fm)) * batches
    assert groups >= GEMM_UNITS or (fm, fn) == (1, 1)
    assert (fm, fn) in COOP_GEMM_TILES  # never 64 x 128 (slow on the H200)
    if (fm, fn) != COOP_GEMM_TILES[0]:  # the larger tile would have left units idle
        assert -(-n // 64) * -(-m // 64) * batches < GEMM_UNITS


@pytest.mark.parametrize("rows, k, row_stride, k_stride, batch, whole", [
    (196, 384, 384, 1, (0, 0), True),        # k-contiguous rows, K a multiple of 4
    (196, 382, 382, 1, (0, 0), False),       # K = 382: the last quad of each row is partial
    (196, 384, 388, 1, (0, 0), True),        # padded rows, still aligned
    (196, 384, 386, 1, (0, 0), False),       # rows 386 apart: odd quads start unaligned
    (784, 256, 1, 784, (200704, 0), True),   # Winograd's B: the rows (pixels) contiguous
    (196, 256, 1, 196, (50176, 0), True),
    (30, 40, 1, 30, (0, 0), False),          # transposed A, M = 30
    (784, 256, 1, 784, (200706, 0), False),  # a batch stride that breaks the alignment
    (64, 64, 2, 128, (0, 0), False),         # no unit stride: scalar loads
])
def test_quads_are_whole_only_where_every_load_is_aligned(rows, k, row_stride, k_stride, batch, whole):
    assert whole_quads(rows, k, row_stride, k_stride, batch) is whole
