"""Winograd F(4, 3) for dense 3x3 stride-1 convolutions (``vkserve.devices.cpu.jit.winograd``):
against the ncnn package on many shapes (channel counts off the MR = 4 (or 8) row blocks, sizes off the
4x4 tiles and the TB = 32 tiles of a task, pads symmetric, asymmetric, negative, pad_value,
fused activations), against an exact float64 convolution far tighter than the bf16 tolerance,
and the same bits with 1 and N threads and from run to run. Each case asserts that the layer
took the Winograd path, and the sizes just below its thresholds that it did not."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from tests.support.cpu_engine import check_against_ncnn
from tests.support.params import param_text
from vkserve.devices.cpu import jit, threads, warm
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.executor import Plan, StepKind
from vkserve.devices.cpu.jit import winograd
from vkserve.devices.cpu.kernels import REGISTRY
from vkserve.models.graph import build_graph, load_model, parse_param_text
from vkserve.models.randinit import random_weights


@pytest.fixture(autouse=True)
def _rule_beside_a_gemm_without_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cases' sizes sit at the thresholds beside the fp32 GEMM; beside the planes' kernels
    (bf16 pairs, ``conv.DOT``; AMX tiles, ``conv.AMX``) F(4, 3) takes fewer layers or none
    (``test_winograd_leaves_most_layers_to_the_planes_bf16_pairs``,
    ``test_winograd_takes_no_layer_beside_amx_tiles``), so there these cases would test the
    other kernels instead. The Winograd kernel is the same."""
    monkeypatch.setattr(winograd, "worthwhile", functools.partial(winograd.worthwhile, planes_pairs=False,
                                                                  gemm_tiles=False))


def conv_line(c: int, out: int, params: str) -> str:
    return f"Convolution op 1 1 data out 0={out} 1=3 6={out * c * 9} 5=1 {params}"


def kernel_for(tmp_path: Path, shape: tuple[int, int, int], line: str):  # noqa: ANN201
    param = tmp_path / "one.param"
    param.write_text(param_text({"data": shape}, [line]))
    graph = load_model(param, None, {"data": shape}, seed=11)
    layer = next(lay for lay in graph.layers if lay.type == "Convolution")
    return REGISTRY[layer.type](layer, [shape])


# (input shape, out channels, params)
CASES = [
    ((8, 24, 24), 16, "4=1"),  # the thresholds exactly: 8 in, 16 out, 36 tiles
    ((13, 27, 29), 19, "4=1"),  # odd channels and sizes: partial tiles on both edges
    ((16, 30, 30), 37, "4=0"),  # no padding: 28x28 outputs
    ((9, 25, 23), 21, "4=1 15=2 14=0 16=1 18=0.75"),  # asymmetric pads, pad_value
    ((12, 26, 26), 16, "4=-233"),  # SAME_UPPER
    ((10, 30, 31), 17, "4=-1 15=-1 14=-1 16=-1"),  # negative pads
    ((40, 40, 40), 150, "4=1"),  # 100 tiles (several blocks of TB, the last partial), 150 rows
    ((64, 28, 28), 64, "4=1"),  # 49 tiles: a block with one tile
]


@pytest.mark.parametrize("shape,out,params", CASES, ids=[f"{s}-{o}-{p}" for s, o, p in CASES])
def test_winograd_matches_ncnn(tmp_path: Path, shape: tuple[int, int, int], out: int, params: str) -> None:
    line = conv_line(shape[0], out, params)
    assert kernel_for(tmp_path, shape, line).winograd
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(12))


ACTS = ["9=1", "9=2 -23310=1,0.1", "9=3 -23310=2,-0.5,0.7", "9=4", "9=5", "9=6 -23310=2,0.2,0.5"]


@pytest.mark.parametrize("act", ACTS)
def test_winograd_fused_activations_match_ncnn(tmp_path: Path, act: str) -> None:
    line = conv_line(8, 16, f"4=1 {act}")
    assert kernel_for(tmp_path, (8, 24, 25), line).winograd
    check_against_ncnn(tmp_path, line, {"data": (8, 24, 25)}, np.random.default_rng(13))


