"""BinaryOp and two-input Eltwise on the numba kernel (``jit.elementwise.binary``): which layers take it,
every op it runs against ncnn over every broadcast form, and the same bits as the numpy path
it replaced (widen, op in fp32, round to nearest even)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_unary_binary import BROADCASTS, binary_inputs, check
from tests.support.params import param_text
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.executor import Plan, StepKind
from vkserve.devices.cpu.jit import elementwise as jit_elementwise
from vkserve.models.graph import load_model

#: add sub mul div max min rsub rdiv: the ops the kernel runs (directly or swapped)
JIT_OPS = (0, 1, 2, 3, 4, 5, 7, 8)


def plan_for(tmp_path: Path, lines: list[str], inputs: dict[str, np.ndarray]) -> Plan:
    param = tmp_path / "case.param"
    param.write_text(param_text(inputs, lines))
    shapes = {k: v.shape for k, v in inputs.items()}
    return Plan(load_model(param, None, shapes), shapes)


def kinds(plan: Plan) -> dict[str, StepKind]:
    return {step.name: step.kind for step in plan._program}


@pytest.mark.parametrize("op", JIT_OPS)
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_jit_ops_match_ncnn_over_every_broadcast(tmp_path: Path, op: int, shapes) -> None:
    check(tmp_path, f"BinaryOp b 2 1 a b out 0={op}", binary_inputs(op, *shapes, seed=op))


@pytest.mark.parametrize(("a", "b", "taken"), [
    ((8, 6, 5), (8, 6, 5), True),  # full
    ((8, 6, 5), (8, 1, 1), True),  # per channel (a squeeze-excitation scale)
    ((8, 6, 5), (1, 1, 5), True),  # along w
    ((8, 1, 1), (8, 6, 5), True),  # a broadcast: swapped
    ((8, 6, 5), (1,), True),  # a one-value tensor
    ((8, 6, 5), (1, 6, 1), False),  # along h only: numpy
])
def test_which_forms_take_the_kernel(tmp_path: Path, a, b, taken: bool) -> None:
    inputs = binary_inputs(2, a, b)
    plan = plan_for(tmp_path, ["BinaryOp m 2 1 a b out 0=2"], inputs)
    assert (kinds(plan)["m"] is StepKind.STORE) is taken
    check(tmp_path, "BinaryOp m 2 1 a b out 0=2", inputs)


def test_pow_and_atan2_stay_on_numpy(tmp_path: Path) -> None:
    inputs = binary_inputs(6, (4, 5), (4, 5))
    plan = plan_for(tmp_path, ["BinaryOp p 2 1 a b out 0=6", "BinaryOp q 2 1 out b y 0=10"], inputs)
    assert set(kinds(plan).values()) - {StepKind.ALIAS} == {StepKind.WIDENED}


@pytest.mark.parametrize("line", [
    "BinaryOp m 2 1 a b out 0=2", "BinaryOp m 2 1 a b out 0=8", "BinaryOp m 1 1 a out 0=3 1=1 2=-1.25",
    "Eltwise m 2 1 a b out 0=1", "Eltwise m 2 1 a b out 0=0", "Eltwise m 2 1 a b out 0=2",
])
def test_same_bits_as_the_numpy_path(tmp_path: Path, line: str) -> None:
    rng = np.random.default_rng(3)
    inputs = {"a": rng.standard_normal((6, 7, 9)).astype(np.float32),
              "b": rng.standard_normal((6, 7, 9)).astype(np.float32)}
    if " 1 1 a " in line:
        del inputs["b"]
    plan = plan_for(tmp_path, [line], inputs)
    numpy_plan = plan_for(tmp_path, [line], inputs)
    for step in numpy_plan._program:
        if step.name == "m":
            step.kernel.form = None  # the numpy forward, widened inputs
    numpy_plan._prepare()
    assert kinds(plan)["m"] is StepKind.STORE and kinds(numpy_plan)["m"] is StepKind.WIDENED
    np.testing.assert_array_equal(plan.run(inputs)["out"], numpy_plan.run(inputs)["out"])


#: (layer, b's shape): BinaryOp add and mul over each form of b (full, one per row, one row, a
#: scalar), Eltwise sum and product (same-shaped inputs)
ONE_LOOP = [*((f"BinaryOp m 2 1 a b t 0={op}", b) for op in (0, 2)
              for b in ((6, 7, 9), (6, 1, 1), (1, 1, 9), (1, 1, 1))),
            *((f"Eltwise m 2 1 a b t 0={op}", (6, 7, 9)) for op in (1, 0))]


@pytest.mark.parametrize("act", ["", "ReLU r 1 1 t out", "Clip r 1 1 t out 0=-0.5 1=0.75"],
                         ids=["none", "relu", "clip"])
@pytest.mark.parametrize(("layer", "b_shape"), ONE_LOOP, ids=lambda v: str(v).split(" m ")[0].replace(" ", ""))
def test_one_loop_adds_and_multiplies_have_the_numpy_paths_bits(tmp_path: Path, layer: str, act: str,
                                                                b_shape: tuple[int, ...]) -> None:
    """Adds and multiplies with at most a ReLU or Clip after run in one loop a row (``_add_or_mul``),
    over every form of ``b`` (full, one per row, one row, a scalar): the bits of the numpy path
    (widened inputs, the op and the activation in fp32, rounded to nearest even), on 7 x 9 rows
    (a vector and a tail each)."""
    rng = np.random.default_rng(5)
    inputs = {"a": rng.standard_normal((6, 7, 9)).astype(np.float32),
              "b": rng.standard_normal(b_shape).astype(np.float32)}
    lines = [layer.replace(" t ", " out ") if not act else layer, *([act] if act else [])]
    plan = plan_for(tmp_path, lines, inputs)
    numpy_plan = plan_for(tmp_path, lines, inputs)
    for step in numpy_plan._program:
        if step.name == "m":
            step.kernel.form = None
    numpy_plan._prepare()
    assert kinds(plan)["m"] is StepKind.STORE and kinds(numpy_plan)["m"] is StepKind.WIDENED
    if act:
        assert plan.fused == [("m", "r")]
    got = plan.run(inputs)["out"]
    np.testing.assert_array_equal(got, numpy_plan.run(inputs)["out"])
    if act.startswith("ReLU"):
        assert (got >= 0).all() and (got == 0).any()


def test_eltwise_weighted_sum_and_fused_relu_match_ncnn(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    inputs = {"a": rng.standard_normal((4, 6, 6)).astype(np.float32),
              "b": rng.standard_normal((4, 6, 6)).astype(np.float32)}
    lines = ["Eltwise s 2 1 a b sum 0=1 -23301=2,0.5,-2.0", "ReLU r 1 1 sum out"]
    plan = plan_for(tmp_path, lines, inputs)
    assert plan.fused == [("s", "r")] and kinds(plan)["s"] is StepKind.STORE
    check(tmp_path, lines[0], inputs)
    want = np.maximum(0.5 * inputs["a"] - 2.0 * inputs["b"], 0)
    np.testing.assert_allclose(plan.run(inputs)["out"], want, rtol=1e-2, atol=1e-2)


def test_layout_views() -> None:
    assert jit_elementwise.layout((2, 3, 5), (2, 3, 5), (2, 3, 5)) == (2, 15, jit_elementwise.B_FULL)
    assert jit_elementwise.layout((2, 3, 5), (2, 3, 1), (2, 3, 5)) == (6, 5, jit_elementwise.B_PER_ROW)
    assert jit_elementwise.layout((2, 3, 5), (1, 1, 5), (2, 3, 5)) == (6, 5, jit_elementwise.B_ROW)
    assert jit_elementwise.layout((2, 3, 5), (1, 1, 1), (2, 3, 5)) == (2, 15, jit_elementwise.B_SCALAR)
    assert jit_elementwise.layout((2, 3, 5), (1, 3, 1), (2, 3, 5)) is None
    assert jit_elementwise.layout((2, 1, 5), (2, 3, 5), (2, 3, 5)) is None


ACTIVATIONS = ["ReLU r 1 1 x1 y", "ReLU r 1 1 x1 y 0=0.1", "Clip r 1 1 x1 y 0=-0.5 1=0.75",
               "Sigmoid r 1 1 x1 y", "Swish r 1 1 x1 y", "HardSigmoid r 1 1 x1 y 0=0.2 1=0.5",
               "HardSwish r 1 1 x1 y 0=0.2 1=0.5", "GELU r 1 1 x1 y", "GELU r 1 1 x1 y 0=1"]


@pytest.mark.parametrize("line", ACTIVATIONS, ids=lambda s: s.split()[0] + s.split(" y")[1])
def test_unfused_activations_run_as_one_pass(tmp_path: Path, line: str) -> None:
    """x feeds the activation and a second reader (as mobilenet_v3's x * hardsigmoid(x)), so
    nothing absorbs the activation: it runs on ``activation``, matching ncnn and numpy."""
    x = np.random.default_rng(8).uniform(-4, 4, (16, 9, 11)).astype(np.float32)
    lines = ["Split s 1 2 data x1 x2", line, "BinaryOp m 2 1 x2 y out 0=2"]
    inputs = {"data": x}
    plan = plan_for(tmp_path, lines, inputs)
    assert plan.fused == [] and kinds(plan)["r"] is StepKind.STORE
    check(tmp_path, line.replace("x1", "data").replace(" y", " out", 1), inputs)
    kernel = next(s.kernel for s in plan._program if s.name == "r")
    u = to_bf16(x)
    want = kernel.forward([from_bf16(u)])[0].copy()  # numpy, fp32
    got = np.empty(x.shape, dtype=np.uint16)
    kernel.forward_store([u], [got], [])
    np.testing.assert_allclose(from_bf16(got), want, rtol=1e-2, atol=1e-6)


def test_batchnorm_runs_compiled_with_the_relu_after_it(tmp_path: Path) -> None:
    """BatchNorm as one affine pass (``jit.elementwise.affine``), the ReLU after it fused into
    its store (densenet's pre-activation pairs), against ncnn and the numpy path."""
    x = np.random.default_rng(4).uniform(-3, 3, (12, 9, 11)).astype(np.float32)
    lines = ["BatchNorm bn 1 1 data b 0=12", "ReLU r 1 1 b out"]
    plan = plan_for(tmp_path, lines, {"data": x})
    assert [step.fused for step in plan._steps if step.name == "bn"] == [["r"]]
    assert kinds(plan)["bn"] is StepKind.STORE
    got = plan.run({"data": x})["out"]
    kernel = next(s.kernel for s in plan._program if s.name == "bn")
    want = np.maximum(kernel.forward([from_bf16(to_bf16(x))])[0], 0)  # numpy, fp32
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-6)
    assert (got == 0).any() and (got > 0).any()
    check(tmp_path, "BatchNorm bn 1 1 data out 0=12", {"data": x})
