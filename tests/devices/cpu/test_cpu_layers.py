"""Per-layer checks of the CPU kernels against the ncnn package on small, awkward shapes.

Each case is a tiny .param (Input layers + the layer under test); weights are the models
package's seeded random ones, written to a .bin for ncnn, so both engines see the same numbers.
The bf16 engine must meet the verify tolerance (cosine >= 0.999, max abs err <= 2 % of the
reference's max abs) on every output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.params import param_text
from vkserve.devices.cpu.executor import Plan, PlanError
from vkserve.devices.cpu.kernels import REGISTRY
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.devices.reference import compare, run_ncnn
from vkserve.models.graph import load_model
from vkserve.models.weights import write_bin

RNG = np.random.default_rng(1234)


def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def conv_line(
    kind: str, c: int, out: int, params: str, k: tuple[int, int] = (3, 3), group: int = 1
) -> str:
    size = out * (c // group) * k[0] * k[1]
    g = f" 7={group}" if kind == "ConvolutionDepthWise" else ""
    return f"{kind} op 1 1 data out 0={out} 1={k[1]} 11={k[0]} 6={size}{g} {params}"


def write_param(path: Path, inputs: dict[str, np.ndarray], lines: list[str]) -> None:
    path.write_text(param_text(inputs, lines))


def check(tmp_path: Path, lines: list[str], inputs: dict[str, np.ndarray]) -> None:
    param = tmp_path / "case.param"
    write_param(param, inputs, lines)
    graph = load_model(param, None, {n: a.shape for n, a in inputs.items()}, seed=7)
    report = verify_cpu(graph, param, None, inputs)
    details = [(o.name, o.shape, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]
    assert report.ok, details


CONV = [
    # (kind, input shape, out, params, kernel (kh, kw), group)
    ("Convolution", (3, 9, 11), 5, "5=1", (3, 3), 1),
    ("Convolution", (4, 10, 7), 6, "2=2 12=1 3=2 13=1 4=1 15=2 14=0 16=1 5=1", (3, 2), 1),
    ("Convolution", (3, 11, 10), 4, "3=2 4=-233 5=1", (3, 3), 1),  # SAME_UPPER
    ("Convolution", (3, 11, 10), 4, "3=2 4=-234 5=1", (4, 4), 1),  # SAME_LOWER, even kernel
    ("Convolution", (2, 8, 8), 3, "4=2 18=1.5 5=0", (3, 3), 1),  # pad_value
    ("Convolution", (5, 6, 7), 4, "5=1", (1, 1), 1),  # 1x1 fast path
    ("Convolution", (3, 7, 9), 4, "5=1 9=1", (3, 3), 1),
    ("Convolution", (3, 7, 9), 4, "5=1 9=2 -23310=1,1.000000e-01", (3, 3), 1),
    ("Convolution", (3, 7, 9), 4, "5=1 9=3 -23310=2,-2.000000e-01,3.000000e-01", (3, 3), 1),
    ("Convolution", (3, 7, 9), 4, "5=1 9=4", (3, 3), 1),
    ("Convolution", (3, 7, 9), 4, "5=1 9=5", (3, 3), 1),
    ("Convolution", (3, 7, 9), 4, "5=1 9=6 -23310=2,2.000000e-01,5.000000e-01", (3, 3), 1),
    ("ConvolutionDepthWise", (4, 9, 8), 6, "4=1 5=1", (3, 3), 2),  # grouped
    ("ConvolutionDepthWise", (5, 9, 8), 5, "3=2 4=1 5=1 9=1", (3, 3), 5),  # depthwise
    ("ConvolutionDepthWise", (3, 9, 8), 6, "2=2 4=2 5=1", (3, 3), 3),  # channel multiplier 2
    ("ConvolutionDepthWise", (4, 10, 10), 4, "3=2 4=-233 5=1", (5, 5), 4),
    # explicit pads of which one is negative: it crops (ncnn pads only when one is positive)
    ("Convolution", (3, 7, 9), 2, "4=1 15=-1 5=1", (3, 3), 1),
    ("Convolution", (3, 7, 9), 2, "4=-1 15=2 14=0 16=0 5=1", (3, 3), 1),
    # 3x3 stride 1 with >= 16 input channels and >= 400 output pixels takes the Winograd
    # F(4x4, 3x3) path: sizes that are and are not multiples of the 4x4 tile, padding modes,
    # pad_value, fused activation
    ("Convolution", (16, 21, 23), 5, "4=1 5=1 9=2 -23310=1,1.000000e-01", (3, 3), 1),
    ("Convolution", (16, 22, 26), 6, "5=1", (3, 3), 1),  # no pad: 20 x 24 output
    ("Convolution", (17, 21, 23), 4, "4=-233 5=1", (3, 3), 1),  # SAME_UPPER
    ("Convolution", (16, 20, 20), 3, "4=2 18=1.5 5=0", (3, 3), 1),  # pad_value, 22 x 22
    ("ConvolutionDepthWise", (6, 20, 18), 6, "4=1 5=1", (3, 3), 6),  # depthwise, larger
]


@pytest.mark.parametrize("kind,shape,out,params,k,group", CONV)
def test_convolution(tmp_path: Path, kind: str, shape: tuple[int, ...], out: int, params: str,
                     k: tuple[int, int], group: int) -> None:
    check(tmp_path, [conv_line(kind, shape[0], out, params, k, group)], {"data": rand(*shape)})


POOLING = [
    "0=0 1=3 2=2",  # full padding with a tail
    "0=0 1=3 2=2 3=1",
    "0=1 1=3 2=2 3=1 6=0",  # avg, padding excluded
    "0=1 1=3 2=2 3=1 6=1",  # avg, padding counted
    "0=1 1=2 2=2 5=1",  # valid
    "0=0 1=2 2=2 14=1 15=1 5=1",  # yolov4-tiny's asymmetric valid pads
    "0=0 1=3 2=2 5=2",  # SAME_UPPER
    "0=0 1=2 2=2 5=3",  # SAME_LOWER
    "0=1 1=3 2=2 5=2 6=1",
    "0=0 1=3 11=2 2=2 12=1",
    "0=0 4=1",
    "0=1 4=1",
]


@pytest.mark.parametrize("params", POOLING)
def test_pooling(tmp_path: Path, params: str) -> None:
    check(tmp_path, [f"Pooling op 1 1 data out {params}"], {"data": rand(3, 7, 9)})


@pytest.mark.parametrize(
    "shape,params",
    [((3, 4, 5), "0=7 1=1 2=420"), ((3, 4, 5), "0=7 1=1 2=420 9=2 -23310=1,1.000000e-01"),
     ((6,), "0=5 1=0 2=30 9=1"), ((4, 6), "0=3 1=1 2=18"),
     ((1, 6), "0=3 1=1 2=18")],  # one row of the 2-D form: ncnn's output is (1, 3)
)
def test_inner_product(tmp_path: Path, shape: tuple[int, ...], params: str) -> None:
    check(tmp_path, [f"InnerProduct op 1 1 data out {params}"], {"data": rand(*shape)})


@pytest.mark.parametrize(
    "shape,params",
    [((7,), ""), ((3, 5), "0=0 1=1"), ((3, 5), "0=1 1=1"), ((3, 4, 5), "0=0 1=1"),
     ((3, 4, 5), "0=1 1=1"), ((3, 4, 5), "0=2 1=1"), ((3, 4, 5), "0=-1 1=1")],
)
def test_softmax(tmp_path: Path, shape: tuple[int, ...], params: str) -> None:
    check(tmp_path, [f"Softmax op 1 1 data out {params}"], {"data": rand(*shape, lo=-3, hi=3)})


@pytest.mark.parametrize(
    "line",
    ["ReLU op 1 1 data out", "ReLU op 1 1 data out 0=1.000000e-01", "Sigmoid op 1 1 data out",
     "Clip op 1 1 data out 0=-5.000000e-01 1=2.500000e-01", "Swish op 1 1 data out",
     "HardSigmoid op 1 1 data out", "HardSigmoid op 1 1 data out 0=1.666667e-01 1=5.000000e-01",
     "HardSwish op 1 1 data out", "HardSwish op 1 1 data out 0=1.666667e-01 1=5.000000e-01",
     "Dropout op 1 1 data out", "Dropout op 1 1 data out 0=5.000000e-01",
     "ShuffleChannel op 1 1 data out 0=3", "ShuffleChannel op 1 1 data out 0=3 1=1",
     "LRN op 1 1 data out 0=0 1=3 2=1.000000e-01", "LRN op 1 1 data out 0=1 1=3 2=1.000000e-01",
     "LRN op 1 1 data out 2=1.000000e-04",
     "Padding op 1 1 data out 0=1 1=2 2=0 3=3 4=0 5=7.500000e-01",
     "Padding op 1 1 data out 0=1 1=2 2=2 3=1 4=1", "Padding op 1 1 data out 0=2 1=1 2=1 3=2 4=2",
     "Padding op 1 1 data out 0=1 1=0 2=0 3=1 7=2 8=1 5=-1.000000e+00",
     "Reshape op 1 1 data out 0=-1 1=6", "Reshape op 1 1 data out 0=7 1=0 2=-1",
     "Flatten op 1 1 data out",
     "Crop op 1 1 data out 0=1 1=2 2=1 3=3 4=2 5=4", "Crop op 1 1 data out -23309=1,2 -23310=1,5 -23311=1,0",
     "Crop op 1 1 data out -23309=2,1,-3 -23310=2,-1,-233 -23311=2,1,2",
     "Interp op 1 1 data out 0=1 1=2.000000e+00 2=2.000000e+00",
     "Interp op 1 1 data out 0=2 1=2.000000e+00 2=2.000000e+00",
     "Interp op 1 1 data out 0=2 1=5.000000e-01 2=5.000000e-01",
     "Interp op 1 1 data out 0=2 3=7 4=4", "Interp op 1 1 data out 0=2 3=9 4=11 6=1",
     "Interp op 1 1 data out 0=1 3=9 4=11",
     "Split op 1 3 data a b out", "Slice op 1 3 data a b out -23300=3,2,-233,-233 1=0",
     "Slice op 1 2 data a out -23300=2,1,-233 1=1", "Slice op 1 2 data a out -23300=2,2,-233 1=-1",
     "Permute op 1 1 data out 0=0", "Permute op 1 1 data out 0=1", "Permute op 1 1 data out 0=2",
     "Permute op 1 1 data out 0=3", "Permute op 1 1 data out 0=4", "Permute op 1 1 data out 0=5",
     "Noop op 1 1 data out"],
)
def test_single_input_layers(tmp_path: Path, line: str) -> None:
    check(tmp_path, [line], {"data": rand(6, 5, 7)})


@pytest.mark.parametrize(
    "line",
    ["Padding op 1 1 data out 0=1 1=0 2=2 3=1 7=1 8=2 5=-1.500000e+00",  # front/behind: depth
     "Permute op 1 1 data out 0=7", "Permute op 1 1 data out 0=16", "Permute op 1 1 data out 0=23"],
)
def test_4d_layers(tmp_path: Path, line: str) -> None:
    check(tmp_path, [line], {"data": rand(3, 4, 5, 6)})


@pytest.mark.parametrize(
    "lines",
    [["Reshape r 1 1 data flat 0=-1 1=6", "Permute op 1 1 flat out 0=1"],
     ["Reshape r 1 1 data flat 0=-1", "Softmax op 1 1 flat out"],
     ["Reshape r 1 1 data m 0=-1 1=6", "Slice op 1 2 m a out -23300=2,2,-233 1=0"]],
)
def test_chains(tmp_path: Path, lines: list[str]) -> None:
    check(tmp_path, lines, {"data": rand(6, 5, 7)})


@pytest.mark.parametrize(
    "line,shapes",
    [("Concat op 2 1 data d2 out 0=0", [(3, 4, 5), (2, 4, 5)]),
     ("Concat op 2 1 data d2 out 0=1", [(3, 4, 5), (3, 2, 5)]),
     ("Concat op 2 1 data d2 out 0=-1", [(3, 4, 5), (3, 4, 1)]),
     ("Concat op 2 1 data d2 out 0=0", [(7,), (2,)]),
     ("Eltwise op 2 1 data d2 out 0=0", [(3, 4, 5)] * 2),
     ("Eltwise op 2 1 data d2 out 0=1", [(3, 4, 5)] * 2),
     ("Eltwise op 2 1 data d2 out 0=1 -23301=2,5.000000e-01,-2.000000e+00", [(3, 4, 5)] * 2),
     ("Eltwise op 2 1 data d2 out 0=2", [(3, 4, 5)] * 2),
     ("Crop op 2 1 data d2 out 0=1 1=2", [(3, 6, 7), (3, 2, 4)]),
     ("Crop op 2 1 data d2 out 2=1", [(4, 6, 7), (2, 6, 7)]),
     ("Interp op 2 1 data d2 out 0=2 5=1", [(3, 4, 5), (1, 7, 3)])],
)
def test_two_input_layers(tmp_path: Path, line: str, shapes: list[tuple[int, ...]]) -> None:
    check(tmp_path, [line], {"data": rand(*shapes[0]), "d2": rand(*shapes[1])})


BROADCAST = [
    [(3, 4, 5), (3, 4, 5)], [(3, 4, 5), (3,)], [(3, 4, 5), (5,)], [(5,), (3, 4, 5)],
    [(3, 4, 5), (3, 4)], [(3, 4), (3, 4, 5)], [(3, 4, 5), (3, 1, 5)], [(3, 4, 5), (1, 4, 5)],
    [(3, 4, 5), (3, 4, 1)], [(3, 1, 1), (3, 4, 5)], [(4, 5), (5,)], [(4, 5), (4,)],
    [(4, 5), (4, 5)], [(1,), (3, 4, 5)], [(3, 4, 5), (1,)], [(2, 3, 4, 5), (2,)],
    [(2, 3, 4, 5), (2, 3, 4)],
]


@pytest.mark.parametrize("shapes", BROADCAST)
def test_binary_broadcast(tmp_path: Path, shapes: list[tuple[int, ...]]) -> None:
    for op in (0, 1, 2):
        check(tmp_path, [f"BinaryOp op 2 1 data d2 out 0={op}"],
              {"data": rand(*shapes[0]), "d2": rand(*shapes[1])})


@pytest.mark.parametrize("op", range(12))
def test_binary_op_types(tmp_path: Path, op: int) -> None:
    # positive operands keep pow/div well defined in both engines
    inputs = {"data": rand(3, 4, 5, lo=0.5, hi=2.0), "d2": rand(3, 4, 5, lo=0.5, hi=2.0)}
    check(tmp_path, [f"BinaryOp op 2 1 data d2 out 0={op}"], inputs)
    check(tmp_path, [f"BinaryOp op 1 1 data out 0={op} 1=1 2=1.500000e+00"], {"data": inputs["data"]})


def test_yolo_detection_semantics_exact(tmp_path: Path) -> None:
    """On identical fp32 inputs the detection kernel reproduces ncnn row for row."""
    line = ("Yolov3DetectionOutput op 2 1 data d2 out 0=2 1=2 2=3.000000e-01 3=4.500000e-01 "
            "-23304=8,10.0,14.0,23.0,27.0,37.0,58.0,81.0,82.0 -23305=4,0.0,1.0,2.0,3.0 "
            "-23306=2,32.0,16.0")
    inputs = {"data": rand(14, 5, 6, lo=-2, hi=2), "d2": rand(14, 10, 12, lo=-2, hi=2)}
    param = tmp_path / "det.param"
    write_param(param, inputs, [line])
    graph = load_model(param, None, {n: a.shape for n, a in inputs.items()})
    write_bin(graph.layers, tmp_path / "det.bin")
    ref = run_ncnn(param, tmp_path / "det.bin", inputs, ["out"])["out"]
    layer = graph.layers[-1]
    ours = REGISTRY[layer.type](layer, [a.shape for a in inputs.values()]).forward(list(inputs.values()))[0]
    assert ours.shape == ref.shape and len(ref) > 0
    report = compare("out", ours, ref)
    assert report.max_abs_err is not None and report.max_abs_err < 1e-5


def test_unsupported_layers_named_together(tmp_path: Path) -> None:
    param = tmp_path / "bad.param"
    inputs = {"data": rand(3, 6, 6)}
    write_param(param, inputs, [
        "Pooling p1 1 1 data a 0=0 1=3 5=1",
        "Interp i1 1 1 a b 0=3 1=2.000000e+00 2=2.000000e+00",
        "ReLU r1 1 1 b out",
    ])
    graph = load_model(param, None, {"data": (3, 6, 6)})
    with pytest.raises(PlanError) as err:
        Plan(graph, {"data": (3, 2, 2)})  # smaller than p1's 3x3 window
    text = str(err.value)
    assert "p1" in text and "kernel" in text and "i1" not in text  # i1 waits on p1's shape


def test_plan_arena_smaller_and_reusable(tmp_path: Path) -> None:
    param = tmp_path / "chain.param"
    inputs = {"data": rand(4, 16, 16)}
    write_param(param, inputs, [
        conv_line("Convolution", 4, 8, "4=1 5=1 9=1").replace("op 1 1 data out", "c1 1 1 data x1"),
        "ReLU r1 1 1 x1 x2", "Split s 1 2 x2 x3 x4", "Sigmoid g 1 1 x3 x5",
        "BinaryOp m 2 1 x4 x5 x6 0=2", "Pooling p 1 1 x6 out 0=0 1=2 2=2",
    ])
    graph = load_model(param, None, {"data": (4, 16, 16)}, seed=3)
    plan = Plan(graph)
    assert plan.arena_bytes < plan.naive_bytes
    first = plan.run(inputs)["out"]
    again = plan.run(inputs)["out"]
    assert np.array_equal(first, again)
    # no two storages with overlapping lifetimes share bytes
    spans = plan.storage_intervals
    for i, (oa, a) in enumerate(spans):
        for ob, b in spans[i + 1 :]:
            if a.overlaps(b):
                assert oa + a.size <= ob or ob + b.size <= oa
