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
from vkserve.devices.cpu import threads
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
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


@pytest.mark.parametrize("shape,params", CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_jit_pooling_matches_ncnn_and_the_numpy_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      shape: tuple[int, int, int], params: str) -> None:
    line = f"Pooling op 1 1 data out {params}"
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(20))
    param = tmp_path / "pool.param"
    param.write_text(param_text({"data": shape}, [line]))
    plan = Plan(load_model(param, None, {"data": shape}))
    kind, kernel = plan._program[-1].kind, plan._program[-1].kernel
    assert kind is StepKind.STORE and kernel.windowed
    x = from_bf16(to_bf16(np.random.default_rng(21).uniform(-2, 2, shape).astype(np.float32)))
    want = from_bf16(to_bf16(kernel.forward([x])[0]))
    runs = []
    for n in (1, max(2, threads.available_cores())):
        monkeypatch.setattr(threads, "THREADS", n)
        runs.append(plan.run({"data": x})["out"])
    assert runs[0].tobytes() == runs[1].tobytes() == want.tobytes()
    assert np.isfinite(runs[0]).all()


@pytest.mark.parametrize("shape", [(6, 1, 1), (5, 1, 7), (4, 2, 4), (7, 7, 7), (3, 112, 111), (9, 40)],
                         ids=["1", "7", "8", "49", "112x111", "2-D"])
@pytest.mark.parametrize("kind", ["0=0 4=1", "0=1 4=1"], ids=["max", "avg"])
def test_global_pooling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], kind: str) -> None:
    """Global pooling (average: ``jit.pooling.global_avg``, row lengths below, at and above its
    8 partial sums, with a tail; max: numpy): against ncnn, within 1e-6 of the exact mean / the
    exact maximum, and the same bits with 1 and N threads and as ``forward``."""
    line = f"Pooling op 1 1 data out {kind}"
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(22))
    param = tmp_path / "pool.param"
    param.write_text(param_text({"data": shape}, [line]))
    plan = Plan(load_model(param, None, {"data": shape}))
    kernel = plan._program[-1].kernel
    x = from_bf16(to_bf16(np.random.default_rng(23).uniform(0.5, 2, shape).astype(np.float32)))
    rows = x.reshape(-1, shape[-1] * shape[-2]) if len(shape) == 3 else x.reshape(1, -1)
    exact = rows.astype(np.float64).max(axis=1) if kind == "0=0 4=1" else rows.astype(np.float64).mean(axis=1)
    got = kernel.forward([x])[0]
    assert np.abs(got - exact).max() <= 1e-6 * np.abs(exact).max()
    runs = []
    for n in (1, max(2, threads.available_cores())):
        monkeypatch.setattr(threads, "THREADS", n)
        runs.append(plan.run({"data": x})["out"])
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
