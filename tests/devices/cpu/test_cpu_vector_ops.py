"""ArgMax, Cast, Normalize, MVN and Embed on the CPU engine against the ncnn package.

ncnn reads some inputs by their bits: Cast from float16 / bfloat16 / int8 reads that element
type, Embed reads int32 token ids. Those cases feed ncnn the packed bits and the engine the
values they stand for. The ncnn package is built without ArgMax: it is checked against
ncnn's definition (a partial sort of (value, index) pairs, std::greater) written out here.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from tests.support.params import param_text
from vkserve.devices.cpu.executor import Plan, PlanError
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.devices.reference import compare, run_ncnn
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model
from vkserve.models.weights import write_bin

SHAPES = [(37,), (6, 11), (4, 5, 7), (3, 2, 5, 6)]


def rand(shape: tuple[int, ...], seed: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def check(tmp_path: Path, line: str, x: np.ndarray) -> None:
    """The engine against ncnn on the same input and seeded weights (bf16 tolerance)."""
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], [line]))
    graph = load_model(param, None, {"x": x.shape}, seed=7)
    report = verify_cpu(graph, param, None, {"x": x})
    details = [(o.name, o.shape, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]
    assert report.ok, details


def run_both(tmp_path: Path, line: str, ours: np.ndarray, theirs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(engine output for input ``ours``, ncnn's for ``theirs``: the same data as ncnn reads it)."""
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text(param_text(["x"], [line]))
    graph = load_model(param, None, {"x": ours.shape}, seed=7)
    write_bin(graph.layers, bin_path)
    ref = run_ncnn(param, bin_path, {"x": theirs}, ["out"])["out"]
    got = Plan(graph, {"x": ours.shape}).run({"x": ours})["out"]
    assert got.shape == graph.blob_shapes["out"]
    return got, ref.reshape(got.shape)


def packed(bits: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 blob of ``shape`` whose channels (or whole data, below 3-D) start with the
    narrow elements ``bits`` of that channel, as ncnn's Cast reads a narrow input."""
    chans = shape[0] if len(shape) >= 3 else 1
    per = bits.reshape(chans, -1)
    out = np.zeros((chans, int(np.prod(shape)) // chans * 4), np.uint8)
    raw = per.view(np.uint8)
    out[:, : raw.shape[1]] = raw
    return out.view(np.float32).reshape(shape)


# ------------------------------------------------------------------------------------ ArgMax


def argmax_reference(x: np.ndarray, topk: int, out_max_val: int) -> np.ndarray:
    pairs = sorted(((float(v), i) for i, v in enumerate(x.ravel())), reverse=True)[:topk]
    vals, idx = [p[0] for p in pairs], [float(p[1]) for p in pairs]
    return np.array([vals, idx] if out_max_val else [idx], np.float32)


@pytest.mark.parametrize("out_max_val", [0, 1])
@pytest.mark.parametrize("shape,topk", [((37,), 1), ((6, 11), 5), ((4, 5, 8), 7),
                                        ((3, 2, 5, 8), 1), ((1000,), 3)], ids=str)
def test_argmax(tmp_path: Path, shape: tuple[int, ...], topk: int, out_max_val: int) -> None:
    """Ties (values on a coarse grid) go to the larger index; indices past 256 stay exact."""
    x = (np.random.default_rng(topk).integers(-20, 20, shape) / 4).astype(np.float32)
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], [f"ArgMax a 1 1 x out 0={out_max_val} 1={topk}"]))
    graph = load_model(param, None, {"x": shape})
    got = Plan(graph, {"x": shape}).run({"x": x})["out"]
    np.testing.assert_array_equal(got, argmax_reference(x, topk, out_max_val))


def test_argmax_topk_past_the_input_is_refused(tmp_path: Path) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], ["ArgMax a 1 1 x out 1=8"]))
    with pytest.raises(ModelFormatError, match="topk 8 exceeds"):
        load_model(param, None, {"x": (7,)})


# -------------------------------------------------------------------------------------- Cast


def test_cast_to_float16_and_back(tmp_path: Path) -> None:
    for i, shape in enumerate(SHAPES):
        x = rand(shape, i, -300.0, 300.0)
        check(tmp_path, "Cast c 1 1 x out 0=1 1=2", x)
        param = tmp_path / "pair.param"
        param.write_text(param_text(["x"], ["Cast c 1 1 x y 0=1 1=2", "Cast d 1 1 y out 0=2 1=1"]))
        graph = load_model(param, None, {"x": shape})
        assert verify_cpu(graph, param, None, {"x": x}).ok


def test_cast_through_bfloat16(tmp_path: Path) -> None:
    x = rand((4, 5, 7), 3, -100.0, 100.0)
    param = tmp_path / "pair.param"
    param.write_text(param_text(["x"], ["Cast c 1 1 x y 0=1 1=4", "Cast d 1 1 y out 0=4 1=1"]))
    graph = load_model(param, None, {"x": x.shape})
    assert verify_cpu(graph, param, None, {"x": x}).ok


