"""gemm.comp's tiles at their edges, against the ncnn package: M, N and K of 1, 3, 63, 64, 65 and
197 (partial tiles, a single row / column, K below and past one step), every transA / transB
form (the staging orders of both operands), C's broadcasts with alpha / beta and
output_transpose, constant operands, MatMul batches that broadcast, and every tile shape forced
on shapes that leave partial tiles everywhere. fp32 and the fp16 modes (float sums)."""

from __future__ import annotations

import pytest

from tests.support.vulkan_engine import MODES, check_against_ncnn, engine_device
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.engine.tuning import tunable
from vkserve.devices.vulkan.layers import matmul
from vkserve.devices.vulkan.layers.base import MAX_GROUPS

__all__ = ["engine_device"]  # the fixture, imported for pytest

# (M, N, K): each of 1, 3, 63, 64, 65, 197 at least once on each axis
EDGES = [(1, 197, 65), (3, 64, 197), (63, 65, 1), (64, 1, 63), (65, 3, 64), (197, 63, 3)]


def _gemm(m: int, n: int, k: int, ta: int, tb: int, extra: str = "") -> tuple[str, dict]:
    a = (k, m) if ta else (m, k)
    b = (n, k) if tb else (k, n)
    return f"Gemm op 2 1 a b out 2={ta} 3={tb}{extra}", {"a": a, "b": b}


CASES = [_gemm(m, n, k, ta, tb) for m, n, k in EDGES for ta in (0, 1) for tb in (0, 1)] + [
    # C: full (M, N), per row, per column, scalar; alpha / beta; output_transpose
    ("Gemm op 3 1 a b c out 0=0.5 1=2.0 14=1", {"a": (65, 63), "b": (63, 197), "c": (65, 197)}),
    ("Gemm op 3 1 a b c out 2=1 0=1.5", {"a": (64, 3), "b": (64, 65), "c": (3,)}),
    ("Gemm op 3 1 a b c out 3=1 1=0.25", {"a": (63, 197), "b": (65, 197), "c": (65,)}),
    ("Gemm op 3 1 a b c out 2=1 3=1 14=1", {"a": (197, 1), "b": (64, 197), "c": (1,)}),
    # constant operands: the pnnx Linear form (B (N, K) with a per-column bias), constant A
    ("Gemm op 1 1 a out 10=4 2=0 3=1 4=0 5=1 6=1 7=49 8=65 9=197", {"a": (49, 197)}),
    ("Gemm op 1 1 b out 4=1 2=1 7=63 9=64", {"b": (64, 3)}),
    # MatMul: broadcast batch axes, transB, 1-D operands
    ("MatMul op 2 1 a b out", {"a": (2, 3, 65, 63), "b": (3, 63, 197)}),
    ("MatMul op 2 1 a b out 0=1", {"a": (3, 1, 64), "b": (2, 1, 63, 64)}),
    ("MatMul op 2 1 a b out 0=1", {"a": (2, 1, 197, 3), "b": (1, 3, 65, 3)}),
    ("MatMul op 2 1 a b out", {"a": (65,), "b": (3, 65, 63)}),
    ("MatMul op 2 1 a b out", {"a": (3, 197, 64), "b": (64,)}),
]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("line, shapes", CASES,
                         ids=[c[0].split(" out")[0][:3] + c[0].split(" out")[1] + str(list(c[1].values()))
                              for c in CASES])
def test_gemm_edges(tmp_path, engine_device, line, shapes, precision):
    check_against_ncnn(tmp_path, engine_device, line, shapes, precision)


# both staging orders of both operands, partial tiles on every axis, C and batches
FORCED = [
    ("Gemm op 3 1 a b c out 2=1 0=0.5 1=2.0", {"a": (197, 65), "b": (197, 63), "c": (65, 63)}),
    ("MatMul op 2 1 a b out 0=1", {"a": (2, 63, 197), "b": (2, 65, 197)}),
]


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_ARITHMETIC], ids=lambda p: p.value)
@pytest.mark.parametrize("tile", matmul.MatmulTile.candidates(),
                         ids=lambda t: f"{t.bm}x{t.bn}x{t.ks}k{t.bk}")
@pytest.mark.parametrize("case", range(len(FORCED)), ids=["gemm-transA-C", "matmul-transB"])
def test_gemm_forced_tiles(tmp_path, engine_device, monkeypatch, case, tile, precision):
    monkeypatch.setattr(matmul, "choose_gemm_tile", lambda *shape: tile)
    line, shapes = FORCED[case]
    check_against_ncnn(tmp_path, engine_device, line, shapes, precision)


def test_gemm_tiles_and_choice():
    """Every candidate meets the shader's constraints; small M splits K over slices; the tiled
    dispatch keeps its own work-group size (the tuner must not change it)."""
    tiles = matmul.MatmulTile.candidates()
    assert len(tiles) == 9 and all(t.valid() for t in tiles)
    small = matmul.choose_gemm_tile(49, 768, 3072, 1)
    assert small.ks > 1 and small.bm <= 32
    assert matmul.choose_gemm_tile(64 * MAX_GROUPS + 1, 64 * MAX_GROUPS + 1, 4, 1) is None
    (d,) = matmul.gemm_dispatches(("a", "b", "c", "out"), 49, 768, 3072, (3072, 1), (1, 3072), (0, 1),
                                  (768, 1))
    assert d.local_size == (256, 1, 1) and not tunable(d)
    assert d.global_size[0] % 256 == 0 and d.spec_constants[1:5] == (small.bm, small.bn, small.ks, small.bk)
