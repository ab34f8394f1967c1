"""BatchNorm, Scale, Bias, LayerNorm, RMSNorm, GroupNorm and InstanceNorm on the CPU engine
against the ncnn package, 1-D to 4-D blobs.

Each case is a one-layer .param with the models package's seeded random weights (BatchNorm's
var_data positive), written to a .bin for ncnn; the bf16 engine must meet the verify tolerance
(cosine >= 0.999, max abs err <= 2 % of the reference's max abs).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_jit_elementwise import kinds, plan_for
from tests.support.cpu_engine import check_against_ncnn, outputs_on_splits
from tests.support.params import param_text
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.executor import StepKind
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model
from vkserve.models.layers import ShapeError

RNG = np.random.default_rng(4321)

SHAPES = [(7,), (5, 9), (6, 5, 7), (3, 4, 5, 6)]


def check(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]]) -> None:
    check_against_ncnn(tmp_path, line, shapes, RNG)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("params", ["", "1=1.000000e-03", "1=0.5"])
def test_batchnorm(tmp_path: Path, shape: tuple[int, ...], params: str) -> None:
    check(tmp_path, f"BatchNorm op 1 1 data out 0={shape[0]} {params}", {"data": shape})


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias_term", [0, 1])
def test_scale(tmp_path: Path, shape: tuple[int, ...], bias_term: int) -> None:
    check(tmp_path, f"Scale op 1 1 data out 0={shape[0]} 1={bias_term}", {"data": shape})


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scale_two_inputs(tmp_path: Path, shape: tuple[int, ...]) -> None:
    check(tmp_path, "Scale op 2 1 data s out 0=-233", {"data": shape, "s": (shape[0],)})


@pytest.mark.parametrize("shape, size", [((7,), 1), ((5, 9), 3), ((6, 5, 7), 6), ((3, 4, 5, 6), 3),
                                         ((4, 5, 6), 9)], ids=str)
def test_bias(tmp_path: Path, shape: tuple[int, ...], size: int) -> None:
    check(tmp_path, f"Bias op 1 1 data out 0={size}", {"data": shape})


@pytest.mark.parametrize("line, shapes", [
    ("BatchNorm op 1 1 data out 0=4", {"data": (5, 3)}),
    ("Scale op 1 1 data out 0=4 1=1", {"data": (3, 4, 4)}),
    ("Scale op 2 1 data s out 0=-233", {"data": (3, 4, 4), "s": (3, 1, 1)}),
    ("Bias op 1 1 data out 0=2", {"data": (3, 4, 4)}),
])
def test_shape_errors(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]]) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(shapes, [line]))
    with pytest.raises((ShapeError, ModelFormatError)):
        load_model(param, None, shapes, seed=7)


@pytest.mark.parametrize("line", ["BatchNorm op 1 1 data out 0=0",
                                  "Scale op 1 1 data out 0=-233 1=1",
                                  "Bias op 1 1 data out"])
def test_param_errors(tmp_path: Path, line: str) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text({"data": (3, 4)}, [line]))
    with pytest.raises(ModelFormatError):
        load_model(param, None, {"data": (3, 4)}, seed=7)


# (shape, affine_size): every run length ncnn picks for each rank
LAST_DIMS = [((7,), 7), ((5, 9), 9), ((6, 5, 7), 7), ((6, 5, 7), 35), ((3, 4, 5, 6), 6),
             ((3, 4, 5, 6), 30), ((3, 4, 5, 6), 120), ((2, 300), 300)]


@pytest.mark.parametrize("shape, size", LAST_DIMS, ids=str)
@pytest.mark.parametrize("params", ["", "2=0", "1=1.000000e-05", "1=0.5 2=1"])
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_last_dims_norm(tmp_path: Path, kind: str, shape: tuple[int, ...], size: int,
                        params: str) -> None:
    check(tmp_path, f"{kind} op 1 1 data out 0={size} {params}", {"data": shape})


@pytest.mark.parametrize("shape, group", [((6,), 3), ((6, 5), 2), ((6, 4, 5), 3), ((6, 2, 3, 5), 6),
                                          ((8, 3, 5), 1)], ids=str)
@pytest.mark.parametrize("params", ["", "3=0", "2=1.000000e-05", "2=0.5 3=1"])
def test_groupnorm(tmp_path: Path, shape: tuple[int, ...], group: int, params: str) -> None:
    check(tmp_path, f"GroupNorm op 1 1 data out 0={group} 1={shape[0]} {params}", {"data": shape})


@pytest.mark.parametrize("shape", [(6, 4, 5), (3, 2, 3, 5), (2, 1, 3)], ids=str)
@pytest.mark.parametrize("params", ["", "2=0", "1=1.000000e-05", "1=0.5 2=1"])
def test_instancenorm(tmp_path: Path, shape: tuple[int, ...], params: str) -> None:
    check(tmp_path, f"InstanceNorm op 1 1 data out 0={shape[0]} {params}", {"data": shape})


@pytest.mark.parametrize("line, shapes", [
    ("LayerNorm op 1 1 data out 0=5", {"data": (3, 7)}),
    ("RMSNorm op 1 1 data out 0=5", {"data": (3, 4, 7)}),
    ("GroupNorm op 1 1 data out 0=2 1=4", {"data": (6, 4)}),
    ("InstanceNorm op 1 1 data out 0=3", {"data": (3, 4)}),
    ("InstanceNorm op 1 1 data out 0=3", {"data": (4, 4, 4)}),
])
def test_norm_shape_errors(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]]) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(shapes, [line]))
    with pytest.raises((ShapeError, ModelFormatError)):
        load_model(param, None, shapes, seed=7)


@pytest.mark.parametrize("line", ["GroupNorm op 1 1 data out 0=2 1=3",
                                  "GroupNorm op 1 1 data out 0=0 1=3",
                                  "InstanceNorm op 1 1 data out 0=0"])
def test_norm_param_errors(tmp_path: Path, line: str) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text({"data": (3, 4)}, [line]))
    with pytest.raises(ModelFormatError):
        load_model(param, None, {"data": (3, 4)}, seed=7)


@pytest.mark.parametrize("shape", [(7,), (5, 9), (6, 5, 7), (3, 4, 5, 6)], ids=str)
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_last_dims_norm_no_affine_size(tmp_path: Path, kind: str, shape: tuple[int, ...]) -> None:
    """affine=0 with affine_size left at 0: 3-D blobs normalise h*w, 4-D ones d*h*w."""
    check(tmp_path, f"{kind} op 1 1 data out 2=0", {"data": shape})


@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_last_dims_norm_is_compiled_the_same_bits_on_any_split(tmp_path: Path, kind: str) -> None:
    """``jit.norm.last_dims`` stores it (rows of 100: six whole lane groups and a tail), with
    numpy's values to bf16's precision and the same bits at 1 and 2 threads and any task count."""
    x = np.random.default_rng(2).standard_normal((40, 100)).astype(np.float32) * 3 + 1
    plan = plan_for(tmp_path, [f"{kind} op 1 1 data out 0=100 1=1.000000e-05"], {"data": x})
    assert kinds(plan)["op"] is StepKind.STORE
    kernel = next(s.kernel for s in plan._program if s.name == "op")
    want = kernel.forward([from_bf16(to_bf16(x))])[0]  # numpy, fp32
    outs = outputs_on_splits(plan, {"data": x}, "out")
    np.testing.assert_allclose(outs[0], want, rtol=1e-2, atol=1e-3)
    for out in outs[1:]:
        np.testing.assert_array_equal(outs[0], out)
