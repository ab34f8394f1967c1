"""Windowed pooling as the numba kernel ``jit.pooling.pool2d`` (the Plan's path): against the
ncnn package, and the same bits as the numpy ``forward`` followed by the engine's RNE narrowing,
with 1 and N threads. (tests/devices/cpu/test_cpu_layers.py checks every pad mode on small
blobs against ncnn too.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.cpu_engine import check_against_ncnn
from tests.support.params import param_text
from vkserve.devices.cpu import jit, threads
from vkserve.devices.cpu.bf16 import BF16_LOWEST, from_bf16, to_bf16
from vkserve.devices.cpu.executor import Plan, StepKind
from vkserve.models.graph import load_model

# (input shape, params): max and average, strides 1..3, pads, pad modes, crops, odd sizes
CASES = [
    ((8, 112, 112), "0=0 1=3 2=2 5=0"),  # shufflenet_v2's max pool, full padding with a tail
    ((5, 33, 31), "0=0 1=3 2=2 3=1"),
    ((5, 33, 31), "0=1 1=3 2=2 3=1 6=0"),  # average, padding excluded (the divisor)
    ((5, 33, 31), "0=1 1=3 2=2 3=1 6=1"),  # average, padding counted (the scale)
    ((4, 26, 27), "0=0 1=2 2=2 14=1 15=1 5=1"),  # asymmetric valid pads
    ((4, 26, 27), "0=1 1=3 2=1 3=1 5=2"),  # stride 1, SAME_UPPER
    ((4, 26, 27), "0=0 1=3 2=1 3=1"),  # a 3x3 maximum at stride 1 (all taps in one pass)
    ((4, 25, 26), "0=0 1=2 2=2 5=1"),  # 2x2 maximum and average (vgg16's), odd height
    ((4, 25, 26), "0=1 1=2 2=2 5=1"),
    ((4, 29, 25), "0=0 1=3 11=2 2=3 12=1 5=3"),  # rectangular kernel, strides 3 and 1, SAME_LOWER
    ((3, 20, 22), "0=1 1=5 2=2 3=2 6=0"),
    ((3, 21, 45), "0=1 1=3 2=2 3=1 6=0 5=0"),  # odd width, both column phases in one pass
    # strided on maps up to jit.conv.SMALL_PHASE_MAX_COLS wide (the phase planes copied out of
    # one padded image of the channel): squeezenet's last max pool (full padding with a tail),
    # averages with and without the padding counted, 2x2 on an odd width, stride 3 with pads
    ((6, 13, 13), "0=0 1=3 2=2 5=0"),
    ((5, 14, 16), "0=1 1=3 2=2 3=1 6=0"),
    ((5, 14, 16), "0=1 1=3 2=2 3=1 6=1"),
    ((4, 7, 7), "0=0 1=2 2=2 5=1"),
    ((4, 11, 10), "0=0 1=3 2=3 3=1 5=1"),
    ((4, 27, 27), "0=0 1=3 2=2 5=0"),
    # full padding whose last windows lie wholly in the border: the lowest finite bf16 there
    # (-FLT_MAX, ncnn's, would round to -inf)
    ((4, 10, 10), "0=0 1=3 2=3 3=2 5=0"),
]


def checked_plan(tmp_path: Path, line: str, shape: tuple[int, ...], seed: int) -> Plan:
    """A Plan of the one layer ``line`` on input ``shape``, after checking it against ncnn."""
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(seed))
    param = tmp_path / "pool.param"
    param.write_text(param_text({"data": shape}, [line]))
    return Plan(load_model(param, None, {"data": shape}))


def runs_on_1_and_n_threads(monkeypatch: pytest.MonkeyPatch, plan: Plan, x: np.ndarray) -> list[np.ndarray]:
    runs = []
    for n in (1, max(2, threads.available_cores())):
        monkeypatch.setattr(threads, "THREADS", n)
        runs.append(plan.run({"data": x})["out"])
    return runs


@pytest.mark.parametrize("shape,params", CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_jit_pooling_matches_ncnn_and_the_numpy_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      shape: tuple[int, int, int], params: str) -> None:
    plan = checked_plan(tmp_path, f"Pooling op 1 1 data out {params}", shape, 20)
    kind, kernel = plan._program[-1].kind, plan._program[-1].kernel
    assert kind is StepKind.STORE and kernel.windowed
    x = from_bf16(to_bf16(np.random.default_rng(21).uniform(-2, 2, shape).astype(np.float32)))
    want = from_bf16(to_bf16(kernel.forward([x])[0]))
    runs = runs_on_1_and_n_threads(monkeypatch, plan, x)
    assert runs[0].tobytes() == runs[1].tobytes() == want.tobytes()
    assert np.isfinite(runs[0]).all()


@pytest.mark.parametrize("shape", [(6, 1, 1), (5, 1, 7), (4, 2, 4), (7, 7, 7), (3, 112, 111), (9, 40)],
                         ids=["1", "7", "8", "49", "112x111", "2-D"])
@pytest.mark.parametrize("kind", ["0=0 4=1", "0=1 4=1"], ids=["max", "avg"])
def test_global_pooling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], kind: str) -> None:
    """Global pooling (average: ``jit.pooling.global_avg``, row lengths below, at and above its
    8 partial sums, with a tail; max: numpy): against ncnn, within 1e-6 of the exact mean / the
    exact maximum, and the same bits with 1 and N threads and as ``forward``."""
    plan = checked_plan(tmp_path, f"Pooling op 1 1 data out {kind}", shape, 22)
    kernel = plan._program[-1].kernel
    x = from_bf16(to_bf16(np.random.default_rng(23).uniform(0.5, 2, shape).astype(np.float32)))
    rows = x.reshape(-1, shape[-1] * shape[-2]) if len(shape) == 3 else x.reshape(1, -1)
    exact = rows.astype(np.float64).max(axis=1) if kind == "0=0 4=1" else rows.astype(np.float64).mean(axis=1)
    got = kernel.forward([x])[0]
    assert np.abs(got - exact).max() <= 1e-6 * np.abs(exact).max()
    runs = runs_on_1_and_n_threads(monkeypatch, plan, x)
    assert runs[0].tobytes() == runs[1].tobytes() == from_bf16(to_bf16(got)).tobytes()


@pytest.mark.parametrize(("shape", "params", "whole"), [
    ((64, 7, 7), "0=1 1=7", True),  # resnet's pool5
    ((5, 3, 6), "0=1 1=6 11=3 2=4", True),  # rectangular, any stride
    ((5, 3, 6), "0=1 1=6 11=3 6=1", True),  # padding counted, but none there
    ((5, 7, 7), "0=1 1=7 5=1", True),  # valid
    ((5, 2, 2), "0=1 1=2 2=4 3=1 5=1", False),  # the plane's size, but padded: 1 x 1 out
    ((5, 2, 2), "0=1 1=3 2=2 3=1 5=1", False),  # a window past the plane, padded: 1 x 1 out
    ((5, 7, 7), "0=0 1=7", False),  # a maximum
], ids=["pool5", "rect", "count-pad", "valid", "padded", "past", "max"])
def test_an_average_over_the_whole_plane_is_a_global_average(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             shape: tuple[int, int, int], params: str,
                                                             whole: bool) -> None:
    """One unpadded average window covering the whole plane runs as global average pooling
    (``jit.pooling.global_avg``; ``pool2d`` took a pass a tap for one output a channel), against
    ncnn and within 1e-6 of the exact mean, the same bits with 1 and N threads and as
    ``forward``; windows with padding, and maxima, stay windowed."""
    plan = checked_plan(tmp_path, f"Pooling op 1 1 data out {params}", shape, 25)
    kernel = plan._program[-1].kernel
    assert kernel.global_avg is whole and kernel.windowed
    x = from_bf16(to_bf16(np.random.default_rng(26).uniform(0.5, 2, shape).astype(np.float32)))
    got = kernel.forward([x])[0]
    assert got.shape == plan.blob_shapes["out"]
    if whole:
        exact = x.reshape(shape[0], -1).astype(np.float64).mean(axis=1).reshape(got.shape)
        assert np.abs(got - exact).max() <= 1e-6 * np.abs(exact).max()
    runs = runs_on_1_and_n_threads(monkeypatch, plan, x)
    assert runs[0].tobytes() == runs[1].tobytes() == from_bf16(to_bf16(got)).tobytes()


@pytest.mark.parametrize("params", ["0=0 1=3 2=2 5=0", "0=1 1=3 2=2 3=1 6=0", "0=1 4=1"],
                         ids=["max", "avg", "global"])
def test_fp32_blobs_take_the_same_path(tmp_path: Path, params: str) -> None:
    """A data-dependent (fp32) input reaches ``forward_bf16`` as fp32: the same values as
    ``forward``, and for bf16 bits of the same values the same as well."""
    shape = (4, 37, 35)
    param = tmp_path / "pool.param"
    param.write_text(param_text({"data": shape}, [f"Pooling op 1 1 data out {params}"]))
    kernel = Plan(load_model(param, None, {"data": shape}))._program[-1].kernel
    u = to_bf16(np.random.default_rng(24).uniform(-2, 2, shape).astype(np.float32))
    x = from_bf16(u)
    want = kernel.forward([x])[0].copy()
    assert kernel.forward_bf16([x])[0].tobytes() == want.tobytes()
    assert kernel.forward_bf16([u])[0].tobytes() == want.tobytes()


# (channels, h, w, k, stride, (top, bottom, left, right) pads)
ROW_RUNS = [
    (3, 13, 13, 3, 2, (0, 0, 0, 0)),
    (3, 14, 15, 3, 2, (0, 1, 0, 1)),  # full padding's tail: windows past the input
    (2, 9, 40, 3, 1, (1, 1, 1, 1)),  # three runs a row, the last partial
    (2, 8, 8, 2, 2, (0, 0, 0, 0)),
    (2, 9, 37, 2, 2, (0, 1, 0, 1)),
    (2, 7, 7, 2, 1, (0, 1, 0, 1)),
    (4, 10, 10, 3, 2, (0, 2, 0, 2)),  # last windows wholly in the border
]


@pytest.mark.parametrize(("c", "h", "w", "k", "stride", "pads"), ROW_RUNS,
                         ids=[f"{c}x{h}x{w}-k{k}-s{s}-{p}" for c, h, w, k, s, p in ROW_RUNS])
@pytest.mark.parametrize("parts", [1, 2])
def test_max_pooling_row_runs_give_the_planes_bits(c: int, h: int, w: int, k: int, stride: int,
                                                   pads: tuple[int, int, int, int], parts: int) -> None:
    """``jit.poolrows`` (16 maxima of a row in registers, masked loads from the planar input)
    stores what ``jit.pooling.pool2d`` does, bit for bit, NaNs and signed zeros in the input
    included (the same comparison tree: which NaN wins, -0.0 against +0.0); nothing written
    outside the output. (It runs on any host, fast only on AVX-512 ones, which take it.)"""
    pt, pb, pl, pr = pads
    oh, ow = (h + pt + pb - k) // stride + 1, (w + pl + pr - k) // stride + 1
    x = to_bf16(np.random.default_rng(c * k + stride).standard_normal((c, h, w)).astype(np.float32))
    flat = x.reshape(-1)
    flat[::7], flat[3::11], flat[5::13] = 0x7FC1, 0x8000, 0xFFC3  # NaNs of both signs, -0.0
    geo = jit.geometry(c, 1, 1, k, k, stride, stride, 1, 1, pt, pl, oh, ow)
    planes = np.zeros((c, oh * ow), np.uint16)
    rows = np.full((c + 1, oh * ow), 7, np.uint16)  # a row past the output (its first rows: contiguous)
    with jit.launch():
        jit.pooling.pool2d(x, geo, True, np.float32(BF16_LOWEST), np.zeros((0, 0), np.float32), np.float32(1.0),
                           planes, parts)
        jit.poolrows.max_pool_rows(x, geo, np.float32(BF16_LOWEST), rows[:-1], parts)
    assert np.array_equal(planes, rows[:-1])
    assert (rows[-1] == 7).all()


@pytest.mark.parametrize(("params", "wide"), [("0=0 1=3 2=2", True), ("0=0 1=2 2=2", True), ("0=0 1=3 2=1 3=1", True),
                                              ("0=1 1=3 2=2", False), ("0=0 1=3 2=3", False), ("0=0 1=5 2=2", False)])
def test_max_pooling_takes_row_runs_where_the_rule_says(tmp_path: Path, params: str, wide: bool) -> None:
    """On AVX-512 hosts max pooling of 2x2 and 3x3 windows at stride 1 and 2 runs as row runs;
    averages, stride 3 and other windows on the planes, as everything on other hosts."""
    shape = (4, 20, 20)
    param = tmp_path / "pool.param"
    param.write_text(param_text({"data": shape}, [f"Pooling op 1 1 data out {params}"]))
    plan = Plan(load_model(param, None, {"data": shape}))
    assert plan._program[-1].kernel.row_runs is (wide and jit.VECTORS.vector_bits == 512)
