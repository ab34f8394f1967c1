"""gemm_coopmat.comp (tensor-core Gemm / MatMul / attention products) against ncnn, on a device
that has VK_KHR_cooperative_matrix.

Not part of the CI suite (lavapipe offers no cooperative matrices): run on the GPU machine by
benchmarks/gpu_coopmat.sh. With ``VKSERVE_COOPMAT=1`` every product runs on gemm_coopmat, so the
CI suite's Gemm, MatMul and attention cases (every stride order, C broadcast, batch broadcast,
odd sizes, pnnx's Linear shapes) check it; each tile too. A device without the extension fails
here rather than skipping.
"""

from __future__ import annotations

import numpy as np
import pytest

import vkserve.devices.vulkan.layers.matmul as matmul_layers
from tests.conftest import vulkan_caps  # noqa: F401 (fixture)
from tests.devices.cpu.test_cpu_attention import CASES as ATTENTION_CASES
from tests.devices.cpu.test_cpu_attention import line_for
from tests.devices.cpu.test_cpu_matmul import GEMM_CASES, MATMUL_CASES, PNNX_GEMM
from tests.devices.vulkan.test_vulkan_pnnx_folds import ACTIVATIONS, TAIL, TAIL_SHAPES, _mlp, feed_for
from tests.support.vulkan_engine import (  # noqa: F401 (engine_device: a fixture)
    assert_near_cpu_kernels,
    check_against_ncnn,
    engine_device,
    graph_of,
    run_plan,
)
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.coopmat import fp16_coopmat
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS

FP16 = [Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC]


@pytest.fixture(autouse=True)
def coopmat_on(monkeypatch):
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")


def test_device_offers_fp16_products(vulkan_caps):  # noqa: F811
    assert fp16_coopmat(vulkan_caps, Precision.FP16_STORAGE), vulkan_caps.cooperative_matrix_shapes


def test_products_take_the_coopmat_shader(vulkan_caps):  # noqa: F811
    graph = graph_of(["Gemm g 1 1 a out 10=4 2=0 3=1 4=0 5=1 6=1 7=3136 8=384 9=96"], {"a": (3136, 96)})
    vl = VULKAN_LAYERS["Gemm"](graph.layers[-1], [(3136, 96)], [(3136, 384)], Precision.FP16_STORAGE)
    vl.specialize(vulkan_caps)
    assert [d.shader for d in vl.dispatches()] == ["gemm_coopmat"]


@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
@pytest.mark.parametrize("line, shapes", GEMM_CASES,
                         ids=[c[0][8:] + str(list(c[1].values())) for c in GEMM_CASES])
def test_gemm(tmp_path, engine_device, line, shapes, precision):  # noqa: F811
    check_against_ncnn(tmp_path, engine_device, line, shapes, precision)


