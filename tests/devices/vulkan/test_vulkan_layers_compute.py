"""Compute-heavy Vulkan layers (conv, pooling, innerproduct, padding, interp, crop, softmax,
LRN) against the ncnn package in fp32, on small awkward shapes.

Each case is a one-layer .param with the models package's seeded random weights; the layer's
`VulkanLayer` is built for the graph's shapes, its dispatches run in order through the one-shot
`dispatch` helper on the Vulkan device (lavapipe in CI), and the output is compared with ncnn
on the CPU in plain fp32: within 1e-4 of the reference's max abs in fp32, 2e-2 in the fp16
modes. Outputs start as NaN so an element no invocation writes fails the comparison.
Shaders compile once per (shader, precision) per session: lavapipe compiles slowly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import vkserve.devices.vulkan.layers.conv as conv_layers  # (the imports register the layer classes)
import vkserve.devices.vulkan.layers.innerproduct  # noqa: F401
import vkserve.devices.vulkan.layers.misc  # noqa: F401
import vkserve.devices.vulkan.layers.pooling  # noqa: F401
from tests.support.params import param_text
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.context import VulkanContext
from vkserve.devices.vulkan.dispatch import dispatch
from vkserve.devices.vulkan.layers import compute_util
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS, Shape
from vkserve.devices.vulkan.shader_registry import builtin_shader
from vkserve.models.graph import Graph, load_model
from vkserve.models.weights import write_bin

MODES = [Precision.FP32, Precision.FP16_PACKED, Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC]
TOLERANCE = {Precision.FP32: 1e-4, Precision.FP16_PACKED: 2e-2, Precision.FP16_STORAGE: 2e-2, Precision.FP16_ARITHMETIC: 2e-2}

SpirvFor = Callable[[str, Precision], bytes]


@pytest.fixture(scope="session")
def spirv_for(vulkan_caps: DeviceCaps) -> SpirvFor:
    @functools.cache
    def get(shader: str, precision: Precision) -> bytes:
        return compile_glsl(builtin_shader(shader).source, caps=vulkan_caps, precision=precision,
                            name=f"{shader}.comp")

    return get


def write_param(path: Path, inputs: dict[str, Shape], line: str) -> None:
    path.write_text(param_text(inputs, [line]))


def run_vulkan(ctx: VulkanContext, spirv_for: SpirvFor, graph: Graph, inputs: dict[str, np.ndarray],
               precision: Precision, push_only: bool = False) -> dict[str, np.ndarray]:
    """Run the graph's last layer on the device; `push_only` zeroes the specialization
    constants that shadow push constants, so every psc() takes the push-constant path."""
    layer = graph.layers[-1]
    in_shapes = [graph.blob_shapes[n] for n in layer.inputs]
    out_shapes = [graph.blob_shapes[n] for n in layer.outputs]
    vl = VULKAN_LAYERS[layer.type](layer, in_shapes, out_shapes, precision)
    vl.specialize(ctx.caps)
    dt = np.float32 if precision is Precision.FP32 else np.float16

    def buffer(values: np.ndarray) -> np.ndarray:
        # an even element count: fp16 packed storage addresses whole uints (two halves)
        flat = np.asarray(values, np.float32).ravel()
        return np.concatenate([flat, np.zeros(flat.size % 2, np.float32)]).astype(dt)

    blobs = {name: buffer(inputs[name]) for name in layer.inputs}
    for name, shape in zip(layer.outputs, out_shapes):
        blobs[name] = buffer(np.full(math.prod(shape), np.nan))
    blobs.update({f"w:{k}": buffer(v) for k, v in vl.weights().items()})
    blobs.update({f"s:{k}": buffer(np.zeros(n)) for k, n in vl.scratch().items()})
    for d in vl.dispatches():
        spec = d.spec_constants
        if push_only:
            spec = tuple(0 for _ in d.push_constants) + spec[len(d.push_constants):]
        results = dispatch(ctx, spirv_for(d.shader, precision), [blobs[b] for b in d.bindings],
                           global_size=d.global_size, local_size=d.local_size,
                           push_constants=d.push_constants, spec_constants=spec)
        blobs.update(zip(d.bindings, results))
    return {name: blobs[name][:math.prod(shape)].astype(np.float32).reshape(shape)
            for name, shape in zip(layer.outputs, out_shapes)}


def check_layer(tmp_path: Path, ctx: VulkanContext, spirv_for: SpirvFor, line: str,
                shapes: dict[str, Shape], precision: Precision, push_only: bool = False) -> None:
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    write_param(param, shapes, line)
    graph = load_model(param, None, shapes, seed=7)
    write_bin(graph.layers, bin_path)
    rng = np.random.default_rng(11)
    inputs = {name: rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
              for name, shape in shapes.items()}
    outputs = graph.layers[-1].outputs
    ref = run_ncnn(param, bin_path, inputs, outputs)
    got = run_vulkan(ctx, spirv_for, graph, inputs, precision, push_only)
    for name in outputs:
        want = ref[name].reshape(got[name].shape)
        scale = float(np.max(np.abs(want)))
        err = float(np.max(np.abs(got[name] - want)))  # NaN (unwritten) fails too
        assert err <= TOLERANCE[precision] * scale + 1e-6, (name, err, scale)


def conv_line(kind: str, c: int, out: int, params: str, k: tuple[int, int] = (3, 3), group: int = 1) -> str:
    size = out * (c // group) * k[0] * k[1]
    g = f" 7={group}" if kind == "ConvolutionDepthWise" else ""
    return f"{kind} op 1 1 data out 0={out} 1={k[1]} 11={k[0]} 6={size}{g} {params}"


CONV = {
    # id: (kind, input shape, num_output, params, kernel (kh, kw), group)
    "pad1-relu": ("Convolution", (3, 9, 11), 5, "4=1 5=1 9=1", (3, 3), 1),
    "dil-stride-asym-leaky": ("Convolution", (4, 10, 7), 6,
                              "2=2 12=1 3=2 13=1 4=1 15=2 14=0 16=1 5=1 9=2 -23310=1,0.1", (3, 2), 1),
    "same-upper-clip": ("Convolution", (3, 11, 10), 4, "3=2 4=-233 5=1 9=3 -23310=2,-0.3,0.4", (3, 3), 1),
    "same-lower-even-sigmoid": ("Convolution", (3, 11, 10), 4, "3=2 4=-234 5=1 9=4", (4, 4), 1),
    "pad-value-mish": ("Convolution", (2, 6, 5), 3, "4=2 18=0.5 5=1 9=5", (3, 3), 1),
    "large-pad-nobias": ("Convolution", (1, 3, 4), 2, "4=3", (3, 3), 1),
    # explicit pads of which one is negative: it crops (ncnn pads only when one is positive)
    "neg-pad-right": ("Convolution", (3, 7, 9), 2, "4=1 15=-1 5=1", (3, 3), 1),
    "neg-pad-left": ("Convolution", (3, 7, 9), 2, "4=-1 15=2 14=0 16=0 5=1", (3, 3), 1),
    "1x1-hardswish": ("Convolution", (7, 5, 9), 7, "5=1 9=6 -23310=2,0.2,0.5", (1, 1), 1),
    "1x1-wide": ("Convolution", (33, 7, 7), 13, "5=1", (1, 1), 1),
    "1x1-stride2": ("Convolution", (5, 7, 9), 6, "3=2 5=1 9=1", (1, 1), 1),
    "dw-stride2-relu": ("ConvolutionDepthWise", (5, 9, 7), 5, "3=2 4=1 5=1 9=1", (3, 3), 5),
    "dw-dil2-same": ("ConvolutionDepthWise", (6, 8, 8), 6, "2=2 4=-233 5=1 9=2 -23310=1,0.2", (5, 5), 6),
    # convdw: a partial pair of outputs at each row's end, 7x7 with a pad value; a row of inputs
    # too long for the shader's registers (9 taps dilated by 3), each tap reading its own
    "dw-7x7-blocks": ("ConvolutionDepthWise", (3, 11, 9), 3, "4=3 18=0.25 5=1", (7, 7), 3),
    "dw-wide-dilated": ("ConvolutionDepthWise", (2, 12, 21), 2, "2=3 4=-233 5=1", (9, 9), 2),
    "grouped-hardswish": ("ConvolutionDepthWise", (6, 7, 9), 10, "4=1 5=1 9=6 -23310=2,0.25,0.4", (3, 3), 2),
    "dw-multiplier": ("ConvolutionDepthWise", (3, 5, 5), 6, "4=1 5=1", (3, 3), 3),
    "deep-3x3": ("Convolution", (64, 9, 10), 9, "4=1 5=1", (3, 3), 1),
    "deep-1x1": ("Convolution", (256, 5, 3), 10, "5=1 9=1", (1, 1), 1),
    # conv_gemm over several tiles of channels and pixels and several steps of K
    "gemm-1x1-tails": ("Convolution", (75, 9, 7), 37, "5=1 9=1", (1, 1), 1),
    "gemm-3x3-deep": ("Convolution", (40, 6, 11), 70, "4=1 5=1 9=2 -23310=1,0.1", (3, 3), 1),
    "gemm-grouped-pad-value": ("ConvolutionDepthWise", (18, 7, 8), 20, "2=2 3=2 4=2 18=-0.75 5=1 9=1", (3, 3), 2),
    "gemm-5x3-stride-asym": ("Convolution", (6, 13, 12), 17, "3=2 13=1 4=2 14=1 5=1 9=3 -23310=2,-0.2,0.3",
                             (5, 3), 1),
}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", list(CONV))
def test_convolution(tmp_path, vulkan_ctx, spirv_for, case, precision):
    kind, shape, out, params, k, group = CONV[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, conv_line(kind, shape[0], out, params, k, group),
                {"data": shape}, precision)


@pytest.mark.parametrize("case, shader", [("pad1-relu", "conv_gemm"), ("1x1-wide", "conv_gemm"),
                                          ("1x1-stride2", "conv_gemm"), ("dw-stride2-relu", "convdw"),
                                          ("grouped-hardswish", "conv"), ("dw-multiplier", "conv"),
                                          ("gemm-grouped-pad-value", "conv_gemm")])
def test_convolution_shader_choice(tmp_path, case, shader):
    """The fast paths are taken where they apply (and only there)."""
    kind, shape, out, params, k, group = CONV[case]
    param = tmp_path / "case.param"
    write_param(param, {"data": shape}, conv_line(kind, shape[0], out, params, k, group))
    graph = load_model(param, None, {"data": shape}, seed=7)
    layer = graph.layers[-1]
    vl = VULKAN_LAYERS[kind](layer, [shape], [graph.blob_shapes["out"]], Precision.FP32)
    assert [d.shader for d in vl.dispatches()] == [shader]


GEMM_TILE_CASES = ["gemm-1x1-tails", "gemm-3x3-deep", "gemm-grouped-pad-value", "gemm-5x3-stride-asym"]


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_ARITHMETIC], ids=lambda p: p.value)
@pytest.mark.parametrize("tile", conv_layers.GemmTile.candidates(), ids=lambda t: f"{t.bm}x{t.bn}x{t.ks}k{t.bk}")
@pytest.mark.parametrize("case", GEMM_TILE_CASES)
def test_convolution_gemm_tiles(tmp_path, vulkan_ctx, spirv_for, monkeypatch, case, tile, precision):
    """Every conv_gemm tile shape, forced, on shapes that leave partial tiles everywhere."""
    monkeypatch.setattr(conv_layers, "choose_gemm_tile", lambda *shape: tile)
    kind, shape, out, params, k, group = CONV[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, conv_line(kind, shape[0], out, params, k, group),
                {"data": shape}, precision)


def test_convolution_gemm_tile_choice():
    """Small outputs split K over many slices; large ones take the largest tile."""
    small = conv_layers.choose_gemm_tile(1024, 49, 1024, 1)
    large = conv_layers.choose_gemm_tile(64, 224 * 224, 576, 1)
    assert small.ks >= 8 and (large.bm, large.bn, large.ks) == (64, 64, 1)
    assert conv_layers.choose_gemm_tile(64, 64 * 65536, 9, 1) is None  # grid too large: `conv`
    for t in conv_layers.GemmTile.candidates():
        assert t.bm * t.bn * t.ks == 16 * compute_util.GEMM_THREADS
        assert t.ks * t.bk * (t.bm + t.bn) <= conv_layers.GEMM_SHARED_FLOATS and t.bk <= min(t.bm, t.bn)


@pytest.mark.parametrize("case", ["pad1-relu", "1x1-wide", "dw-stride2-relu", "dw-7x7-blocks", "dw-wide-dilated",
                                  "gemm-grouped-pad-value", "grouped-hardswish"])
def test_convolution_push_constants(tmp_path, vulkan_ctx, spirv_for, case):
    kind, shape, out, params, k, group = CONV[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, conv_line(kind, shape[0], out, params, k, group),
                {"data": shape}, Precision.FP32, push_only=True)


POOLING = {
    # id: (input shape, params)
    "max-k3s2-full": ((3, 13, 11), "0=0 1=3 2=2"),
    "max-k2s2-pads": ((2, 7, 9), "0=0 1=2 2=2 3=1 14=0 13=0 15=1"),
    "max-valid": ((4, 10, 9), "0=0 1=3 2=2 5=1"),
    "max-same-upper": ((3, 9, 10), "0=0 1=3 2=2 5=2"),
    "avg-full-tail": ((3, 13, 11), "0=1 1=3 2=2 3=1"),
    "avg-include-pad": ((2, 9, 7), "0=1 1=3 2=2 3=1 6=1"),
    "avg-same-lower": ((5, 8, 11), "0=1 1=2 11=3 2=2 12=1 5=3"),
    "avg-valid-rect": ((3, 10, 9), "0=1 1=2 11=4 2=3 12=2 5=1"),
    "global-max": ((7, 13, 9), "0=0 4=1"),
    "global-avg": ((5, 3, 5), "0=1 4=1"),
    "global-avg-large": ((3, 29, 31), "0=1 4=1"),
}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", list(POOLING))
def test_pooling(tmp_path, vulkan_ctx, spirv_for, case, precision):
    shape, params = POOLING[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, f"Pooling op 1 1 data out {params}",
                {"data": shape}, precision)


@pytest.mark.parametrize("case", ["avg-full-tail", "global-avg"])
def test_pooling_push_constants(tmp_path, vulkan_ctx, spirv_for, case):
    shape, params = POOLING[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, f"Pooling op 1 1 data out {params}",
                {"data": shape}, Precision.FP32, push_only=True)


INNERPRODUCT = {
    # id: (input shape, num_output, params)
    "1d-bias": ((37,), 5, "1=1"),
    "3d-flat-relu": ((3, 5, 7), 13, "1=1 9=1"),
    "2d-flat-sigmoid": ((1, 9), 3, "1=1 9=4"),
    "long-hardswish": ((300,), 7, "1=1 9=6 -23310=2,0.2,0.5"),
    "rows-nobias-leaky": ((3, 10), 6, "9=2 -23310=1,0.1"),
    "3d-mish": ((2, 3, 3), 4, "1=1 9=5"),
    "deep": ((2048,), 10, "1=1"),
    # innerproduct_vec4 (num_input % 4 == 0): rows of vec4s, a tail past the pairs of strides
    "rows-vec4-relu": ((3, 12), 5, "1=1 9=1"),
    "vec4-tail": ((524,), 6, "1=1"),
}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", list(INNERPRODUCT))
def test_innerproduct(tmp_path, vulkan_ctx, spirv_for, case, precision):
    shape, out, params = INNERPRODUCT[case]
    num_input = shape[-1] if len(shape) == 2 and shape[0] > 1 else math.prod(shape)
    check_layer(tmp_path, vulkan_ctx, spirv_for,
                f"InnerProduct op 1 1 data out 0={out} 2={out * num_input} {params}",
                {"data": shape}, precision)


@pytest.mark.parametrize("shape", [(37,), (3, 5, 8)])
def test_innerproduct_push_constants(tmp_path, vulkan_ctx, spirv_for, shape):
    n = math.prod(shape)
    check_layer(tmp_path, vulkan_ctx, spirv_for, f"InnerProduct op 1 1 data out 0=5 2={5 * n} 1=1 9=1",
                {"data": shape}, Precision.FP32, push_only=True)


@pytest.mark.parametrize("case, shader", [("3d-flat-relu", "innerproduct"), ("deep", "innerproduct_vec4"),
                                          ("rows-vec4-relu", "innerproduct_vec4"),
                                          ("rows-nobias-leaky", "innerproduct")])
def test_innerproduct_shader_choice(tmp_path, case, shader):
    shape, out, params = INNERPRODUCT[case]
    num_input = shape[-1] if len(shape) == 2 and shape[0] > 1 else math.prod(shape)
    param = tmp_path / "case.param"
    write_param(param, {"data": shape}, f"InnerProduct op 1 1 data out 0={out} 2={out * num_input} {params}")
    graph = load_model(param, None, {"data": shape}, seed=7)
    vl = VULKAN_LAYERS["InnerProduct"](graph.layers[-1], [shape], [graph.blob_shapes["out"]], Precision.FP32)
    assert [d.shader for d in vl.dispatches()] == [shader]


MISC = {
    # id: (layer line, input shapes)
    "pad-const-front-behind": ("Padding op 1 1 data out 0=2 1=1 2=3 3=0 5=0.5 7=1 8=2", {"data": (3, 5, 6)}),
    "pad-replicate": ("Padding op 1 1 data out 0=1 1=2 2=2 3=1 4=1", {"data": (2, 5, 7)}),
    "pad-reflect": ("Padding op 1 1 data out 0=2 1=1 2=1 3=3 4=2", {"data": (2, 5, 7)}),
    "pad-2d": ("Padding op 1 1 data out 0=1 1=1 2=2 3=2 5=-1.5", {"data": (4, 5)}),
    "pad-1d": ("Padding op 1 1 data out 2=3 3=1 5=2.0", {"data": (9,)}),
    "pad-per-channel": ("Padding op 1 1 data out 0=1 1=1 2=1 3=1 6=3", {"data": (3, 4, 5)}),
    "crop-channels": ("Crop op 1 1 data out -23309=1,2 -23310=1,5 -23311=1,0", {"data": (7, 4, 5)}),
    "crop-offsets-sizes": ("Crop op 1 1 data out 0=1 1=2 2=1 3=3 4=4 5=2", {"data": (4, 8, 7)}),
    "crop-negative-hw": ("Crop op 1 1 data out -23309=2,1,-5 -23310=2,-1,-233 -23311=2,1,2",
                         {"data": (2, 6, 9)}),
    "crop-2d": ("Crop op 1 1 data out 0=2 1=1 3=4 4=3", {"data": (6, 9)}),
    "crop-reference": ("Crop op 2 1 data ref out 0=1 1=2", {"data": (3, 7, 8), "ref": (3, 4, 5)}),
    "interp-bilinear-up": ("Interp op 1 1 data out 0=2 1=2.0 2=2.0", {"data": (3, 5, 7)}),
    "interp-bilinear-down": ("Interp op 1 1 data out 0=2 1=0.5 2=0.5", {"data": (3, 10, 9)}),
    "interp-bilinear-align": ("Interp op 1 1 data out 0=2 3=7 4=11 6=1", {"data": (2, 4, 5)}),
    "interp-nearest-up": ("Interp op 1 1 data out 0=1 1=2.0 2=2.0", {"data": (3, 5, 6)}),
    "interp-nearest-size": ("Interp op 1 1 data out 0=1 3=9 4=5", {"data": (2, 4, 7)}),
    "softmax-1d-long": ("Softmax op 1 1 data out", {"data": (1000,)}),
    "softmax-1d-short": ("Softmax op 1 1 data out", {"data": (10,)}),
    "softmax-2d-rows": ("Softmax op 1 1 data out 0=1 1=1", {"data": (5, 37)}),
    "softmax-2d-cols": ("Softmax op 1 1 data out 0=0 1=1", {"data": (37, 5)}),
    "softmax-3d-channels": ("Softmax op 1 1 data out 0=0 1=1", {"data": (3, 6, 7)}),
    "softmax-3d-h": ("Softmax op 1 1 data out 0=1 1=1", {"data": (4, 40, 3)}),
    "softmax-3d-last": ("Softmax op 1 1 data out 0=-1 1=1", {"data": (3, 5, 70)}),
    "lrn-across-3": ("LRN op 1 1 data out 0=0 1=3", {"data": (7, 5, 6)}),
    "lrn-across-wide": ("LRN op 1 1 data out 0=0 1=5 2=2.0 3=0.6 4=2.0", {"data": (3, 4, 9)}),
    "lrn-within": ("LRN op 1 1 data out 0=1 1=3 2=1.5", {"data": (2, 7, 6)}),
}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", list(MISC))
def test_misc_layers(tmp_path, vulkan_ctx, spirv_for, case, precision):
    line, shapes = MISC[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, line, shapes, precision)


@pytest.mark.parametrize("case", ["pad-const-front-behind", "crop-offsets-sizes", "interp-bilinear-down",
                                  "softmax-3d-h", "softmax-3d-channels", "lrn-within"])
def test_misc_layers_push_constants(tmp_path, vulkan_ctx, spirv_for, case):
    line, shapes = MISC[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, line, shapes, Precision.FP32, push_only=True)


def test_depthwise_outputs_per_invocation():
    """Two neighbouring outputs share a row of inputs where it fits convdw's registers."""
    assert conv_layers.depthwise_outputs(56, 7, 1, 1) == 2
    assert conv_layers.depthwise_outputs(112, 3, 2, 1) == 2
    assert conv_layers.depthwise_outputs(1, 3, 1, 1) == 1
    assert conv_layers.depthwise_outputs(21, 9, 1, 3) == 1  # 26 inputs a row: each tap reads its own
