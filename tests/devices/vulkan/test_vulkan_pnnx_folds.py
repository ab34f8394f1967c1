"""The folds of pnnx's channels-last blocks (engine.fusion): a Linear (Gemm, Reshape with a
shape reference, Permute back to channels-first) becomes one Gemm writing its output
transposed, a depthwise convolution followed by a Permute to channels-last stores that way
itself, and convnext's block tail ``x + scale * Linear(y)`` becomes that one Gemm (the scale in
its weights, the sum in its epilogue). Where the folds apply and where they must not, outputs
against the CPU kernels in every mode."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.vulkan_engine import (  # noqa: F401 (engine_device: a fixture)
    MODES,
    assert_near_cpu_kernels,
    engine_device,
    graph_of,
    run_plan,
)
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.layers import norm as norm_layers

SHAPES = {"x": (24, 5, 7)}  # channels-first, 35 pixels, as after convnext's depthwise layer
def feed_for(shapes: dict[str, tuple[int, ...]], spread: float = 1.0) -> dict[str, np.ndarray]:
    """Seeded inputs of `shapes`, uniform in [-spread, spread] (one generator, in order)."""
    rng = np.random.default_rng(1)
    return {k: rng.uniform(-spread, spread, v).astype(np.float32) for k, v in shapes.items()}


HEAD = [
    "Permute p0 1 1 x hwc 0=3",              # (24, 5, 7) -> (5, 7, 24): kept (an input)
    "Split sp 1 2 hwc hwc1 hwc2",
    "Reshape r0 1 1 hwc1 rows 6=\"0w,-1\"",   # (35, 24): pixels x channels
]
LINEAR = [
    *HEAD,
    "Gemm g1 1 1 rows y 10=4 2=0 3=1 4=0 5=1 6=1 7=35 8=40 9=24",
    "Reshape r1 2 1 y hwc2 y3 6=\"0w,1h,1c\"",  # (5, 7, 40), the shape of hwc2's h and c
    "Permute p1 1 1 y3 out 0=4",                # -> (40, 5, 7): channels-first again
]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_a_linear_writes_its_output_channels_first(engine_device: VulkanDevice,  # noqa: F811
                                                   precision: Precision) -> None:
    graph = graph_of(LINEAR, SHAPES, seed=3)
    feed = feed_for(SHAPES)
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["out"])
    assert summary["folded_permutes"] == 1
    assert got["out"].shape == (40, 5, 7)
    recorded = [name for name, _ in steps]
    assert "p1" not in recorded and "g1" in recorded and "p0" in recorded
    assert_near_cpu_kernels(got, graph, feed, precision)


DEPTHWISE = [
    # convnext's block head: depthwise 7x7 (here 3x3, with a ReLU), then channels-last
    "ConvolutionDepthWise dw 1 1 x d 0=24 1=3 4=1 5=1 6=216 7=24 9=1",
    "Permute p1 1 1 d out 0=3",
    "LayerNorm ln 1 1 out normed 0=24 1=0.000001 2=1",
]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_a_depthwise_convolution_stores_channels_last(engine_device: VulkanDevice,  # noqa: F811
                                                      precision: Precision) -> None:
    graph = graph_of(DEPTHWISE, SHAPES, seed=3)
    feed = feed_for(SHAPES)
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["out", "normed"])
    assert summary["folded_permutes"] == 1
    assert got["out"].shape == (5, 7, 24)
    assert "p1" not in [name for name, _ in steps] and ("dw", "convdw") in steps
    assert_near_cpu_kernels(got, graph, feed, precision)


KEPT = {
    # the Gemm's output is read by another layer too: it must exist in its own order
    "read twice": [*LINEAR[:-1], "Permute p1 1 1 y3 out 0=4", "Sigmoid s 1 1 y other"],
    # the Permute is not a transpose of the (35, 40) matrix
    "not a transpose": [*LINEAR[:-1], "Permute p1 1 1 y3 out 0=1"],
    # the Gemm already writes transposed (output_transpose): folding flips it back
    # a convolution other than depthwise does not write channels-last
    "full convolution": ["Convolution c 1 1 x d 0=8 1=3 4=1 5=1 6=1728", "Permute p1 1 1 d out 0=3"],
    # a depthwise convolution's output read before the Permute too
    "depthwise read twice": [*DEPTHWISE[:2], "Sigmoid s 1 1 d other"],
    "output_transpose": [*HEAD, "Gemm g1 1 1 rows y 10=4 2=0 3=1 4=0 5=1 6=1 7=35 8=40 9=24 14=1",
                         "Permute p1 1 1 y out 0=1"],
}


@pytest.mark.parametrize("case", list(KEPT))
def test_folds_only_a_transpose_nobody_else_needs(engine_device: VulkanDevice, case: str) -> None:  # noqa: F811
    graph = graph_of(KEPT[case], SHAPES, seed=3)
    feed = feed_for(SHAPES)
    outputs = ["out", "other"] if case.endswith("read twice") else ["out"]
    got, summary, steps = run_plan(engine_device, graph, feed, Precision.FP32, outputs)
    assert summary["folded_permutes"] == (1 if case == "output_transpose" else 0)
    assert ("p1" in [name for name, _ in steps]) == (case != "output_transpose")
    assert_near_cpu_kernels(got, graph, feed, Precision.FP32)


def test_a_requested_intermediate_stays(engine_device: VulkanDevice) -> None:  # noqa: F811
    graph = graph_of(LINEAR, SHAPES, seed=3)
    feed = feed_for(SHAPES)
    got, summary, _ = run_plan(engine_device, graph, feed, Precision.FP32, ["out", "y"])
    assert summary["folded_permutes"] == 0
    assert_near_cpu_kernels(got, graph, feed, Precision.FP32)


TAIL = [
    *LINEAR,
    "MemoryData ls 0 1 s 0=1 1=1 2=40",          # a per-channel layer scale (40, 1, 1)
    "BinaryOp m1 2 1 s out scaled 0=2",
    "BinaryOp a1 2 1 scaled r sum 0=0",          # + the block's shortcut
]
TAIL_SHAPES = {**SHAPES, "r": (40, 5, 7)}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_a_block_tail_is_one_gemm(engine_device: VulkanDevice, precision: Precision) -> None:  # noqa: F811
    graph = graph_of(TAIL, TAIL_SHAPES, seed=3)
    feed = feed_for(TAIL_SHAPES)
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["sum"])
    assert (summary["folded_permutes"], summary["folded_scales"], summary["folded_residuals"]) == (1, 1, 1)
    recorded = {name for name, _ in steps}
    assert "g1" in recorded and not recorded & {"p1", "m1", "a1"}
    assert_near_cpu_kernels(got, graph, feed, precision)


TAIL_KEPT = {
    # a scale per element, not per output column: the multiply stays, and so does the sum
    "per element": [*LINEAR, "MemoryData ls 0 1 s 0=7 1=5 2=40", *TAIL[-2:]],
    # the scaled output is requested: the multiply and the sum stay apart
    "requested": TAIL,
}


@pytest.mark.parametrize("case", list(TAIL_KEPT))
def test_a_scale_folds_only_per_output_column(engine_device: VulkanDevice, case: str) -> None:  # noqa: F811
    graph = graph_of(TAIL_KEPT[case], TAIL_SHAPES, seed=3)
    feed = feed_for(TAIL_SHAPES)
    outputs = ["sum", "scaled"] if case == "requested" else ["sum"]
    got, summary, steps = run_plan(engine_device, graph, feed, Precision.FP32, outputs)
    assert summary["folded_permutes"] == 1
    if case == "per element":
        assert (summary["folded_scales"], summary["folded_residuals"]) == (0, 0)
    else:  # the scale folds (the Gemm writes "scaled"); the sum cannot take a requested operand
        assert (summary["folded_scales"], summary["folded_residuals"]) == (1, 0)
    assert_near_cpu_kernels(got, graph, feed, Precision.FP32)


def _mlp(activation: str) -> list[str]:
    """pnnx's MLP head: Linear, Reshape back (a shape reference), an activation layer."""
    return [*HEAD, "Gemm g1 1 1 rows y 10=4 2=0 3=1 4=0 5=1 6=1 7=35 8=40 9=24",
            "Reshape r1 2 1 y hwc2 y3 6=\"0w,1h,1c\"", activation]


