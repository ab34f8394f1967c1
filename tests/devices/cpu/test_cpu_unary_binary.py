"""UnaryOp, BinaryOp and Clip on the CPU engine (bf16 storage) against the ncnn package.

Every UnaryOp op on inputs inside its domain (ncnn's x86 kernels give NaN or approximation
artefacts outside it); the rounding ops on bf16- and fp16-exact inputs that include the ties
(round is half to even). Every BinaryOp op, elementwise and with_scalar, on inputs where the
float quotient of fmod / remainder / floor_divide is never near a rounding edge, and every
broadcast form of 1-D..4-D operand pairs; pairs that do not broadcast are refused at load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.params import param_text
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model
from vkserve.models.layers import BINARY_OPS, UNARY_OPS

STEPS = np.arange(-40, 40, dtype=np.float32) / 8  # exact in bf16 and fp16; holds the ties
#: op_type -> input range inside the op's domain (default [-3, 3])
DOMAINS = {5: (0.1, 4.0), 6: (0.1, 4.0), 8: (0.1, 4.0), 17: (0.1, 4.0), 11: (-1.3, 1.3),
           12: (-0.95, 0.95), 13: (-0.95, 0.95), 26: (-0.95, 0.95), 25: (1.05, 4.0),
           27: (-0.9, 3.0)}
ROUNDING = {2, 3, 18, 19, 20}
MOD_OPS = {12, 13, 15, 16, 17, 18}
UNARY_SHAPES = [(80,), (8, 10), (4, 4, 5), (2, 2, 4, 5)]


def unary_input(op: int, shape: tuple[int, ...]) -> np.ndarray:
    if op in ROUNDING:
        return STEPS.reshape(shape)
    rng = np.random.default_rng(op)
    if op == 15:  # reciprocal: away from 0
        return (rng.uniform(0.25, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    lo, hi = DOMAINS.get(op, (-3.0, 3.0))
    return rng.uniform(lo, hi, shape).astype(np.float32)


def binary_values(op: int, shape: tuple[int, ...], seed: int, divisor: bool) -> np.ndarray:
    """fmod / remainder / floor_divide (12, 13, 15..18): dividends (4k + 1) / 16, divisors
    +-0.75, 1.25, 1.75, so quotients (4k + 1) / 4m (m odd) are never integers or ties (ncnn's
    x86 fmod mis-truncates some negative integer quotients); pow: positive bases; otherwise
    magnitudes in [0.5, 2] of both signs. All exact in bf16 and fp16."""
    rng = np.random.default_rng(seed)
    if op in MOD_OPS:
        if divisor:
            v = rng.choice([0.75, 1.25, 1.75], shape) * rng.choice([-1.0, 1.0], shape)
        else:
            v = (4 * rng.integers(-12, 13, shape) + 1) / 16.0
        return v.astype(np.float32)
    v = rng.uniform(0.5, 2.0, shape)
    if op not in (6, 9):
        v *= rng.choice([-1.0, 1.0], shape)
    return v.astype(np.float32)


def binary_inputs(op: int, shape_a: tuple[int, ...], shape_b: tuple[int, ...],
                  seed: int = 0) -> dict[str, np.ndarray]:
    reverse = op in (13, 16, 18)  # the divisor is a
    return {"a": binary_values(op, shape_a, seed, reverse),
            "b": binary_values(op, shape_b, seed + 1, not reverse)}


def check(tmp_path: Path, line: str, inputs: dict[str, np.ndarray]) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(inputs, [line]))
    graph = load_model(param, None, {k: v.shape for k, v in inputs.items()}, seed=7)
    report = verify_cpu(graph, param, None, inputs)
    details = [(o.name, o.shape, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]
    assert report.ok, details


@pytest.mark.parametrize("op", sorted(UNARY_OPS), ids=lambda op: UNARY_OPS[op])
def test_unaryop(tmp_path: Path, op: int) -> None:
    shape = UNARY_SHAPES[op % len(UNARY_SHAPES)]
    check(tmp_path, f"UnaryOp u 1 1 x out 0={op}", {"x": unary_input(op, shape)})


def test_unaryop_round_is_half_to_even(tmp_path: Path) -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.5], np.float32)
    check(tmp_path, "UnaryOp u 1 1 x out 0=18", {"x": x})
    param = tmp_path / "case.param"
    graph = load_model(param, None, {"x": x.shape})
    got = Plan(graph, {"x": x.shape}).run({"x": x})["out"]
    np.testing.assert_array_equal(got, [-2, -2, -0, 0, 2, 2, 4, -4])


@pytest.mark.parametrize("line", ["UnaryOp u 1 1 x out 0=28", "BinaryOp b 1 1 x out 0=19 1=1"])
def test_unknown_op_type_is_a_load_error(tmp_path: Path, line: str) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], [line]))
    with pytest.raises(ModelFormatError, match="param 0"):
        load_model(param, None, {"x": (4,)})


@pytest.mark.parametrize("op", sorted(BINARY_OPS), ids=lambda op: BINARY_OPS[op])
def test_binaryop(tmp_path: Path, op: int) -> None:
    check(tmp_path, f"BinaryOp b 2 1 a b out 0={op}", binary_inputs(op, (3, 4, 5), (3, 4, 5)))
    # with_scalar: b a divisor (-1.25) or, for the reverse ops, a dividend (-19 / 16) of the
    # kind above; 1.25 for the pow ops
    scalar = "1.25" if op in (6, 9) else "-1.1875" if op in (13, 16, 18) else "-1.25"
    x = binary_values(op, (2, 3, 2, 5), op, divisor=op in (13, 16, 18))
    check(tmp_path, f"BinaryOp b 1 1 a out 0={op} 1=1 2={scalar}", {"a": x})


#: every way ncnn lines up two operands: same rank with unit axes, and each lower rank
#: against each higher one (1-D per outer axis or along w, 2-D / 3-D leading axes)
BROADCASTS = [
    ((7,), (7,)), ((7,), (1,)), ((1,), (7,)),
    ((3, 5), (1, 5)), ((3, 5), (3, 1)), ((1, 5), (3, 1)),
    ((2, 3, 5), (2, 1, 5)), ((2, 3, 5), (1, 3, 5)), ((2, 3, 5), (2, 3, 1)),
    ((2, 1, 1), (1, 3, 5)), ((1, 1, 5), (2, 3, 1)),
    ((2, 3, 4, 5), (2, 1, 4, 1)), ((1, 3, 1, 5), (2, 1, 4, 1)), ((2, 3, 4, 5), (1, 1, 1, 1)),
    ((3,), (3, 5)), ((5,), (3, 5)), ((1,), (3, 5)), ((3, 5), (5,)), ((3, 5), (3,)),
    ((4,), (4, 4)),  # matches both axes: ncnn takes h
    ((2,), (2, 3, 5)), ((5,), (2, 3, 5)), ((2, 3, 5), (2,)), ((5,), (5, 3, 5)),
    ((2,), (2, 3, 4, 5)), ((5,), (2, 3, 4, 5)), ((2, 3, 4, 5), (1,)),
    ((2, 3), (2, 3, 5)), ((2, 3, 5), (2, 1)), ((1, 3), (2, 3, 5)),
    ((2, 3), (2, 3, 4, 5)), ((2, 3, 4, 5), (2, 1)),
    ((2, 3, 4), (2, 3, 4, 5)), ((2, 3, 4, 5), (1, 3, 1)),
]


@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_binaryop_broadcast(tmp_path: Path, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    for op in (1, 11):  # sub and ratan2: asymmetric, so swapped operands would show
        check(tmp_path, f"BinaryOp b 2 1 a b out 0={op}", binary_inputs(op, *shapes, seed=op))


@pytest.mark.parametrize("shapes", [((3, 5), (4, 5)), ((7,), (5,)), ((2, 3, 5), (3,)),
                                    ((2, 3, 4, 5), (2, 2, 1))], ids=str)
def test_binaryop_refuses_what_does_not_broadcast(tmp_path: Path, shapes) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(["a", "b"], ["BinaryOp b 2 1 a b out 0=0"]))
    with pytest.raises(ModelFormatError, match="cannot broadcast .* differ at axis"):
        load_model(param, None, {"a": shapes[0], "b": shapes[1]})


@pytest.mark.parametrize("params", ["0=-0.5 1=0.7", "", "0=0.25", "1=-0.25", "0=1.0 1=-1.0"])
def test_clip_every_rank(tmp_path: Path, params: str) -> None:
    """Bounds given, defaulted (+-FLT_MAX), one side, and min > max (max wins, as ncnn)."""
    for i, shape in enumerate(UNARY_SHAPES):
        x = np.random.default_rng(i).uniform(-2, 2, shape).astype(np.float32)
        check(tmp_path, f"Clip c 1 1 x out {params}", {"x": x})
