"""LRN across channels on the numba kernel (``jit.lrn``): the Plan stores it itself, its values
are LRN's (computed here in float64, window sums taken directly) to bf16 storage's precision,
zeros and a zero bias (0 ** -beta) included, with a fused activation, the same bits on 1 and 2
threads; within-channel LRN stays on numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_jit_elementwise import kinds, plan_for
from vkserve.devices.cpu import threads
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.executor import StepKind


def _lrn64(x: np.ndarray, params: str) -> np.ndarray:
    """LRN across channels in float64: x * (bias + alpha / n * window sum of squares) ** -beta."""
    p = dict(kv.split("=") for kv in params.split())
    n, alpha, beta, bias = int(p["1"]), float(p["2"]), float(p["3"]), float(p["4"])
    sq = x.astype(np.float64) ** 2
    total = np.stack([sq[max(0, q - n // 2):q + n // 2 + 1].sum(axis=0) for q in range(len(x))])
    with np.errstate(all="ignore"):
        return x * (bias + alpha / n * total) ** -beta


def _input(seed: int, c: int = 12, h: int = 9, w: int = 11) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((c, h, w)).astype(np.float32) * 3
    x[2] = 0.0  # a whole channel of zeros
    x[:, 0, 0] = 0.0  # a pixel zero in every channel: the window's sum is 0 there
    return from_bf16(to_bf16(x))  # values bf16 storage keeps: both sides start from them


@pytest.mark.parametrize("params", ["1=5 2=1.000000e-04 3=0.75 4=1.0", "1=3 2=0.5 3=0.6 4=2.0",
                                    "1=1 2=1.0 3=1.5 4=0.0", "1=4 2=0.1 3=0.75 4=1.0"])
def test_across_channels_matches_the_definition(tmp_path: Path, params: str) -> None:
    x = _input(len(params))
    plan = plan_for(tmp_path, [f"LRN op 1 1 data out 0=0 {params}"], {"data": x})
    assert kinds(plan)["op"] is StepKind.STORE
    got = plan.run({"data": x})["out"]
    want = from_bf16(to_bf16(_lrn64(x, params).astype(np.float32)))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1.6e-2, atol=0)


def test_fused_activation_and_thread_counts_give_the_same_bits(tmp_path: Path) -> None:
    x = _input(7, c=40, h=20, w=20)
    plan = plan_for(tmp_path, ["LRN op 1 1 data l 0=0 1=5 2=1.000000e-02", "ReLU act 1 1 l out"], {"data": x})
    saved = threads.THREADS
    try:
        outs = []
        for n in (1, 2):
            threads.THREADS = n
            outs.append(plan.run({"data": x})["out"])
    finally:
        threads.THREADS = saved
    assert (outs[0] >= 0).all() and (outs[0] > 0).any()
    np.testing.assert_array_equal(outs[0], outs[1])


def test_within_channel_stays_on_numpy(tmp_path: Path) -> None:
    x = _input(3)
    plan = plan_for(tmp_path, ["LRN op 1 1 data out 0=1 1=3 2=0.1"], {"data": x})
    assert kinds(plan)["op"] is StepKind.WIDENED
