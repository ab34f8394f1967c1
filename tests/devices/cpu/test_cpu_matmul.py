"""Gemm and MatMul on the CPU engine against the ncnn package. Gemm: A / B / C as inputs or weights,
transA / transB, alpha / beta, every C broadcast, output_N1M / output_transpose, 1-D and
(c, 1, w) operands, and the exact lines pnnx writes for Linear layers (vit_tiny, convnext_tiny);
the Linear form's compiled kernel (``jit.linear``) on its own and in a Plan.

Each case is a one-layer .param with the models package's seeded random weights, written to a
.bin for ncnn; the bf16 engine must meet the verify tolerance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_jit_elementwise import kinds, plan_for
from tests.support.cpu_engine import check_against_ncnn, outputs_on_splits
from tests.support.params import param_text
from vkserve.devices.cpu import jit
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.executor import StepKind
from vkserve.devices.cpu.jit import linear as jit_linear
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model
from vkserve.models.layers import ShapeError

RNG = np.random.default_rng(2468)


def check(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]]) -> None:
    check_against_ncnn(tmp_path, line, shapes, RNG)


# (param line, input shapes): M=5, K=6, N=7 unless said
GEMM_CASES = [
    ("Gemm op 2 1 a b out", {"a": (5, 6), "b": (6, 7)}),
    ("Gemm op 2 1 a b out 2=1", {"a": (6, 5), "b": (6, 7)}),
    ("Gemm op 2 1 a b out 3=1", {"a": (5, 6), "b": (7, 6)}),
    ("Gemm op 2 1 a b out 2=1 3=1 0=0.5", {"a": (6, 5), "b": (7, 6)}),
    ("Gemm op 2 1 a b out", {"a": (6,), "b": (6, 7)}),
    ("Gemm op 2 1 a b out 3=1", {"a": (5, 6), "b": (6,)}),
    ("Gemm op 2 1 a b out", {"a": (5, 1, 6), "b": (6, 1, 7)}),
    ("Gemm op 2 1 a b out 11=1", {"a": (5, 6), "b": (6, 7)}),
    ("Gemm op 2 1 a b out 14=1", {"a": (5, 6), "b": (6, 7)}),
    ("Gemm op 2 1 a b out 11=1 14=1", {"a": (5, 6), "b": (6, 7)}),
    ("Gemm op 3 1 a b c out 0=2.0 1=3.0", {"a": (5, 6), "b": (6, 7), "c": (5, 7)}),
    ("Gemm op 3 1 a b c out 1=0.5", {"a": (5, 6), "b": (6, 7), "c": (1,)}),
    ("Gemm op 3 1 a b c out", {"a": (5, 6), "b": (6, 7), "c": (5,)}),
    ("Gemm op 3 1 a b c out", {"a": (5, 6), "b": (6, 7), "c": (7,)}),
    ("Gemm op 3 1 a b c out", {"a": (5, 6), "b": (6, 7), "c": (5, 1)}),
    ("Gemm op 3 1 a b c out 0=1.5", {"a": (5, 6), "b": (6, 7), "c": (1, 7)}),
    # constant operands (weights in ncnn's load order A, B, C)
    ("Gemm op 1 1 b out 4=1 7=5 9=6", {"b": (6, 7)}),
    ("Gemm op 1 1 b out 4=1 2=1 7=5 9=6", {"b": (6, 7)}),
    ("Gemm op 1 1 a out 5=1 8=7 9=6", {"a": (5, 6)}),
    ("Gemm op 1 1 a out 5=1 3=1 8=7 9=6", {"a": (5, 6)}),
    ("Gemm op 2 1 a c out 5=1 3=1 8=7 9=6", {"a": (5, 6), "c": (7,)}),
    ("Gemm op 1 1 a out 5=1 6=1 10=0 7=5 8=7 9=6 1=0.5", {"a": (5, 6)}),
    ("Gemm op 1 1 a out 5=1 6=1 10=1 7=5 8=7 9=6", {"a": (5, 6)}),
    ("Gemm op 1 1 a out 5=1 6=1 10=2 7=5 8=7 9=6", {"a": (5, 6)}),
    ("Gemm op 1 1 a out 5=1 6=1 10=3 7=5 8=7 9=6 0=0.25", {"a": (5, 6)}),
    ("Gemm op 1 1 a out 5=1 6=1 10=4 7=5 8=7 9=6", {"a": (5, 6)}),
    ("Gemm op 1 1 a out 5=1 6=1 10=-1 7=5 8=7 9=6", {"a": (5, 6)}),
    ("Gemm op 1 1 b out 4=1 6=1 10=3 7=5 8=7 9=6 11=1 14=1", {"b": (6, 7)}),
]


@pytest.mark.parametrize("line, shapes", GEMM_CASES, ids=[c[0][8:] + str(list(c[1].values())) for c in GEMM_CASES])
def test_gemm(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]]) -> None:
    check(tmp_path, line, shapes)


# the lines pnnx writes for nn.Linear in vit_tiny and convnext_tiny (M rows of K -> N)
PNNX_GEMM = [(197, 768, 192), (197, 192, 768), (3136, 384, 96), (3136, 96, 384)]


@pytest.mark.parametrize("m, n, k", PNNX_GEMM, ids=str)
def test_gemm_pnnx_linear(tmp_path: Path, m: int, n: int, k: int) -> None:
    check(tmp_path, f"Gemm gemm_0 1 1 a out 10=4 2=0 3=1 4=0 5=1 6=1 7={m} 8={n} 9={k}",
          {"a": (m, k)})


def _linear(m: int, n: int, k: int) -> str:
    """pnnx's line for nn.Linear(k, n) on m rows (B stored (N, K), a bias per column)."""
    return f"Gemm fc 1 1 data h 10=4 2=0 3=1 4=0 5=1 6=1 7={m} 8={n} 9={k}"


