"""Plan-time rewrites and shortcuts of the CPU executor (issue 4, second speed-up round).

- activation layers fused into the producing Convolution / InnerProduct / Eltwise / BinaryOp /
  Linear Gemm, also through a Reshape between them (one bf16 store instead of two): still within the verify tolerance against ncnn, equal to
  the unfused plan up to the one bf16 rounding removed, and not done when the blob between is
  read elsewhere or requested as an output;
- data-movement layers run on the bf16 bits (no widen / narrow): bit-exact;
- exact stores (max pooling, ReLU) give the same bits as RNE narrowing;
- work split over threads gives the same bits as one thread.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_cpu_layers import check, conv_line, rand, write_param

from vkserve.devices.cpu import threads
from vkserve.devices.cpu.bf16 import narrow_exact_into, round_bf16, to_bf16
from vkserve.devices.cpu.executor import Plan, StepKind
from vkserve.devices.cpu.jit.epilogue import OP_CLIP, OP_HARDSWISH, OP_NONE, OP_RELU
from vkserve.models.graph import load_model

ACTIVATIONS = [
    "ReLU act 1 1 mid out",
    "ReLU act 1 1 mid out 0=0.1",
    "Clip act 1 1 mid out 0=-0.2 1=0.3",
    "Sigmoid act 1 1 mid out",
    "Swish act 1 1 mid out",
    "HardSigmoid act 1 1 mid out 0=0.2 1=0.5",
    "HardSwish act 1 1 mid out 0=0.2 1=0.5",
    "GELU act 1 1 mid out",
    "GELU act 1 1 mid out 0=1",
]
#: x (4, 9, 11) as 36 rows of 11 into pnnx's Linear form (N = 7)
ROWS = "Reshape rows 1 1 data d2 0=11 1=36"
LINEAR = "Gemm fc 1 1 d2 mid 10=4 2=0 3=1 4=0 5=1 6=1 7=36 8=7 9=11"


def plans(tmp_path: Path, lines: list[str], inputs: dict[str, np.ndarray], **kw: object) -> tuple[Plan, Plan]:
    param = tmp_path / "case.param"
    write_param(param, inputs, lines)
    graph = load_model(param, None, {n: a.shape for n, a in inputs.items()}, seed=7)
    return Plan(graph, **kw), Plan(graph, fuse=False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("producer", ["conv", "dw", "fc", "eltwise", "binary", "linear", "linear-reshape"])
def test_fused_activation_matches_ncnn_and_unfused(tmp_path: Path, producer: str, act: str) -> None:
    x = rand(4, 9, 11)
    if producer == "conv":
        first = [conv_line("Convolution", 4, 6, "4=1 5=1").replace(" out ", " mid ")]
    elif producer == "dw":
        first = [conv_line("ConvolutionDepthWise", 4, 4, "4=1 5=1", group=4).replace(" out ", " mid ")]
    elif producer == "fc":
        first = [f"InnerProduct fc 1 1 data mid 0=7 1=1 2={7 * 4 * 9 * 11}"]
    elif producer == "eltwise":
        first = ["Split sp 1 2 data a b", "Eltwise el 2 1 a b mid 0=1"]
    elif producer == "linear":
        first = [ROWS, LINEAR]
    elif producer == "linear-reshape":  # as pnnx writes an MLP: the Gemm's rows shaped back first
        first = [ROWS, LINEAR.replace(" mid ", " g "), "Reshape back 1 1 g mid 0=7 1=9 2=4"]
    else:
        first = ["Split sp 1 2 data a b", "BinaryOp bo 2 1 a b mid 0=2"]
    lines = first + [act]
    check(tmp_path, lines, {"data": x})
    fused, plain = plans(tmp_path, lines, {"data": x})
    assert len(fused.fused) == 1 and not plain.fused
    a, b = fused.run({"data": x})["out"], plain.run({"data": x})["out"]
    # the unfused plan rounds the blob between to bf16 once more: at most a few bf16 ulps
    scale = float(np.abs(b).max()) or 1.0
    assert np.abs(a - b).max() <= 2 ** -6 * scale


def test_no_fusion_when_blob_is_shared_or_requested(tmp_path: Path) -> None:
    x = rand(3, 8, 8)
    conv = conv_line("Convolution", 3, 4, "4=1 5=1").replace(" out ", " mid ")
    shared = [conv, "Split sp 1 2 mid m1 m2", "ReLU act 1 1 m1 r", "Eltwise el 2 1 r m2 out 0=1"]
    fused, _ = plans(tmp_path, shared, {"data": x})
    assert fused.fused == []  # the ReLU reads a Split output, not the conv's blob
    requested, _ = plans(tmp_path, [conv, "ReLU act 1 1 mid out"], {"data": x}, outputs=["mid", "out"])
    assert requested.fused == []
    out = requested.run({"data": x})
    assert np.array_equal(out["out"], np.maximum(out["mid"], 0))


def test_no_fusion_through_a_reshape_whose_blobs_are_read_elsewhere(tmp_path: Path) -> None:
    x = rand(4, 9, 11)
    linear = [ROWS, LINEAR.replace(" mid ", " g ")]
    shaped = linear + ["Reshape back 1 1 g r 0=7 1=9 2=4", "Split sp 1 2 r r1 r2", "ReLU act 1 1 r1 a",
                       "Eltwise el 2 1 a r2 out 0=1"]
    assert plans(tmp_path, shaped, {"data": x})[0].fused == []
    read_before = linear + ["Split sp 1 2 g g1 g2", "Reshape back 1 1 g1 r 0=7 1=9 2=4", "ReLU act 1 1 r a",
                            "Reshape flat 1 1 g2 f 0=252", "Reshape back2 1 1 a a2 0=252", "Eltwise el 2 1 a2 f out 0=1"]
    assert plans(tmp_path, read_before, {"data": x})[0].fused == []
    fused, plain = plans(tmp_path, linear + ["Reshape back 1 1 g r 0=7 1=9 2=4", "ReLU act 1 1 r out"], {"data": x},
                         outputs=["r", "out"])
    assert fused.fused == []  # the Reshape's blob is requested
    out = fused.run({"data": x})
    assert np.array_equal(out["out"], np.maximum(out["r"], 0))


def test_bf16_native_data_movement_is_bit_exact(tmp_path: Path) -> None:
    x = rand(8, 5, 6)
    lines = [
        "Slice sl 1 2 data a b -23300=2,3,-233",
        "ShuffleChannel sh 1 1 b bs 0=5",
        "Concat cat 2 1 bs a c 0=0",
        "Permute pm 1 1 c p 0=3",
        "Crop cr 1 1 p out -23309=2,1,0 -23310=2,-1,4 -23311=2,0,1",
    ]
    check(tmp_path, lines, {"data": x})
    plan, _ = plans(tmp_path, lines, {"data": x})
    # the Concat is stored in place by the Slice and the ShuffleChannel (it runs nothing)
    assert plan.concats_in_place == 1
    assert sum(1 for step in plan._program if step.kind is StepKind.BF16_NATIVE) == 4
    xr = round_bf16(x)
    a, b = xr[:3], xr[3:]
    bs = b.reshape(5, 1, 5, 6).transpose(1, 0, 2, 3).reshape(5, 5, 6)
    c = np.concatenate([bs, a], axis=0)
    p = np.transpose(c, (1, 2, 0))
    want = p[1:-1, 0:4]
    assert np.array_equal(plan.run({"data": x})["out"], want)


def test_exact_store_same_bits_as_rne() -> None:
    x = round_bf16(rand(4, 7, 9) * 100)
    out = np.empty(x.shape, np.uint16)
    narrow_exact_into(np.maximum(x, 0), out)
    assert np.array_equal(out, to_bf16(np.maximum(x, 0)))


@pytest.mark.parametrize("line", [
    "Pooling pool 1 1 data out 0=0 1=3 2=2 5=0",
    "Pooling pool 1 1 data out 0=0 1=3 2=2 3=1",
    "Pooling pool 1 1 data out 0=0 4=1",
    "ReLU relu 1 1 data out",
])
def test_exact_store_layers_match_ncnn(tmp_path: Path, line: str) -> None:
    check(tmp_path, [line], {"data": rand(3, 9, 10)})


def test_thread_split_same_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = rand(48, 40, 40)
    lines = [conv_line("ConvolutionDepthWise", 48, 48, "4=1 5=1 9=1", group=48)]
    one, _ = plans(tmp_path, lines, {"data": x})
    want = one.run({"data": x})["out"]
    flat = rand(300_001) * 1e3
    flat[7] = np.nan
    want_bits = to_bf16(flat)
    monkeypatch.setattr(threads, "THREADS", 2)
    monkeypatch.setattr(threads, "MIN_SPLIT", 1024)
    assert threads.split(48, 48 * 9 * 1600) == [(0, 24), (24, 48)]
    assert np.array_equal(to_bf16(flat), want_bits)
    two, _ = plans(tmp_path, lines, {"data": x})
    assert np.array_equal(two.run({"data": x})["out"], want)


#: activation layers after the squeeze-excite multiply (mobilenet_v3 has ReLU and HardSwish),
#: folded with it, and the op code ``scaled_bits`` applies
AFTER = {"": OP_NONE, "ReLU": OP_RELU, "Clip": OP_CLIP, "HardSwish": OP_HARDSWISH}
_AFTER_PARAMS = {"ReLU": "", "Clip": "0=0.0 1=6.0", "HardSwish": "0=0.1666667 1=0.5"}


def _squeeze_excite(swap: bool, c: int, after: str = "") -> list[str]:
    """x (c, 9, 11) -> its channel means -> InnerProduct c -> 8 -> c -> Sigmoid: one scale a
    channel, multiplied into x (``swap``: the scale as the first operand; ``after``: an
    activation layer after it), then a 1x1 convolution reads the product."""
    prod = "prod0" if after else "prod"
    return [
        "Split sp 1 2 data a b",
        "Pooling gap 1 1 b g 0=1 4=1",
        f"InnerProduct fc1 1 1 g f1 0=8 1=1 2={8 * c}",
        f"InnerProduct fc2 1 1 f1 f2 0={c} 1=1 2={8 * c}",
        "Sigmoid sig 1 1 f2 s",
        f"BinaryOp mul 2 1 s a {prod} 0=2" if swap else f"BinaryOp mul 2 1 a s {prod} 0=2",
        *([f"{after} act 1 1 prod0 prod {_AFTER_PARAMS[after]}"] if after else []),
        f"Convolution proj 1 1 prod out 0=24 1=1 5=1 6={24 * c}",
    ]


#: 32 channels: the AMX convolution on AMX hosts, the GEMM's flat panels elsewhere; 13: the
#: GEMM everywhere (fewer than ``jit.implicit.MIN_CHANNELS``, more than ``jit.direct``'s), an
#: odd depth (a k pair's second channel missing)
SE_CHANNELS = [32, 13]


@pytest.mark.parametrize("after", list(AFTER))
@pytest.mark.parametrize("c", SE_CHANNELS)
@pytest.mark.parametrize("swap", [False, True])
def test_channel_scale_matches_ncnn(tmp_path: Path, swap: bool, c: int, after: str) -> None:
    """A squeeze-and-excitation multiply (with an activation after or not) before a 1x1
    convolution: within the verify tolerance of ncnn, folded into the convolution."""
    check(tmp_path, _squeeze_excite(swap, c, after), {"data": rand(c, 9, 11)})


@pytest.mark.parametrize("after", list(AFTER))
@pytest.mark.parametrize("c", SE_CHANNELS)
@pytest.mark.parametrize("swap", [False, True])
def test_channel_scale_fused_gives_the_unfused_bits(tmp_path: Path, swap: bool, c: int, after: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The multiply folded into the convolution reading its product (no step of its own), the
    same bits as the BinaryOp and the convolution run apart (the Plan's other fusions in both),
    for one item and for a batch of 3, a ReLU, Clip or HardSwish fused into the multiply going
    with it (a 3x3 convolution reading the product too, where it folds there); not folded
    where the product is requested or read twice, nor into a convolution that does not read its
    input flat (3x3)."""
    x = rand(c, 9, 11)
    fused, _ = plans(tmp_path, _squeeze_excite(swap, c, after), {"data": x})
    with monkeypatch.context() as m:
        m.setattr(Plan, "_fuse_channel_scales", lambda self: [])
        plain, _ = plans(tmp_path, _squeeze_excite(swap, c, after), {"data": x})
    assert fused.scaled == [("proj", "mul")] and plain.scaled == [] and plain.fused == fused.fused
    proj = next(step for step in fused._steps if step.name == "proj")
    assert proj.fused[:2] == (["mul", "act"] if after else ["mul"])
    assert proj.kernel.channel_scale_act[0] == AFTER[after]
    assert "mul" not in [s.name for s in fused.profile({"data": x}, 1)]
    assert np.array_equal(fused.run({"data": x})["out"], plain.run({"data": x})["out"])
    items = [{"data": rand(c, 9, 11)} for _ in range(3)]
    fused3, plain3 = (p.sibling(batch=3) for p in (fused, plain))
    for a, b in zip(fused3.run_batch_timed(items)[0], plain3.run_batch_timed(items)[0]):
        assert np.array_equal(a["out"], b["out"])
    requested, _ = plans(tmp_path, _squeeze_excite(swap, c), {"data": x}, outputs=["out", "prod"])
    assert requested.scaled == []
    twice, _ = plans(tmp_path, [*_squeeze_excite(swap, c), f"Convolution other 1 1 prod out2 0=8 1=1 6={8 * c}"],
                     {"data": x})
    assert twice.scaled == []
    leaky = _squeeze_excite(swap, c, "ReLU")
    leaky[-2] = "ReLU act 1 1 prod0 prod 0=0.1"  # a leaky ReLU: not an activation ``scaled_bits`` applies
    assert plans(tmp_path, leaky, {"data": x})[0].scaled == []
    wide = [*_squeeze_excite(swap, c, after)[:-1], f"Convolution proj 1 1 prod out 0=24 1=3 4=1 5=1 6={24 * 9 * c}"]
    spread, _ = plans(tmp_path, wide, {"data": x})
    proj = next(step.kernel for step in spread._steps if step.name == "proj")
    assert spread.scaled == ([("proj", "mul")] if proj.implicit or proj.pairs else [])  # the planes' fill: any kernel
    with monkeypatch.context() as m:
        m.setattr(Plan, "_fuse_channel_scales", lambda self: [])
        spread_plain, _ = plans(tmp_path, wide, {"data": x})
    assert np.array_equal(spread.run({"data": x})["out"], spread_plain.run({"data": x})["out"])
