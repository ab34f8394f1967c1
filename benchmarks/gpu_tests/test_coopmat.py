"""conv_coopmat.comp (tensor-core convolutions) against ncnn, on a device that has them.

Not part of the CI suite (lavapipe offers no VK_KHR_cooperative_matrix; pytest's testpaths is
tests/): run on the GPU machine by benchmarks/gpu_coopmat.sh. A device without the extension
fails here rather than skipping, so a run on the wrong machine cannot pass unnoticed.
"""

from __future__ import annotations

import numpy as np
import pytest

import vkserve.devices.vulkan.layers.conv as conv_layers
from tests.conftest import vulkan_caps, vulkan_ctx  # noqa: F401 (fixtures)
from tests.devices.vulkan.test_vulkan_layers_compute import (  # noqa: F401 (spirv_for: a fixture)
    CONV,
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
from vkserve.devices.vulkan.coopmat import fp16_coopmat
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS
from vkserve.models.graph import load_model

FP16 = [Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC]


@pytest.fixture(autouse=True)
def coopmat_on(monkeypatch):
    monkeypatch.setenv("VKSERVE_COOPMAT", "1")

# every CONV case conv_coopmat takes (>= 16 output channels per group, K >= 32), and larger ones
# with many K steps, several channel and pixel tiles, grouped and strided
CASES = {
    **{k: v for k, v in CONV.items() if k in ("gemm-1x1-tails", "gemm-3x3-deep", "gemm-5x3-stride-asym")},
    "3x3-128-to-96": ("Convolution", (128, 30, 29), 96, "4=1 5=1 9=1", (3, 3), 1),
    "1x1-512-to-200": ("Convolution", (512, 14, 13), 200, "5=1 9=2 -23310=1,0.1", (1, 1), 1),
    "7x7-stride2": ("Convolution", (3, 61, 64), 64, "3=2 4=3 5=1 9=1", (7, 7), 1),
    "grouped-32": ("ConvolutionDepthWise", (64, 17, 15), 64, "4=1 5=1 9=6 -23310=2,0.2,0.5", (3, 3), 2),
    "dilated-pad-value": ("Convolution", (24, 19, 21), 40, "2=2 4=2 18=0.25 5=1", (3, 3), 1),
    # few output tiles and a long K: the layer's rule splits K (partials + the reduce pass)
    "3x3-256-split": ("Convolution", (256, 14, 14), 256, "4=1 5=1 9=1", (3, 3), 1),
    "3x3-512-7x7-split": ("Convolution", (512, 7, 7), 96, "4=1 5=1 9=2 -23310=1,0.1", (3, 3), 1),
    "grouped-split": ("ConvolutionDepthWise", (128, 9, 9), 64, "4=1 5=1 9=6 -23310=2,0.2,0.5", (3, 3), 2),
}
SPLIT = ("3x3-256-split", "3x3-512-7x7-split", "grouped-split")


def test_device_offers_fp16_products(vulkan_caps):  # noqa: F811
    assert fp16_coopmat(vulkan_caps, Precision.FP16_STORAGE), vulkan_caps.cooperative_matrix_shapes


@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
@pytest.mark.parametrize("case", list(CASES))
def test_coopmat_convolution(tmp_path, vulkan_ctx, spirv_for, case, precision):  # noqa: F811
    kind, shape, out, params, k, group = CASES[case]
    line = conv_line(kind, shape[0], out, params, k, group)
    write_param(tmp_path / "choice.param", {"data": shape}, line)
    graph = load_model(tmp_path / "choice.param", None, {"data": shape}, seed=7)
    vl = VULKAN_LAYERS[kind](graph.layers[-1], [shape], [graph.blob_shapes["out"]], precision)
    vl.specialize(vulkan_ctx.caps)
    split = vl.coop_tile.ksplit > 1
    assert split or case not in SPLIT
    assert [d.shader for d in vl.dispatches()] == ["conv_coopmat"] * (2 if split else 1)
    check_layer(tmp_path, vulkan_ctx, spirv_for, line, {"data": shape}, precision)


@pytest.mark.parametrize("defer", [False, True], ids=lambda d: "bounded-when-stored" if d else "bounded-when-read")
@pytest.mark.parametrize("split", [1, 3], ids=lambda s: f"ksplit{s}")
@pytest.mark.parametrize("tile", conv_layers.COOP_TILES, ids=lambda t: f"fm{t[0]}fn{t[1]}")
@pytest.mark.parametrize("case", ["gemm-1x1-tails", "3x3-128-to-96", "grouped-32", "dilated-pad-value"])
def test_coopmat_forced_tiles(tmp_path, vulkan_ctx, spirv_for, monkeypatch, case, tile, split, defer):  # noqa: F811
    """Every tile, with K whole and split in 3 (the last split shorter when the steps do not
    divide), the gathered values bounded as they are read and as they are stored."""
    def choose(m, n, steps, groups):
        per = -(-steps // split)
        return conv_layers.CoopTile(*tile, -(-steps // per), per)

    monkeypatch.setattr(conv_layers, "choose_coop_tile", choose)
    monkeypatch.setattr(conv_layers, "coop_defers", lambda tile, grid: defer)
    kind, shape, out, params, k, group = CASES[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, conv_line(kind, shape[0], out, params, k, group),
                {"data": shape}, Precision.FP16_STORAGE)


RESIDUAL = [
    # split K (reduce pass adds the residual) and whole K (the epilogue does)
    "Convolution c1 1 1 x a 0=64 1=3 4=1 5=1 6=36864",
    "Eltwise s1 2 1 a x b 0=1",
    "ReLU r1 1 1 b c",
    "Convolution c2 1 1 c d 0=64 1=1 5=1 6=4096",
    "BinaryOp s2 2 1 d c e 0=0",
]


@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
def test_coopmat_folds_residual_sums(engine_device, precision):  # noqa: F811
    shapes = {"x": (64, 14, 14)}
    graph = graph_of(RESIDUAL, shapes, seed=4)
    feed = {"x": np.random.default_rng(2).uniform(-1, 1, shapes["x"]).astype(np.float32)}
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["e"])
    assert summary["folded_residuals"] == 2
    assert [name for name, shader in steps if shader == "conv_coopmat"] == ["c1", "c1", "c2"]
    assert_near_cpu_kernels(got, graph, feed, precision)


@pytest.mark.parametrize("precision", FP16, ids=lambda p: p.value)
def test_coopmat_batch_in_one_dispatch(engine_device, precision):  # noqa: F811
    """A batch of 3 through conv_coopmat with K split (partials and reduce per item) and whole,
    the residuals folded: one dispatch per step for the batch, every item equal to its run alone."""
    shapes = {"x": (64, 14, 14)}
    graph = graph_of(RESIDUAL, shapes, seed=4)
    feeds = [{"x": np.random.default_rng(s).uniform(-1, 1, shapes["x"]).astype(np.float32)} for s in range(3)]
    with Plan(engine_device, graph, None, precision, outputs=["e"], max_instances=1) as plan:
        alone = [plan.run(feed) for feed in feeds]
        together = plan.run_batch(feeds)
        coop = [k for k, step in enumerate(plan.steps) if step.shader == "conv_coopmat"]
        assert len(coop) == 3
        with plan.acquire(batch=3) as inst:
            assert all(len(inst.sets[k]) == 1 for k in coop)
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(b["e"], a["e"])
    assert not np.array_equal(alone[0]["e"], alone[1]["e"])
