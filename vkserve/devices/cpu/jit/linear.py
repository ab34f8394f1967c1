"""Linear layers: Y (M, N) = bias + A (M, K) B (K, N) with B a weight (pnnx writes nn.Linear as
such a Gemm; A is M tokens of K features, read from the bf16 arena).

It runs on the convolutions' register-tile kernels (``jit.conv``) with the roles swapped: A's
rows (the tokens) are the tile's rows and B's columns its "pixels", so the tile is a block of Y
as Y is stored (each row a run of outputs) and no transpose is needed on either side. B is
packed once at load into NR-column strips, k-major (with ``DOT``: each column's k pairs
adjacent, the layout of the pair-product kernel's B); A is packed per run, in a first parallel
pass, into MR-row blocks (the weights' layout of ``conv.pack_gemm_weights``). Tasks are (row
chunk, column chunk) pairs on the engine's threads; each sums its tile over K blocks of KC
(k ascending, every output by one task in the same order whatever the split: the same bits on
any thread count), then applies the fused activations and narrows it into Y.

Replaces numpy's fp32 matmul on widened operands, which ran on OpenBLAS's own thread pool (beside
the engine's threads, and on one thread where numpy's was sized so) and left the activation after
a Linear layer (convnext's and vit's GELU) to a pass of its own.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.conv import (
    _U,
    DOT,
    KC,
    MR,
    NB,
    NR,
    PAIR,
    _dot1,
    _dot2,
    _micro,
    _micro_half,
)
from vkserve.devices.cpu.jit.epilogue import FASTMATH, finish_tile, tile_pass, widen

#: output rows a task computes at most (its A rows stay in L1 a K block at a time)
TASK_ROWS = 64
#: output rows a task computes at least, before a layer with few tasks splits its columns
MIN_TASK_ROWS = 16
#: columns a task computes at least (two strips)
MIN_COLS = 2 * NR


def pack_b(b16: np.ndarray) -> np.ndarray:
    """bf16 B (K, N) -> strips (ceil(N / NR), K / PAIR rounded up, NR x PAIR): strip s holds
    columns s NR .. s NR + NR - 1, depth k (with ``DOT``, the pair k, k + 1 adjacent) a run;
    columns and depths past B's zero."""
    k, n = b16.shape
    strips, kp = -(-n // NR), -(-k // PAIR) * PAIR
    w = np.zeros((kp, strips * NR), dtype=np.uint16)
    w[:k, :n] = b16
    w = w.reshape(kp // PAIR, PAIR, strips, NR).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(w).reshape(strips, kp // PAIR, NR * PAIR)


def packed_a_shape(m: int, k: int) -> tuple[int, int, int]:
    """The work space ``linear`` packs A into: (ceil(M / MR), K / PAIR rounded up, MR x PAIR)."""
    return -(-m // MR), -(-k // PAIR), MR * PAIR


def split(m: int, n: int, threads: int) -> tuple[int, int]:
    """(row blocks a task, columns a task): TASK_ROWS rows and NB columns, the rows halved (down
    to MIN_TASK_ROWS), then the columns (down to MIN_COLS), while the layer has fewer than about
    three tasks a thread. Which task computes an output does not change its sum."""
    nrb = -(-m // MR)
    rb, cols = max(1, min(nrb, TASK_ROWS // MR)), NB

    def tasks() -> int:
        return -(-nrb // rb) * -(-n // cols)

    while tasks() < 3 * threads:
        if rb * MR > MIN_TASK_ROWS:
            rb = max(1, rb // 2)
        elif cols > MIN_COLS:
            cols //= 2
        else:
            break
    return rb, cols


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _pack_a_block(a, b, ap):  # noqa: ANN001, ANN202
    """ap[b] (``packed_a_shape``) <- row block b of A (M, K) bf16: depth k (pair p with ``DOT``:
    row r's two values adjacent at 2 r), rows and depths past A's zero."""
    m, k = a.shape
    for p in range(ap.shape[1]):
        for r in range(MR):
            row = b * MR + r
            for e in range(PAIR):
                kk = p * PAIR + e
                ap[b, p, r * PAIR + e] = a[row, kk] if row < m and kk < k else np.uint16(0)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _strip_product(af, a0, bp, bf, s0, k0, kcb, own, wide, tile, r0, n):  # noqa: ANN001, ANN202
    """tile[r0:r0 + MR, :n] += A's row block (packed, at a0 in ``af``, its K block k0 .. k0 +
    kcb) times B's strips s0 .. (n columns) over that K block: bf16 pairs straight from both
    packings (``DOT``), or both widened, B's block into ``own`` by the caller (``_widen_b``)."""
    ns = (n + NR - 1) // NR
    if DOT:
        sb = bp.shape[1] * bp.shape[2]
        tf = tile.reshape(tile.size)
        ldc = tile.shape[1]
        kc2 = (kcb + 1) // 2
        b0 = s0 * sb + (k0 // 2) * bp.shape[2]
        c0 = r0 * ldc
        si = 0
        while si + 1 < ns:
            _dot2(af, a0, bf, b0 + si * sb, sb, tf, c0 + si * NR, ldc, kc2)
            si += 2
        if si < ns:
            _dot1(af, a0, bf, b0 + si * sb, sb, tf, c0 + si * NR, ldc, kc2)
    else:
        wf = wide.reshape(wide.size)
        base = _U(a0)
        for q in range(_U(kcb * MR)):
            wf[q] = widen(af[base + q])
        for si in range(ns):
            if n - si * NR <= NR // 2:
                _micro_half(wide, own, tile, kcb, r0, si)
            else:
                _micro(wide, own, tile, kcb, r0, si)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _widen_b(bp, s0, ns, k0, kcb, own):  # noqa: ANN001, ANN202
    """own[s, kk, j] = widened B strip s0 + s, depth k0 + kk (the fp32 kernel's panel)."""
    for s in range(ns):
        for kk in range(kcb):
            su, ku = _U(s0 + s), _U(k0 + kk)
            for j in range(_U(NR)):
                own[s, kk, j] = widen(bp[su, ku, j])


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def linear(a, bp, bias, ops, ap, rb_per_task, cols, out):  # noqa: ANN001
    """``a`` (M, K) bf16 -> ``out`` (M, N) (bf16 storage, or fp32); ``bp`` from ``pack_b``;
    ``bias`` fp32 per column (N); ``ops`` the epilogue; ``ap`` the work space of
    ``packed_a_shape``; ``rb_per_task`` row blocks and ``cols`` columns (a multiple of NR, at
    most NB) a task, from ``split``."""
    m, k = a.shape
    n_out = out.shape[1]
    for b in prange(ap.shape[0]):
        _pack_a_block(a, b, ap)
    af = ap.reshape(ap.size)
    bf = bp.reshape(bp.size)
    astride = ap.shape[1] * ap.shape[2]  # a row block's packed values
    nrb = ap.shape[0]
    row_chunks = (nrb + rb_per_task - 1) // rb_per_task
    col_chunks = (n_out + cols - 1) // cols
    for task in prange(row_chunks * col_chunks):
        rc = task // col_chunks
        c0 = (task - rc * col_chunks) * cols
        n = min(cols, n_out - c0)
        rb0 = rc * rb_per_task
        nb = min(nrb, rb0 + rb_per_task) - rb0
        tile = np.empty((nb * MR, NB), dtype=np.float32)
        for r in range(nb * MR):
            for j in range(NB):
                tile[r, j] = bias[c0 + j] if j < n else np.float32(0.0)
        own = np.empty((0 if DOT else NB // NR, KC, NR), dtype=np.float32)
        wide = np.empty((0 if DOT else KC, MR), dtype=np.float32)
        for k0 in range(0, k, KC):
            kcb = min(KC, k - k0)
            if not DOT:
                _widen_b(bp, c0 // NR, (n + NR - 1) // NR, k0, kcb, own)
            for i in range(nb):
                _strip_product(af, (rb0 + i) * astride + k0 * MR, bp, bf, c0 // NR, k0, kcb, own, wide, tile,
                               i * MR, n)
        rows = min(nb * MR, m - rb0 * MR)
        finish_tile(tile, 0, rows, n, out, rb0 * MR, c0, tile_pass(tile, rows, ops))


__all__ = ["linear", "pack_b", "packed_a_shape", "split"]