ACTIVATIONS = {
    "gelu-erf": "GELU act 1 1 y3 out",
    "gelu-tanh": "GELU act 1 1 y3 out 0=1",
    "sigmoid": "Sigmoid act 1 1 y3 out",
    "relu-leaky": "ReLU act 1 1 y3 out 0=0.1",
}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_an_activation_after_a_linear_is_its_epilogue(engine_device: VulkanDevice,  # noqa: F811
                                                      name: str, precision: Precision) -> None:
    graph = graph_of(_mlp(ACTIVATIONS[name]), SHAPES, seed=3)
    feed = feed_for(SHAPES, 2.0)
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["out"])
    assert summary["folded_activations"] == 1
    recorded = {name for name, _ in steps}
    assert "g1" in recorded and not recorded & {"act", "r1"}
    assert_near_cpu_kernels(got, graph, feed, precision)


ACTIVATION_KEPT = {
    # the Gemm's output is read by another layer too
    "read twice": [*_mlp(ACTIVATIONS["gelu-erf"]), "TanH t 1 1 y3 other"],
    # an activation the GEMM shaders do not have
    "tanh": _mlp("TanH act 1 1 y3 out"),
    # a sum after an activation folded in stays a layer (the sum would come after it)
    "sum after": [*_mlp(ACTIVATIONS["gelu-erf"]), "BinaryOp a1 2 1 out r other 0=0"],
}