def force(monkeypatch, tile: tuple[int, int], ksplit: int) -> None:
    """Every product on `tile` with K in `ksplit` splits (fewer when the steps run out; the
    last split shorter when they do not divide); products that cannot split keep K whole."""
    def choose(m, n, k, batches, split, by_size=True):
        steps = -(-k // matmul_layers.COOP_GEMM_BK)
        per = -(-steps // (ksplit if split else 1))
        return matmul_layers.CoopGemm(*tile, -(-steps // per), per)

    monkeypatch.setattr(matmul_layers, "choose_coop_gemm", choose)


@pytest.mark.parametrize("ksplit", [1, 3], ids=lambda s: f"ksplit{s}")
@pytest.mark.parametrize("tile", matmul_layers.COOP_GEMM_TILES, ids=lambda t: f"fm{t[0]}fn{t[1]}")
@pytest.mark.parametrize("m, n, k", [*PNNX_GEMM, (77, 130, 45)], ids=str)
def test_pnnx_linear_every_tile(tmp_path, engine_device, monkeypatch, m, n, k, tile, ksplit):  # noqa: F811
    force(monkeypatch, tile, ksplit)
    check_against_ncnn(tmp_path, engine_device,
                       f"Gemm gemm_0 1 1 a out 10=4 2=0 3=1 4=0 5=1 6=1 7={m} 8={n} 9={k}", {"a": (m, k)},
                       Precision.FP16_STORAGE)


# C (full, per row, per column), alpha / beta, transposed operands and output, with K split
SPLIT_GEMMS = [
    ("Gemm op 3 1 a b c out 0=0.5 1=2.0", {"a": (70, 200), "b": (200, 90), "c": (70, 90)}),
    ("Gemm op 3 1 a b c out 2=1 3=1 14=1", {"a": (200, 70), "b": (90, 200), "c": (70,)}),
    ("Gemm op 3 1 a b c out 0=1.5", {"a": (70, 200), "b": (200, 90), "c": (1, 90)}),
    ("Gemm op 1 1 a out 5=1 6=1 10=4 7=70 8=90 9=200 11=1", {"a": (70, 200)}),
]


@pytest.mark.parametrize("ksplit", [1, 2, 5], ids=lambda s: f"ksplit{s}")
@pytest.mark.parametrize("line, shapes", SPLIT_GEMMS, ids=[c[0][8:] for c in SPLIT_GEMMS])
def test_gemm_with_k_split(tmp_path, engine_device, monkeypatch, line, shapes, ksplit):  # noqa: F811
    force(monkeypatch, (1, 1), ksplit)
    check_against_ncnn(tmp_path, engine_device, line, shapes, Precision.FP16_STORAGE)


@pytest.mark.parametrize("ksplit", [2, 5], ids=lambda s: f"ksplit{s}")
def test_split_k_runs_again_and_again_to_the_same_bits(engine_device, monkeypatch, ksplit):  # noqa: F811
    """Each tile's last work group adds the partials in split order, whichever came last, and
    the tile counters are zeroed before every run: five runs of one Plan (one instance, then a
    batch of three) give the same bits, near the CPU kernels'."""
    force(monkeypatch, (1, 1), ksplit)
    m, n, k = 100, 200, 640  # 4 x 4 tiles, 10 steps of K
    graph = graph_of([f"Gemm g 1 1 a out 10=4 2=0 3=1 4=0 5=1 6=1 7={m} 8={n} 9={k}"], {"a": (m, k)}, seed=6)
    feed = feed_for({"a": (m, k)})
    with Plan(engine_device, graph, None, Precision.FP16_STORAGE) as plan:
        assert [s.shader for s in plan.steps] == ["cast_input", "gemm_coopmat", "cast_output"]
        assert len(plan.zeroed_spans) == 1
        first = plan.run(dict(feed))["out"]
        for _ in range(4):
            np.testing.assert_array_equal(plan.run(dict(feed))["out"], first)
        other = {"a": feed["a"] * 0.5}
        alone = plan.run(dict(other))["out"]
        for _ in range(2):  # each item's counters its own
            outs = [item["out"] for item in plan.run_batch([dict(feed), dict(other), dict(feed)])]
            for got, want in zip(outs, (first, alone, first)):
                np.testing.assert_array_equal(got, want)
    assert_near_cpu_kernels({"out": first}, graph, feed, Precision.FP16_STORAGE)


@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
@pytest.mark.parametrize("line, shapes", MATMUL_CASES,
                         ids=[c[0][10:] + str(list(c[1].values())) for c in MATMUL_CASES])
def test_matmul(tmp_path, engine_device, line, shapes, precision):  # noqa: F811
    check_against_ncnn(tmp_path, engine_device, line, shapes, precision)


@pytest.mark.parametrize("params, shapes", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention(tmp_path, engine_device, params, shapes):  # noqa: F811
    check_against_ncnn(tmp_path, engine_device, line_for(params, shapes), shapes, Precision.FP16_STORAGE)


@pytest.mark.parametrize("ksplit", [1, 3], ids=lambda s: f"ksplit{s}")
@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
def test_convnext_block_tail_in_one_product(engine_device, monkeypatch, precision, ksplit):  # noqa: F811
    """Linear + Permute + layer scale + residual sum as one gemm_coopmat launch (the fold
    tests of the CI suite, here on the tensor cores, with K whole and split)."""
    force(monkeypatch, (1, 1), ksplit)
    channels = 200  # K: 7 steps, split in 3
    shapes = {**TAIL_SHAPES, "x": (channels, *TAIL_SHAPES["x"][1:])}
    graph = graph_of([line.replace("9=24", f"9={channels}") for line in TAIL], shapes, seed=3)
    feed = feed_for(shapes)
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["sum"])
    assert (summary["folded_permutes"], summary["folded_scales"], summary["folded_residuals"]) == (1, 1, 1)
    products = [shader for name, shader in steps if name == "g1" and shader != "cast_output"]
    assert products == ["gemm_coopmat"]  # K split too: the last work groups add the partials
    assert_near_cpu_kernels(got, graph, feed, precision)


def norm_head(channels: int) -> list[str]:
    """convnext's block head: depthwise, channels-last, LayerNorm, the first Linear (its
    output Reshape takes the normalised blob's shape only), GELU."""
    return [
        f"ConvolutionDepthWise dw 1 1 x d 0={channels} 1=3 4=1 5=1 6={channels * 9} 7={channels}",
        "Permute p1 1 1 d hwc 0=3",
        f"LayerNorm ln 1 1 hwc normed 0={channels} 1=0.000001 2=1",
        "Split sp 1 2 normed n1 n2",
        "Reshape r0 1 1 n1 rows 6=\"0w,-1\"",
        f"Gemm g1 1 1 rows y 10=4 2=0 3=1 4=0 5=1 6=1 7=35 8=40 9={channels}",
        "Reshape r1 2 1 y n2 y3 6=\"0w,1h,1c\"",
        "GELU gelu 1 1 y3 out",
    ]


@pytest.mark.parametrize("ksplit", [1, 3], ids=lambda s: f"ksplit{s}")
@pytest.mark.parametrize("channels", [200, 45], ids=lambda c: f"k{c}")  # 45: quads across K's end
@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
def test_a_layernorm_folds_into_the_linear_after_it(engine_device, monkeypatch, precision, channels, ksplit):  # noqa: F811
    """The LayerNorm applied to A's rows as gemm_coopmat reads them (each split's work groups
    computing the rows' statistics), against the CPU kernels running the layers as written."""
    force(monkeypatch, (1, 1), ksplit)
    shapes = {"x": (channels, 5, 7)}
    graph = graph_of(norm_head(channels), shapes, seed=3)
    feed = feed_for(shapes, 2.0)
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["out"])
    assert summary["folded_norms"] == 1
    assert "ln" not in [name for name, _ in steps]
    assert_near_cpu_kernels(got, graph, feed, precision)


@pytest.mark.parametrize("ksplit", [1, 3], ids=lambda s: f"ksplit{s}")
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_in_the_epilogue(engine_device, monkeypatch, name, ksplit):  # noqa: F811
    """A Linear's activation layer folded into gemm_coopmat (applied by each tile's last work
    group when K is split)."""
    force(monkeypatch, (1, 1), ksplit)
    channels = 200
    shapes = {"x": (channels, *TAIL_SHAPES["x"][1:])}
    graph = graph_of([line.replace("9=24", f"9={channels}") for line in _mlp(ACTIVATIONS[name])], shapes, seed=3)
    feed = feed_for(shapes, 2.0)
    got, summary, steps = run_plan(engine_device, graph, feed, Precision.FP16_STORAGE, ["out"])
    assert summary["folded_activations"] == 1
    products = [shader for name_, shader in steps if name_ == "g1" and shader != "cast_output"]
    assert products == ["gemm_coopmat"]  # K split too: the last work groups add the partials
    assert_near_cpu_kernels(got, graph, feed, Precision.FP16_STORAGE)
