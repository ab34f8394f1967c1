"""A LayerNorm over the rows of a Gemm's A folded into the product (engine.fusion's
fold_row_norms): decided on a device as if it had cooperative matrices (the CI device has
none, so the product itself runs on the GPU machine: benchmarks/gpu_tests/test_gemm_coopmat.py).
Where it applies, the LayerNorm becomes an alias of its input and the gemm_coopmat launch
normalises A's rows with the LayerNorm's own gamma, beta and epsilon; where anything else
reads the normalised values, or the product would not run on gemm_coopmat, nothing folds."""

from __future__ import annotations

import numpy as np
import pytest

from tests.devices.vulkan.test_gemm_coopmat_choice import coop_caps  # noqa: F401 (fixture)
from tests.support.vulkan_engine import graph_of
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.engine.fusion import fold_permutes, fold_row_norms
from vkserve.devices.vulkan.engine.plan import load_layer_modules
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS
from vkserve.devices.vulkan.layers.matmul import VulkanGemm
from vkserve.devices.vulkan.layers.norm import VulkanLayerNorm

CHANNELS, PIXELS, OUT = 96, 3136, 384  # convnext_tiny's first stage
SHAPES = {"x": (CHANNELS, 56, 56)}
# convnext's block head as pnnx writes it: depthwise, channels-last, LayerNorm, the first Linear
HEAD = [
    f"ConvolutionDepthWise dw 1 1 x d 0={CHANNELS} 1=7 4=3 5=1 6={CHANNELS * 49} 7={CHANNELS}",
    "Permute p1 1 1 d hwc 0=3",
    f"LayerNorm ln 1 1 hwc normed 0={CHANNELS} 1=0.000001 2=1",
    "Split sp 1 2 normed n1 n2",
    "Reshape r0 1 1 n1 rows 6=\"0w,-1\"",
    f"Gemm g1 1 1 rows y 10=4 2=0 3=1 4=0 5=1 6=1 7={PIXELS} 8={OUT} 9={CHANNELS}",
    "Reshape r1 2 1 y n2 y3 6=\"0w,1h,1c\"",  # n2: only the shape of its h and c
]


def entries(lines, caps, precision=Precision.FP16_STORAGE):
    load_layer_modules()
    graph = graph_of(lines, SHAPES, seed=5)
    out = []
    for layer in graph.layers:
        if layer.type == "Input":
            continue
        vl = VULKAN_LAYERS[layer.type](layer, [graph.blob_shapes[b] for b in layer.inputs],
                                       [graph.blob_shapes[b] for b in layer.outputs], precision)
        vl.specialize(caps)
        out.append((layer, vl))
    folded, _ = fold_permutes(out, graph.blob_shapes, set())
    return graph, folded


def parts(found):
    norm = next(vl for _, vl in found if isinstance(vl, VulkanLayerNorm))
    gemm = next(vl for _, vl in found if isinstance(vl, VulkanGemm))
    return norm, gemm


def test_the_layernorm_before_a_linear_is_read_normalised(coop_caps, monkeypatch):  # noqa: F811
    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    graph, found = entries(HEAD, coop_caps)
    assert fold_row_norms(found, {"y3"}) == 1
    norm, gemm = parts(found)
    assert norm.aliases_input and norm.dispatches() == [] and norm.weights() == {}
    product = gemm.dispatches()[0]
    assert product.shader == "gemm_coopmat"  # K = 96: by the size rule gemm.comp, here normalising
    assert product.bindings[6:8] == ("w:norm_gamma", "w:norm_beta")
    assert product.spec_constants[-3:-1] == (1, pytest.approx(1e-6))
    ln = next(layer for layer in graph.layers if layer.name == "ln")
    weights = gemm.weights()
    np.testing.assert_array_equal(weights["norm_gamma"], np.asarray(ln.weights[0], np.float32).ravel())
    np.testing.assert_array_equal(weights["norm_beta"], np.asarray(ln.weights[1], np.float32).ravel())
    assert fold_row_norms(found, {"y3"}) == 0  # once


@pytest.mark.parametrize("case", ["values read elsewhere", "requested", "no tensor cores", "fp32", "VKSERVE_COOPMAT=0"])
def test_nothing_folds_where_the_normalised_values_are_needed(coop_caps, vulkan_caps, monkeypatch, case):  # noqa: F811
    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    lines, keep, caps, precision = list(HEAD), {"y3"}, coop_caps, Precision.FP16_STORAGE
    if case == "values read elsewhere":  # the Split's other output feeds a layer's values
        lines = [*lines[:5], f"Gemm g1 1 1 rows y0 10=4 2=0 3=1 4=0 5=1 6=1 7={PIXELS} 8={CHANNELS} 9={CHANNELS}",
                 "Reshape r1 2 1 y0 n2 y 6=\"0w,1h,1c\"", "BinaryOp b 2 1 y n2 y3 0=0"]
    elif case == "requested":
        keep = {"y3", "normed"}
    elif case == "no tensor cores":
        caps = vulkan_caps  # lavapipe
    elif case == "fp32":
        precision = Precision.FP32
    else:
        monkeypatch.setenv("VKSERVE_COOPMAT", "0")
    _, found = entries(lines, caps, precision)
    assert fold_row_norms(found, keep) == 0
    norm, gemm = parts(found)
    assert not norm.aliases_input and len(norm.dispatches()) == 1
    assert all(d.spec_constants[-3] == 0 for d in gemm.dispatches() if d.shader == "gemm_coopmat")


def test_a_layernorm_over_the_channels_of_a_channels_first_blob_stays(coop_caps, monkeypatch):  # noqa: F811
    """Strided runs (the stem's folded Permute pair) are not A's rows."""
    monkeypatch.delenv("VKSERVE_COOPMAT", raising=False)
    _, found = entries(HEAD, coop_caps)
    norm, _ = parts(found)
    norm.take_channels_first("x", SHAPES["x"], "normed")
    assert norm.row_norm() is None
