"""MultiHeadAttention on the CPU engine (bf16 storage) against the ncnn package: 1, 2 and 3
inputs (q; q + kv; q, k, v), with and without a shared or per-head mask, kdim / vdim /
qdim apart from embed_dim, several head counts, sequence lengths that are no multiple of 4,
the scale param, 1-D inputs, a causal mask of -inf / -1e9 (as exports write it); and the
forms refused with a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_jit_elementwise import kinds, plan_for
from tests.support.cpu_engine import check_against_ncnn, outputs_on_splits
from tests.support.params import param_text
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.executor import StepKind
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model

# (params, input shapes in input order); blobs q, k, v, m are named by role
CASES = [
    ("0=8 1=1 2=64", {"q": (5, 8)}),
    ("0=12 1=3 2=72 3=6 4=6", {"q": (7, 6)}),
    ("0=16 1=4 2=96 3=10 4=10", {"q": (9, 6), "k": (13, 10)}),
    ("0=16 1=2 2=160 3=6 4=12", {"q": (3, 10), "k": (11, 6), "v": (11, 12)}),
    ("0=24 1=6 2=576 6=0.3", {"q": (65, 24)}),
    ("0=8 1=2 2=64 5=1", {"q": (6, 8), "m": (6, 6)}),
    ("0=12 1=3 2=144 5=1", {"q": (5, 12), "k": (9, 12), "m": (3, 5, 9)}),
    ("0=16 1=4 2=128 3=6 4=10 5=1 6=-0.25", {"q": (7, 8), "k": (10, 6), "v": (10, 10), "m": (7, 10)}),
    ("0=8 1=2 2=40 3=6 4=6", {"q": (5,), "k": (3, 6)}),
]


def line_for(params: str, shapes: dict[str, tuple[int, ...]]) -> str:
    names = list(shapes)
    return f"MultiHeadAttention attn {len(names)} 1 {' '.join(names)} out {params}"


@pytest.mark.parametrize("params, shapes", CASES, ids=[c[0] for c in CASES])
def test_attention(tmp_path: Path, params: str, shapes: dict[str, tuple[int, ...]]) -> None:
    check_against_ncnn(tmp_path, line_for(params, shapes), shapes, np.random.default_rng(3))


def test_vit_block_size(tmp_path: Path) -> None:
    """vit_tiny's attention: 197 tokens of 192, 3 heads."""
    shapes = {"q": (197, 192)}
    check_against_ncnn(tmp_path, line_for("0=192 1=3 2=36864 3=192 4=192", shapes), shapes,
                       np.random.default_rng(5))


# a causal self-attention: 9 tokens, -inf (or -1e9) above the diagonal
CAUSAL_LINE = "MultiHeadAttention attn 2 1 q m out 0=16 1=4 2=256 5=1"
CAUSAL_SHAPES = {"q": (9, 16), "m": (9, 9)}


def causal_inputs(fill: float) -> dict[str, np.ndarray]:
    mask = np.triu(np.full((9, 9), fill, np.float32), 1)
    return {"q": np.random.default_rng(4).uniform(-2.0, 2.0, (9, 16)).astype(np.float32),
            "m": mask}


@pytest.mark.parametrize("fill", [-np.inf, -1e9])
def test_causal_mask(tmp_path: Path, fill: float) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(CAUSAL_SHAPES, [CAUSAL_LINE]))
    graph = load_model(param, None, CAUSAL_SHAPES, seed=7)
    report = verify_cpu(graph, param, None, causal_inputs(fill))
    assert report.ok, [(o.name, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]


@pytest.mark.parametrize("params, shapes, message", [
    ("0=8 1=3 2=64", {"q": (5, 8)}, "param 1 (num_heads)"),
    ("0=8 1=2 2=60", {"q": (5, 8)}, "param 2 (weight_data_size)"),
    ("0=8 1=2 2=64 7=1", {"q": (5, 8)}, "param 7 (kv_cache)"),
    ("0=8 1=2 2=64 18=1", {"q": (5, 8)}, "param 18 (quantize_term)"),
    ("0=8 1=2 2=64", {"q": (5, 6)}, "expected (seq, 8)"),
    ("0=8 1=2 2=64", {"q": (1, 5, 8)}, "expected (seq, 8)"),
    ("0=8 1=2 2=64", {"q": (5, 8), "k": (4, 8), "v": (3, 8)}, "differ in length"),
    ("0=8 1=2 2=64 5=1", {"q": (5, 8), "m": (1, 5)}, "attn_mask (1, 5)"),
    ("0=8 1=2 2=64 5=1", {"q": (5, 8), "k": (4, 8), "v": (4, 8), "m": (5, 4), "x": (5, 4)},
     "input"),
])
def test_refused(tmp_path: Path, params: str, shapes: dict[str, tuple[int, ...]], message: str) -> None:
    param = tmp_path / "case.param"
    names = " ".join(shapes)
    param.write_text("7767517\n" + f"{len(shapes) + 1} {len(shapes) + 1}\n"
                     + "".join(f"Input {n} 0 1 {n}\n" for n in shapes)
                     + f"MultiHeadAttention attn {len(shapes)} 1 {names} out {params}\n")
    with pytest.raises(ModelFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(param, None, shapes)


def test_projections_run_compiled_on_the_arena_same_bits_on_any_split(tmp_path: Path) -> None:
    """On the Plan's path the projections are ``jit.linear`` products over the bf16 arena (self-
    attention and q + kv inputs): close to the numpy forward, the same bits on any split."""
    rng = np.random.default_rng(6)
    for params, shapes in (("0=48 1=3 2=2304", {"q": (37, 48)}), ("0=16 1=4 2=96 3=10 4=10", {"q": (9, 6), "k": (13, 10)})):
        inputs = {n: rng.uniform(-2.0, 2.0, s).astype(np.float32) for n, s in shapes.items()}
        plan = plan_for(tmp_path, [line_for(params, shapes)], inputs)
        assert kinds(plan)["attn"] is StepKind.RAW_INPUTS
        step = next(s for s in plan._program if s.name == "attn")
        want = step.kernel.forward([from_bf16(to_bf16(x)) for x in inputs.values()])[0]
        outs = outputs_on_splits(plan, inputs, "out")
        np.testing.assert_allclose(outs[0], want, rtol=0.02, atol=0.02 * float(np.abs(want).max()))
        assert all(np.array_equal(outs[0], o) for o in outs[1:])