def test_linear_form_runs_compiled_with_the_gelu_after_it(tmp_path: Path) -> None:
    """The Linear form runs as ``jit.linear`` on the bf16 arena, the GELU after it fused into
    its store (convnext's and vit's MLPs): against numpy's fp32 path, and the Gemm against
    ncnn with two K blocks and an odd depth, rows and columns not whole tiles."""
    x = RNG.uniform(-2.0, 2.0, (37, 301)).astype(np.float32)
    plan = plan_for(tmp_path, [_linear(37, 150, 301), "GELU g 1 1 h out"], {"data": x})
    assert [step.fused for step in plan._steps if step.name == "fc"] == [["g"]]
    assert kinds(plan)["fc"] is StepKind.STORE
    got = plan.run({"data": x})["out"]
    step = next(s for s in plan._program if s.name == "fc")
    want = step.post[0].forward(step.kernel.forward([from_bf16(to_bf16(x))]))[0]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3 * float(np.abs(want).max()))
    check(tmp_path, _linear(37, 150, 301).replace("data h", "a out"), {"a": (37, 301)})


@pytest.mark.parametrize(("change", "shape"), [("0=0.5 2=0", (37, 301)), ("2=1", (301, 37)),
                                               ("14=1 2=0", (37, 301))])
def test_other_gemm_forms_stay_on_numpy(tmp_path: Path, change: str, shape: tuple[int, int]) -> None:
    """alpha, a transposed A, a transposed output: numpy's matmul (against ncnn above)."""
    line = _linear(37, 150, 301).replace("data h", "data out").replace("2=0", change)
    plan = plan_for(tmp_path, [line], {"data": RNG.uniform(-2.0, 2.0, shape).astype(np.float32)})
    assert kinds(plan)["fc"] is StepKind.WIDENED


def test_linear_form_same_bits_on_any_split(tmp_path: Path) -> None:
    x = RNG.uniform(-2.0, 2.0, (67, 301)).astype(np.float32)
    plan = plan_for(tmp_path, [_linear(67, 150, 301).replace("data h", "data out")], {"data": x})
    outs = outputs_on_splits(plan, {"data": x}, "out")
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (5, 7, 6), (9, 17, 3), (40, 130, 513), (197, 192, 64)], ids=str)
def test_linear_kernel_against_numpy_on_every_split(m: int, n: int, k: int) -> None:
    """``jit.linear`` itself: bias + A B (then ReLU) for A and B bf16, stored in fp32 and in
    bf16, the same bits for any rows and columns a task."""
    rng = np.random.default_rng(m * n + k)
    a = to_bf16(rng.uniform(-2.0, 2.0, (m, k)).astype(np.float32))
    b = to_bf16(rng.uniform(-2.0, 2.0, (k, n)).astype(np.float32))
    bias = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    want = np.maximum(from_bf16(a).astype(np.float64) @ from_bf16(b) + bias, 0)
    bp = jit_linear.pack_b(b)
    ops = jit.epilogue_ops(1, ())
    results = []
    for rb, cols in [(1, jit.conv.NR), (2, 4 * jit.conv.NR), (8, jit_linear.MAX_COLS), jit_linear.split(m, n, 2)]:
        out32 = np.full((m, n), np.nan, np.float32)
        out16 = np.zeros((m, n), np.uint16)
        with jit.launch(m * n * k):
            jit_linear.linear(a, bp, bias, ops, rb, cols, out32)
            jit_linear.linear(a, bp, bias, ops, rb, cols, out16)
        np.testing.assert_allclose(out32, want, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(out16, to_bf16(out32))
        results.append(out32)
    assert all(np.array_equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("line, shapes", [
    ("Gemm op 2 1 a b out", {"a": (5, 6), "b": (5, 7)}),
    ("Gemm op 2 1 a b out", {"a": (5, 2, 6), "b": (6, 7)}),
    ("Gemm op 2 1 a b out", {"a": (2, 5, 1, 6), "b": (6, 7)}),
    ("Gemm op 3 1 a b c out", {"a": (5, 6), "b": (6, 7), "c": (3,)}),
    ("Gemm op 1 1 a out 5=1 8=7 9=6", {"a": (5, 5)}),
])
def test_gemm_shape_errors(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]]) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(shapes, [line]))
    with pytest.raises((ShapeError, ModelFormatError)):
        load_model(param, None, shapes, seed=7)