def exact(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pads: tuple[int, int, int, int],
          value: float) -> np.ndarray:
    """The convolution in float64 (pads top, bottom, left, right; value outside the input)."""
    t, b, l, r = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (t, b), (l, r)), constant_values=value)
    oh, ow = xp.shape[1] - 2, xp.shape[2] - 2
    y = np.zeros((w.shape[0], oh, ow)) + bias[:, None, None]
    for ky in range(3):
        for kx in range(3):
            y += np.einsum("oc,chw->ohw", w[:, :, ky, kx], xp[:, ky:ky + oh, kx:kx + ow])
    return y


@pytest.mark.parametrize("shape,out,params,pads,value", [
    ((13, 27, 29), 19, "4=1", (1, 1, 1, 1), 0.0),
    ((9, 25, 23), 21, "4=1 15=2 14=0 16=1 18=0.75", (0, 1, 1, 2), 0.75),
])
def test_winograd_is_fp32_accurate(tmp_path: Path, shape: tuple[int, int, int], out: int, params: str,
                                   pads: tuple[int, int, int, int], value: float) -> None:
    """Before the one bf16 store, the result is within 1e-5 of the exact convolution of the
    same bf16 input and weights (bf16 rounding alone is 4e-3 of a value)."""
    kernel = kernel_for(tmp_path, shape, conv_line(shape[0], out, params))
    assert kernel.winograd
    x = from_bf16(to_bf16(np.random.default_rng(14).uniform(-2, 2, shape).astype(np.float32)))
    got = kernel.forward([x])[0].reshape(out, -1)
    w = from_bf16(kernel.bf16_weight(0)).reshape(out, shape[0], 3, 3)
    want = exact(x, w.astype(np.float64), kernel.bias, pads, value).reshape(out, -1)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("shape,out", [((40, 40, 40), 150), ((24, 36, 36), 40)])  # 100 tiles: 4 blocks; 81: 3