@pytest.mark.parametrize("case", list(ACTIVATION_KEPT))
def test_an_activation_folds_only_where_nothing_is_lost(engine_device: VulkanDevice, case: str) -> None:  # noqa: F811
    shapes = {**SHAPES, "r": (5, 7, 40)}
    graph = graph_of(ACTIVATION_KEPT[case], shapes, seed=3)
    feed = feed_for(shapes, 2.0)
    outputs = {"tanh": ["out"], "read twice": ["out", "other"], "sum after": ["other"]}[case]
    got, summary, steps = run_plan(engine_device, graph, feed, Precision.FP32, outputs)
    assert summary["folded_activations"] == (1 if case == "sum after" else 0)
    assert summary["folded_residuals"] == 0
    assert_near_cpu_kernels(got, graph, feed, Precision.FP32)


CHANNEL_NORM = [  # convnext's stem and downsampling: LayerNorm over the channels of (c, h, w)
    "Permute p1 1 1 x hwc 0=3",
    "LayerNorm ln 1 1 hwc normed 0=24 1=0.000001 2=1",
    "Permute p2 1 1 normed out 0=4",
    "Sigmoid s 1 1 out after",
]


@pytest.mark.parametrize("runs", [1, 4, 16], ids=lambda r: f"{r}-runs-a-group")
@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_a_layernorm_between_permutes_runs_over_the_channels(engine_device: VulkanDevice,  # noqa: F811
                                                             precision: Precision, runs: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with several runs (pixels) a work group (large maps; forced here on 35 pixels: the
    last group part-filled)."""
    monkeypatch.setattr(norm_layers, "strided_runs", lambda pixels: runs)
    graph = graph_of(CHANNEL_NORM, SHAPES, seed=3)
    feed = feed_for(SHAPES, 2.0)
    got, summary, steps = run_plan(engine_device, graph, feed, precision, ["out", "after"])
    assert summary["folded_permutes"] == 2
    assert [name for name, shader in steps if shader != "cast_output"][-2:] == ["ln", "s"]
    assert_near_cpu_kernels(got, graph, feed, precision)


CHANNEL_NORM_KEPT = {
    # the channels-last blob is requested
    "requested": (CHANNEL_NORM, ["out", "hwc"]),
    # the second Permute does not go back to channels-first
    "not the inverse": ([*CHANNEL_NORM[:2], "Permute p2 1 1 normed out 0=1", CHANNEL_NORM[3]], ["after"]),
    # the LayerNorm runs over more than the channels (w x c)
    "wider runs": ([CHANNEL_NORM[0], "LayerNorm ln 1 1 hwc normed 0=168 1=0.000001 2=1", *CHANNEL_NORM[2:]],
                   ["after"]),
}


@pytest.mark.parametrize("case", list(CHANNEL_NORM_KEPT))
def test_a_channel_norm_folds_only_its_own_pattern(engine_device: VulkanDevice, case: str) -> None:  # noqa: F811
    lines, outputs = CHANNEL_NORM_KEPT[case]
    graph = graph_of(lines, SHAPES, seed=3)
    feed = feed_for(SHAPES, 2.0)
    got, summary, _ = run_plan(engine_device, graph, feed, Precision.FP32, outputs)
    assert summary["folded_permutes"] == 0
    assert_near_cpu_kernels(got, graph, feed, Precision.FP32)


def test_several_pixels_a_work_group_only_where_the_map_is_large() -> None:
    """Four pixels (runs) a group where that still leaves 512 groups: convnext's 56 x 56
    LayerNorms; its 28 x 28, 14 x 14 and final (one pixel) ones keep one."""
    assert [norm_layers.strided_runs(n) for n in (3136, 2048, 2047, 784, 196, 1)] == [4, 4, 1, 1, 1, 1]