@pytest.mark.parametrize("line", ["Gemm op 1 1 a out 5=1 8=7",
                                  "Gemm op 1 1 a out 4=1 9=6",
                                  "Gemm op 1 1 a out 5=1 6=1 8=7 9=6 10=3",
                                  "Gemm op 1 1 a out 5=1 6=1 7=5 8=7 9=6 10=5",
                                  "Gemm op 1 1 a out 5=1 8=7 9=6 18=2"])
def test_gemm_param_errors(tmp_path: Path, line: str) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text({"a": (5, 6)}, [line]))
    with pytest.raises(ModelFormatError):
        load_model(param, None, {"a": (5, 6)}, seed=7)


# MatMul: (A shape, B shape as stored without transB); K=6, M=5, N=7
MATMUL_PAIRS = [
    ((6,), (6,)), ((6,), (6, 7)), ((5, 6), (6,)), ((5, 6), (6, 7)), ((3, 5, 6), (6, 7)),
    ((5, 6), (3, 6, 7)), ((3, 5, 6), (3, 6, 7)), ((3, 5, 6), (1, 6, 7)), ((1, 5, 6), (3, 6, 7)),
    ((2, 3, 5, 6), (2, 3, 6, 7)), ((2, 1, 5, 6), (1, 3, 6, 7)), ((2, 3, 5, 6), (6, 7)),
    ((5, 6), (2, 3, 6, 7)), ((2, 3, 5, 6), (3, 6, 7)), ((3, 5, 6), (2, 3, 6, 7)),
    ((6,), (3, 6, 7)), ((3, 5, 6), (6,)), ((6,), (2, 3, 6, 7)), ((2, 3, 5, 6), (6,)),
    ((3, 197, 64), (3, 64, 197)),
]


def matmul_cases() -> list[tuple[str, dict[str, tuple[int, ...]]]]:
    cases = []
    for a, b in MATMUL_PAIRS:
        cases.append(("MatMul op 2 1 a b out", {"a": a, "b": b}))
        bt = b if len(b) == 1 else b[:-2] + (b[-1], b[-2])
        cases.append(("MatMul op 2 1 a b out 0=1", {"a": a, "b": bt}))
    return cases


MATMUL_CASES = matmul_cases()


@pytest.mark.parametrize("line, shapes", MATMUL_CASES,
                         ids=[c[0][10:] + str(list(c[1].values())) for c in MATMUL_CASES])
def test_matmul(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]]) -> None:
    check(tmp_path, line, shapes)


@pytest.mark.parametrize(("line", "shapes"), [
    ("MatMul mm 2 1 a b out", {"a": (3, 37, 70), "b": (3, 70, 45)}),
    ("MatMul mm 2 1 a b out 0=1", {"a": (2, 3, 37, 301), "b": (3, 45, 301)}),
])
def test_matmul_runs_compiled_same_bits_on_any_split(tmp_path: Path, line: str,
                                                      shapes: dict[str, tuple[int, ...]]) -> None:
    """MatMul runs as ``jit.linear.matmul`` on the arena (every B packed per run, the batch's
    products as one set of tasks): close to numpy's fp32 matmul, the same bits on any split."""
    inputs = {n: RNG.uniform(-2.0, 2.0, s).astype(np.float32) for n, s in shapes.items()}
    plan = plan_for(tmp_path, [line], inputs)
    assert kinds(plan)["mm"] is StepKind.STORE
    step = next(s for s in plan._program if s.name == "mm")
    want = step.kernel.forward([from_bf16(to_bf16(x)) for x in inputs.values()])[0]
    outs = outputs_on_splits(plan, inputs, "out")
    np.testing.assert_allclose(outs[0], want, rtol=1e-2, atol=1e-3 * float(np.abs(want).max()))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("line, shapes", [
    ("MatMul op 2 1 a b out", {"a": (5, 6), "b": (5, 7)}),
    ("MatMul op 2 1 a b out 0=1", {"a": (5, 6), "b": (6, 7)}),
    ("MatMul op 2 1 a b out", {"a": (2, 5, 6), "b": (3, 6, 7)}),
    ("MatMul op 2 1 a b out", {"a": (6,), "b": (7,)}),
])
def test_matmul_shape_errors(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]]) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(shapes, [line]))
    with pytest.raises((ShapeError, ModelFormatError)):
        load_model(param, None, shapes, seed=7)