def test_winograd_same_bits_with_one_and_more_threads_and_run_to_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int], out: int) -> None:
    """Whatever the threads, and with one tile block a task or several (``GROUP``; the deep
    layers' rule, ``GROUP_U_BYTES``, forced here on small ones), the same bits."""
    u = to_bf16(np.random.default_rng(15).uniform(-2, 2, shape).astype(np.float32))
    runs = []
    for group_bytes in (winograd.GROUP_U_BYTES, 0):
        monkeypatch.setattr(winograd, "GROUP_U_BYTES", group_bytes)
        kernel = kernel_for(tmp_path, shape, conv_line(shape[0], out, "4=1 9=1"))
        assert kernel.winograd
        assert winograd.blocks_per_task(kernel.weight) == (1 if group_bytes else winograd.GROUP)
        for n in (1, max(2, threads.available_cores()), 3, 16):  # 3, 16: inputs transformed once, shared by row chunks
            monkeypatch.setattr(threads, "THREADS", n)
            got = np.empty(kernel.out_shapes[0], dtype=np.uint16)
            kernel.forward_store([u], [got], [])
            runs.append(got.tobytes())
    assert len(set(runs)) == 1
    # 16 threads split the rows into chunks: the shared transformed inputs are used
    tiles = (shape[1] // 4) ** 2
    rows = jit.gemm_row_chunks(1, out, tiles, 16, jit.winograd.TB, jit.winograd.MIN_TASK_ROWS)
    nrb = kernel.weight.shape[1]
    assert rows < nrb
    assert jit.winograd.transformed_shape(kernel.geo, shape[0], rows, nrb)[0] == -(-tiles // jit.winograd.TB)
    assert jit.winograd.transformed_shape(kernel.geo, shape[0], nrb, nrb)[0] == 0


@pytest.mark.parametrize("shape,out,params", [
    ((7, 24, 24), 16, "4=1"),  # one input channel short
    ((8, 24, 24), 15, "4=1"),  # one output channel short
    ((8, 10, 10), 16, "4=0"),  # 8x8 outputs: 4 tiles
    ((8, 24, 24), 16, "4=1 3=2"),  # stride 2
    ((8, 24, 24), 16, "4=2 2=2"),  # dilation 2
])
def test_winograd_only_where_it_wins(tmp_path: Path, shape: tuple[int, int, int], out: int, params: str) -> None:
    assert not kernel_for(tmp_path, shape, conv_line(shape[0], out, params)).winograd
    assert winograd.worthwhile(8, 16, 24, 24, planes_pairs=False)


def test_winograd_leaves_most_layers_to_the_planes_bf16_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside the bf16 pairs from the input's planes (``jit.implicit_pairs``) F(4, 3) keeps the
    layers of 128 input channels and more on maps of 36 tiles and more (resnet18's 128 -> 128
    at 28x28, vgg16's), and of 64 on maps of 112x112 and more (vgg16's first two blocks), not
    widening 4x; the rest (squeezenet's expanding 16 -> 64 at 55x55 and 32 -> 128 at 27x27,
    resnet18's 64 -> 64 at 56x56, 64 channels at 80x80, 32 at 112x112, 96 channels) run from the
    planes. Beside the fp32 GEMM all of these are Winograd's."""
    for cin, og, hw in ((16, 64, 55), (32, 128, 27), (64, 64, 56), (64, 64, 80), (32, 32, 112), (96, 96, 28),
                        (128, 512, 28), (128, 128, 20), (64, 256, 112)):
        assert not winograd.worthwhile(cin, og, hw, hw, planes_pairs=True)
        assert winograd.worthwhile(cin, og, hw, hw, planes_pairs=False)
    for cin, og, hw in ((128, 128, 28), (128, 256, 56), (256, 256, 24), (512, 512, 28), (64, 64, 224),
                        (64, 128, 112), (64, 64, 112)):
        assert winograd.worthwhile(cin, og, hw, hw, planes_pairs=True)
    monkeypatch.undo()  # a layer takes the rule of the kernels this process runs
    assert winograd.worthwhile(64, 64, 56, 56) == (not (jit.conv.DOT or jit.conv.AMX))


def test_winograd_takes_fewer_tiles_beside_an_fp32_gemm() -> None:
    """Beside the fp32 GEMM (Intel's AVX-512, AVX2, NEON) from 9 tiles (resnet's 14x14 layers,
    alexnet's 13x13, a 10x10 map); beside the planes' pairs from 36; at 4 tiles on neither."""
    for hw in (14, 13, 10, 9):
        assert winograd.worthwhile(256, 256, hw, hw, planes_pairs=False)
        assert not winograd.worthwhile(256, 256, hw, hw, planes_pairs=True)
    assert winograd.worthwhile(256, 256, 24, 24, planes_pairs=True)
    for hw in (7, 8):
        assert not winograd.worthwhile(256, 256, hw, hw, planes_pairs=False)


def test_winograd_takes_no_layer_beside_amx_tiles() -> None:
    """On AMX hosts the layers it would take run from the input's planes (``jit.implicit``), or
    below 16 input channels as the AMX GEMM."""
    for cin, og, hw in ((64, 64, 224), (128, 128, 112), (64, 64, 56), (256, 256, 14), (8, 16, 24)):
        assert not winograd.worthwhile(cin, og, hw, hw, gemm_tiles=True)


def test_warm_up_net_reaches_the_winograd_and_pooling_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """`vkserve cache warm` and the daemon's start compile the kernels through this net: it
    must take every numba path, these included (with the rule of the GEMM this process runs)."""
    monkeypatch.undo()
    layers = parse_param_text(warm._NET, "warm-up net")
    for layer, weights in zip(layers, random_weights(layers, 0)):
        layer.weights = weights
    plan = Plan(build_graph(layers, "warm-up net"))
    kernels = [step.kernel for step in plan._program]
    convs = [k for k in kernels if k.layer.type == "Convolution"]
    assert any(k.implicit if jit.conv.AMX else k.winograd for k in convs)
    assert any(k.pairs for k in convs) == (jit.conv.DOT and not jit.conv.AMX)
    pools = [k for k in kernels if k.layer.type == "Pooling"]
    assert any(k.windowed for k in pools) and any(k.global_avg for k in pools)
    # the element-wise kernels: Eltwise and BinaryOp on ``binary``, an activation on its own
    stored = {step.kernel.layer.type for step in plan._program if step.kind is StepKind.STORE}
    assert {"Eltwise", "BinaryOp", "HardSigmoid"} <= stored