@pytest.mark.parametrize("type_from,dtype", [(2, np.float16), (3, np.int8)])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cast_from_narrow_types(tmp_path: Path, type_from: int, dtype: type,
                                shape: tuple[int, ...]) -> None:
    """ncnn reads the input's narrow elements: the engine holds their values."""
    rng = np.random.default_rng(type_from)
    values = rng.integers(-128, 128, shape) if dtype is np.int8 else rng.uniform(-50, 50, shape)
    narrow = values.astype(dtype)
    ours = narrow.astype(np.float32)
    got, ref = run_both(tmp_path, f"Cast c 1 1 x out 0={type_from} 1=1", ours, packed(narrow, shape))
    assert compare("out", got, ref).ok


def test_cast_from_bfloat16_bits(tmp_path: Path) -> None:
    x = rand((6, 11), 5, -50.0, 50.0)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16-exact values: x truncated
    ours = (bits.astype(np.uint32) << 16).view(np.float32)
    got, ref = run_both(tmp_path, "Cast c 1 1 x out 0=4 1=1", ours, packed(bits, x.shape))
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("params", ["0=1 1=3", "0=0 1=1", "0=2 1=4", "0=1 1=7"])
def test_cast_pairs_ncnn_does_not_convert_are_refused(tmp_path: Path, params: str) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], [f"Cast c 1 1 x out {params}"]))
    with pytest.raises(ModelFormatError, match="type_from / type_to"):
        load_model(param, None, {"x": (7,)})


def test_cast_to_the_same_type_passes_through(tmp_path: Path) -> None:
    check(tmp_path, "Cast c 1 1 x out 0=2 1=2", rand((4, 5, 7), 1))


# --------------------------------------------------------------------------------- Normalize

NORMALIZE = [f"0={s} 4={c} 1={sh} 9={m}" for s, c, sh, m in
             itertools.product((0, 1), (0, 1), (0, 1), (0, 1, 2)) if (s or c or m == 0)]


@pytest.mark.parametrize("params", NORMALIZE)
def test_normalize(tmp_path: Path, params: str) -> None:
    for i, shape in enumerate(SHAPES):
        size = 1 if "1=1" in params.split() else (shape[0] if len(shape) >= 3 else 1)
        check(tmp_path, f"Normalize n 1 1 x out {params} 3={size} 2=0.001", rand(shape, i))


@pytest.mark.parametrize("eps_mode", [0, 1, 2])
def test_normalize_eps_dominates(tmp_path: Path, eps_mode: int) -> None:
    """A large eps (per-position sums over 2 channels are small): each mode's formula shows."""
    check(tmp_path, f"Normalize n 1 1 x out 0=0 4=1 1=0 3=2 2=1.5 9={eps_mode}",
          rand((2, 4, 5), 9, -0.8, 0.8))


def test_normalize_needs_a_scale_per_channel(tmp_path: Path) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], ["Normalize n 1 1 x out 0=1 3=2"]))
    with pytest.raises(ModelFormatError, match="scale_data_size 2 < 4"):
        load_model(param, None, {"x": (4, 5, 7)})


# -------------------------------------------------------------------------------------- MVN


@pytest.mark.parametrize("params", ["0=0 1=0", "0=1 1=0", "0=0 1=1", "0=1 1=1 2=0.01"])
def test_mvn(tmp_path: Path, params: str) -> None:
    for i, shape in enumerate(SHAPES):
        check(tmp_path, f"MVN m 1 1 x out {params}", rand(shape, i, -1.0, 3.0))


# ------------------------------------------------------------------------------------- Embed


@pytest.mark.parametrize("bias", [0, 1])
@pytest.mark.parametrize("shape", [(9,), (2, 9)], ids=str)
def test_embed(tmp_path: Path, bias: int, shape: tuple[int, ...]) -> None:
    """Ids in range, negative and past input_dim (clamped as ncnn); a 2-D input's first row."""
    ids = np.random.default_rng(bias).integers(-3, 60, shape).astype(np.int32)
    ids.ravel()[:3] = (0, 49, 257)
    got, ref = run_both(tmp_path, f"Embed e 1 1 x out 0=6 1=50 2={bias} 3=300",
                        ids.astype(np.float32), ids.view(np.float32))
    assert compare("out", got, ref).ok


def test_embed_vocabulary_past_bf16_integers_is_refused(tmp_path: Path) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(["x"], ["Embed e 1 1 x out 0=4 1=300 3=1200"]))
    graph = load_model(param, None, {"x": (5,)})
    with pytest.raises(PlanError, match="input_dim 300"):
        Plan(graph, {"x": (5,)})
