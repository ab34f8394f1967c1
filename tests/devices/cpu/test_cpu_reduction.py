"""Reduction on the CPU engine against the ncnn package: every operation, every axes
combination of 1-D..4-D blobs (and reduce_all, negative axes, no axes), keepdims, coeff.

Inputs keep each operation well conditioned: sums over values of one sign bias (no
cancellation down to nothing), logsum over positive values, prod over bf16-exact values near +-1.
The bf16 engine must meet the verify tolerance (cosine >= 0.999, max abs err <= 2 % of the
reference's max abs).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from vkserve.devices.cpu.verify import verify_cpu
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model
from vkserve.models.layers import ShapeError

SHAPES = [(7,), (5, 9), (6, 5, 7), (3, 4, 5, 6)]
OPS = range(11)


def reduction_input(op: int, shape: tuple[int, ...], seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if op == 6:  # prod: magnitudes near 1, random signs
        mag = rng.uniform(0.85, 1.15, size=shape)
        x = (mag * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32)
        # bf16-exact values: a product of hundreds of terms would otherwise pile up the input
        # rounding of the bf16 engine (each term's, about 2^-9) past the tolerance
        return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    if op == 9:  # logsum: positive sums
        return rng.uniform(0.1, 2.0, size=shape).astype(np.float32)
    return rng.uniform(-1.0, 2.0, size=shape).astype(np.float32)


def axes_cases(dims: int) -> list[str]:
    """Every non-empty axes subset (the first one also with negative numbering), reduce_all."""
    out = ["1=1", "1=0 5=1"]  # all; no axes: element-wise
    for n in range(1, dims + 1):
        for combo in itertools.combinations(range(dims), n):
            out.append(f"1=0 -23303={n}," + ",".join(map(str, combo)) + " 5=1")
    out.append("1=0 -23303=1,-1 5=1")
    return out


def write_param(path: Path, line: str) -> None:
    path.write_text("7767517\n2 2\nInput data 0 1 data\n" + line + "\n")


def check(tmp_path: Path, op: int, shape: tuple[int, ...], params: str) -> None:
    param = tmp_path / "case.param"
    write_param(param, f"Reduction op 1 1 data out 0={op} {params}")
    inputs = {"data": reduction_input(op, shape)}
    graph = load_model(param, None, {"data": shape}, seed=7)
    report = verify_cpu(graph, param, None, inputs)
    details = [(o.name, o.shape, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]
    assert report.ok, details


CASES = [(shape, axes, keep) for shape in SHAPES for axes in axes_cases(len(shape))
         for keep in (0, 1)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, axes, keepdims", CASES, ids=str)
def test_reduction(tmp_path: Path, op: int, shape: tuple[int, ...], axes: str, keepdims: int) -> None:
    check(tmp_path, op, shape, f"{axes} 4={keepdims}")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("coeff", ["2=-0.5", "2=3.0"])
def test_reduction_coeff(tmp_path: Path, op: int, coeff: str) -> None:
    check(tmp_path, op, (4, 5, 6), f"1=0 -23303=2,0,2 5=1 {coeff}")
    check(tmp_path, op, (5, 9), f"1=1 {coeff} 4=1")


def test_reduction_large_run(tmp_path: Path) -> None:
    check(tmp_path, 3, (70, 33, 5), "1=0 -23303=2,0,1 5=1")


@pytest.mark.parametrize("shape, params, want", [
    ((2, 3, 4), "0=0 1=0 -23303=1,1 5=1", (2, 4)),
    ((2, 3, 4), "0=0 1=0 -23303=1,1 5=1 4=1", (2, 1, 4)),
    ((2, 3, 4, 5), "0=0 1=0 -23303=2,1,3 5=1 4=1", (2, 1, 4, 1)),
    ((2, 3, 4), "0=0", (1,)),
    ((2, 3, 4), "0=0 4=1", (1, 1, 1)),
    ((2, 3, 4), "0=0 1=0 -23303=3,0,1,2 5=1", (1,)),
], ids=str)
def test_reduction_shapes(tmp_path: Path, shape, params, want) -> None:
    param = tmp_path / "case.param"
    write_param(param, f"Reduction op 1 1 data out {params}")
    graph = load_model(param, None, {"data": shape}, seed=7)
    assert tuple(graph.blob_shapes["out"]) == want


@pytest.mark.parametrize("params", ["0=11", "0=0 1=0 -23303=1,0"])
def test_reduction_bad_params(tmp_path: Path, params: str) -> None:
    param = tmp_path / "case.param"
    write_param(param, f"Reduction op 1 1 data out {params}")
    with pytest.raises(ModelFormatError):
        load_model(param, None, {"data": (3, 4)}, seed=7)


def test_reduction_axis_out_of_range(tmp_path: Path) -> None:
    param = tmp_path / "case.param"
    write_param(param, "Reduction op 1 1 data out 0=0 1=0 -23303=1,2 5=1")
    with pytest.raises((ShapeError, ModelFormatError)):
        load_model(param, None, {"data": (3, 4)}, seed=7)


# ---------------------------------------------------------------------------------------------
# PixelShuffle, Reorg, GLU


def check_line(tmp_path: Path, line: str, shape: tuple[int, ...]) -> None:
    param = tmp_path / "case.param"
    write_param(param, line)
    inputs = {"data": np.random.default_rng(5).uniform(-2.0, 2.0, size=shape).astype(np.float32)}
    graph = load_model(param, None, {"data": shape}, seed=7)
    report = verify_cpu(graph, param, None, inputs)
    details = [(o.name, o.shape, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]
    assert report.ok, details


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("r, shape", [(1, (3, 4, 5)), (2, (8, 3, 5)), (3, (18, 4, 3)),
                                      (2, (5, 3, 4))], ids=str)  # 5 channels: floored to 1
def test_pixelshuffle(tmp_path: Path, r: int, shape: tuple[int, ...], mode: int) -> None:
    check_line(tmp_path, f"PixelShuffle op 1 1 data out 0={r} 1={mode}", shape)


def test_pixelshuffle_defaults(tmp_path: Path) -> None:
    check_line(tmp_path, "PixelShuffle op 1 1 data out", (4, 3, 5))


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("s, shape", [(1, (3, 4, 5)), (2, (3, 4, 6)), (3, (2, 9, 6)),
                                      (2, (3, 5, 7))], ids=str)  # odd rows / columns dropped
def test_reorg(tmp_path: Path, s: int, shape: tuple[int, ...], mode: int) -> None:
    check_line(tmp_path, f"Reorg op 1 1 data out 0={s} 1={mode}", shape)


def test_reorg_defaults(tmp_path: Path) -> None:
    check_line(tmp_path, "Reorg op 1 1 data out", (3, 4, 5))


@pytest.mark.parametrize("shape, axis", [
    ((8,), 0), ((8,), -1), ((4, 6), 0), ((4, 6), 1), ((4, 6), -2), ((6, 4, 6), 0), ((3, 4, 6), 1),
    ((3, 4, 6), 2), ((3, 4, 6), -1), ((2, 4, 6, 8), 0), ((3, 4, 6, 8), 1), ((3, 5, 6, 8), 2),
    ((3, 5, 6, 8), 3), ((3, 5, 6, 8), -1),
], ids=str)
def test_glu(tmp_path: Path, shape: tuple[int, ...], axis: int) -> None:
    check_line(tmp_path, f"GLU op 1 1 data out 0={axis}", shape)


def test_glu_default_axis(tmp_path: Path) -> None:
    check_line(tmp_path, "GLU op 1 1 data out", (4, 6))


@pytest.mark.parametrize("line, shape", [
    ("PixelShuffle op 1 1 data out 0=2", (8, 5)),  # 3-D only
    ("PixelShuffle op 1 1 data out 0=2", (3, 4, 5)),  # fewer than r^2 channels
    ("Reorg op 1 1 data out 0=2", (3, 1, 4)),  # fewer rows than the stride
    ("Reorg op 1 1 data out 0=2", (2, 3, 4, 5)),
    ("GLU op 1 1 data out 0=1", (4, 5)),  # odd size
    ("GLU op 1 1 data out 0=2", (4, 6)),  # no such axis
], ids=str)
def test_misc_bad_shapes(tmp_path: Path, line: str, shape: tuple[int, ...]) -> None:
    param = tmp_path / "case.param"
    write_param(param, line)
    with pytest.raises((ShapeError, ModelFormatError)):
        load_model(param, None, {"data": shape}, seed=7)


@pytest.mark.parametrize("line", ["PixelShuffle op 1 1 data out 0=0", "PixelShuffle op 1 1 data out 1=2",
                                  "Reorg op 1 1 data out 0=-1", "Reorg op 1 1 data out 1=3"])
def test_misc_bad_params(tmp_path: Path, line: str) -> None:
    param = tmp_path / "case.param"
    write_param(param, line)
    with pytest.raises(ModelFormatError):
        load_model(param, None, {"data": (8, 4, 4)}, seed=7)


# Tile: repeats (numpy.tile, a 3-D input with 4 repeats seen as (c, 1, h, w)), or axis / tiles
TILE_SHAPES = [(5,), (3, 4), (2, 3, 4), (2, 3, 4, 5)]
TILE_PARAMS = ["", "0=0 1=3", "1=2", "-23302=1,2", "-23302=2,2,3", "-23302=3,1,2,3",
               "-23302=4,2,1,1,2", "-23302=4,2,3,1,2", "-23302=4,1,1,2,1", "0=0 1=2 -23302=1,3"]


def tile_cases() -> list[tuple[tuple[int, ...], str]]:
    out = [(s, p) for s in TILE_SHAPES for p in TILE_PARAMS]
    out += [(s, f"0={a} 1=3") for s in TILE_SHAPES for a in range(1, len(s))]
    return out


@pytest.mark.parametrize("shape, params", tile_cases(), ids=str)
def test_tile(tmp_path: Path, shape: tuple[int, ...], params: str) -> None:
    check_line(tmp_path, f"Tile op 1 1 data out {params}", shape)


@pytest.mark.parametrize("shape, params, want", [
    ((2, 3, 4), "-23302=4,2,3,1,2", (4, 3, 3, 8)),
    ((3, 4), "-23302=4,2,1,1,2", (2, 1, 3, 8)),
    ((5,), "-23302=2,2,3", (2, 15)),
    ((2, 3, 4), "0=1 1=2", (2, 6, 4)),
], ids=str)
def test_tile_shapes(tmp_path: Path, shape, params, want) -> None:
    param = tmp_path / "case.param"
    write_param(param, f"Tile op 1 1 data out {params}")
    assert tuple(load_model(param, None, {"data": shape}, seed=7).blob_shapes["out"]) == want


@pytest.mark.parametrize("params, shape", [("0=-1 1=2", (3, 4)), ("0=2 1=2", (3, 4)),
                                           ("1=0", (3, 4)), ("-23302=5,1,1,1,1,2", (3, 4)),
                                           ("-23302=2,0,2", (3, 4))], ids=str)
def test_tile_bad(tmp_path: Path, params: str, shape: tuple[int, ...]) -> None:
    param = tmp_path / "case.param"
    write_param(param, f"Tile op 1 1 data out {params}")
    with pytest.raises((ShapeError, ModelFormatError)):
        load_model(param, None, {"data": shape}, seed=7)
