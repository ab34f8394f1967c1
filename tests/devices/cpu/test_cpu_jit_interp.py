"""Bilinear and bicubic Interp on the numba kernel (``jit.interp``): the Plan stores it itself,
its values are numpy's separable resize of the same bf16 values (ncnn's order: along w, then
h) to bf16 storage's precision, against the ncnn package too (up and down, align_corner, 2-D
blobs, large factors), with a fused activation, the same bits whatever the split into tasks
and the thread count; nearest stays a gather of the stored values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_jit_elementwise import kinds, plan_for
from tests.devices.cpu.test_cpu_layers import check
from tests.support.cpu_engine import outputs_on_splits
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.executor import StepKind

CASES = [
    ("0=2 1=2.000000e+00 2=2.000000e+00", (5, 6, 7)),
    ("0=2 1=5.000000e-01 2=5.000000e-01", (4, 12, 10)),
    ("0=2 3=64 4=64", (3, 8, 8)),  # 8x up, as a segmentation head's last layer
    ("0=2 3=9 4=11 6=1", (4, 6, 7)),  # align_corner
    ("0=3 3=13 4=10", (3, 7, 8)),  # bicubic
    ("0=3 3=5 4=4 6=1", (2, 9, 9)),  # bicubic down, align_corner
    ("0=2 3=1 4=9", (6, 1, 1)),  # one pixel in
]


def _input(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return from_bf16(to_bf16(x))  # values bf16 storage keeps: both sides start from them


@pytest.mark.parametrize(("params", "shape"), CASES, ids=[c[0] for c in CASES])
def test_resize_is_stored_by_the_kernel_with_numpys_values(tmp_path: Path, params: str,
                                                          shape: tuple[int, ...]) -> None:
    x = _input(len(params), shape)
    plan = plan_for(tmp_path, [f"Interp op 1 1 data out {params}"], {"data": x})
    assert kinds(plan)["op"] is StepKind.STORE
    got = plan.run({"data": x})["out"]
    kernel = next(step.kernel for step in plan._program if step.name == "op")
    want = kernel.forward([x])[0]  # numpy, fp32, the same taps and order
    assert got.shape == want.shape
    # products summed with fused multiply-adds here, rounded apart by numpy: 1 bf16 step at most
    np.testing.assert_allclose(got, from_bf16(to_bf16(want)), rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize(("params", "shape"), CASES, ids=[c[0] for c in CASES])
def test_resize_matches_ncnn(tmp_path: Path, params: str, shape: tuple[int, ...]) -> None:
    check(tmp_path, [f"Interp op 1 1 data out {params}"], {"data": _input(3, shape)})


def test_a_2d_blob_is_resized_along_w(tmp_path: Path) -> None:
    x = _input(5, (6, 7))
    plan = plan_for(tmp_path, ["Interp op 1 1 data out 0=2 3=1 4=15"], {"data": x})
    assert kinds(plan)["op"] is StepKind.STORE
    check(tmp_path, ["Interp op 1 1 data out 0=2 3=1 4=15"], {"data": x})


def test_fused_activation_tasks_and_threads_give_the_same_bits(tmp_path: Path) -> None:
    x = _input(7, (21, 16, 16))
    plan = plan_for(tmp_path, ["Interp op 1 1 data r 0=2 3=128 4=128", "ReLU act 1 1 r out"], {"data": x})
    outs = outputs_on_splits(plan, {"data": x}, "out")
    assert (outs[0] >= 0).all() and (outs[0] > 0).any()
    for out in outs[1:]:
        np.testing.assert_array_equal(outs[0], out)


def test_nearest_stays_a_gather(tmp_path: Path) -> None:
    x = _input(1, (3, 5, 6))
    plan = plan_for(tmp_path, ["Interp op 1 1 data out 0=1 1=2.000000e+00 2=2.000000e+00"], {"data": x})
    assert kinds(plan)["op"] is StepKind.BF16_NATIVE
    np.testing.assert_array_equal(plan.run({"data": x})["out"], x.repeat(2, axis=1).repeat(2, axis=2))
