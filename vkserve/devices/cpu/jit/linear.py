"""Linear layers: Y (M, N) = bias + A (M, K) B (K, N) with B a weight (pnnx writes nn.Linear as
such a Gemm; A is M tokens of K features, read from the bf16 arena); and MatMul, whose B is
computed too (``matmul``: each B packed per run, then the same tasks).

It runs on the convolutions' register-tile kernels (``jit.conv``) with the roles swapped: A's
rows (the tokens) are the tile's rows and B's columns its "pixels", so the tile is a block of Y
as Y is stored (each row a run of outputs) and no transpose is needed on either side. B is
packed once at load into NR-column strips, k-major (with ``DOT``: each column's k pairs
adjacent, the layout of the pair-product kernel's B); A is packed by the tasks, each the rows
it computes, a block of MR rows and KC depths at a time (with ``DOT`` as bf16 pairs, else
widened). Tasks are (row chunk, column chunk) pairs on the engine's threads; each sums its tile
over K blocks of KC (k ascending, every output by one task in the same order whatever the
split: the same bits on any thread count), then applies the fused activations and narrows it
into Y.

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
    NR,
    strips_dot,
    strips_fp32,
)
from vkserve.devices.cpu.jit.epilogue import FASTMATH, finish_tile, tile_pass, widen

#: depths B's packing pairs up: 2 for the pair-product kernel (``DOT``), else 1 (the AMX tiles
#: of ``conv.AMX`` are the convolutions' alone: these products widen to fp32 there)
PAIR = 2 if DOT else 1

#: output rows a task computes at most (its A rows stay in L1 a K block at a time)
TASK_ROWS = 64
#: output rows a task computes at least, before a layer with few tasks splits its columns
MIN_TASK_ROWS = 16
#: columns a task computes at least (two strips), and at most: a block of A's rows, packed once
#: per task and K block, serves all of them (its (MR x KC) block and the task's fp32 tile,
#: 64 x 512, stay in L1 and L2)
MIN_COLS, MAX_COLS = 2 * NR, 512


def pack_b(b16: np.ndarray, trans: bool = False) -> np.ndarray:
    """bf16 B (K, N), or B stored transposed (N, K) with ``trans`` (a Linear layer's weight) ->
    strips (``packed_b_shape``): strip s holds columns s NR .. s NR + NR - 1, depth k (with
    ``DOT``, the pair k, k + 1 adjacent) a run; columns and depths past B's zero."""
    k, n = (b16.shape[1], b16.shape[0]) if trans else b16.shape
    bp = np.empty(packed_b_shape(k, n), dtype=np.uint16)
    _pack_b(np.ascontiguousarray(b16), trans, bp)
    return bp


def split(m: int, n: int, threads: int) -> tuple[int, int]:
    """(row blocks a task, columns a task): TASK_ROWS rows and N in as few column chunks of at
    most MAX_COLS as it takes (equal, whole strips), the rows halved (down to MIN_TASK_ROWS),
    then the columns (down to MIN_COLS), while the layer has fewer than about three tasks a
    thread. Which task computes an output does not change its sum."""
    nrb, strips = -(-m // MR), -(-n // NR)
    rb = max(1, min(nrb, TASK_ROWS // MR))
    cols = NR * -(-strips // -(-n // MAX_COLS))

    def tasks() -> int:
        return -(-nrb // rb) * -(-n // cols)

    while tasks() < 3 * threads:
        if rb * MR > MIN_TASK_ROWS:
            rb = max(1, rb // 2)
        elif cols > MIN_COLS:
            cols = NR * max(2, cols // NR // 2)
        else:
            break
    return rb, cols


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _pack_a(a, row0, k0, kcb, ap, wide):  # noqa: ANN001, ANN202
    """A's rows row0 .. row0 + MR - 1, depths k0 .. k0 + kcb - 1 (zeros past A) as the register
    tile's weights: with ``DOT`` bf16 pairs into ``ap`` (pair p, row r at 2 (p MR + r)), else
    widened into ``wide`` (depth, row)."""
    m, k = a.shape
    rows = min(MR, m - row0)
    if DOT:
        kc2 = (kcb + 1) // 2
        ap32 = ap.view(np.uint32)
        if k % 2 == 0:  # each k pair of a row is one 32-bit load
            a32 = a.reshape(a.size).view(np.uint32)
            for r in range(rows):
                src, rc = _U((row0 + r) * (k // 2) + k0 // 2), _U(r)
                for p in range(_U(kc2)):
                    ap32[p * _U(MR) + rc] = a32[src + p]
        else:
            half = np.uint32(16)
            for r in range(rows):
                for p in range(kc2):
                    kk = k0 + 2 * p
                    hi = np.uint32(a[row0 + r, kk + 1]) << half if kk + 1 < k else np.uint32(0)
                    ap32[p * MR + r] = np.uint32(a[row0 + r, kk]) | hi
        for r in range(rows, MR):
            for p in range(kc2):
                ap32[p * MR + r] = np.uint32(0)
    else:
        for r in range(rows):
            src, k0u, rc = _U(row0 + r), _U(k0), _U(r)
            for kk in range(_U(kcb)):
                wide[kk, rc] = widen(a[src, k0u + kk])
        for r in range(rows, MR):
            for kk in range(kcb):
                wide[kk, r] = np.float32(0.0)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _strip_product(ap, bp, bf, s0, k0, kcb, own, wide, tile, r0, n):  # noqa: ANN001, ANN202
    """tile[r0:r0 + MR, :n] += A's row block over the K block k0 .. k0 + kcb (``_pack_a``)
    times B's strips s0 .. (n columns) over that K block: bf16 pairs straight from both
    packings (``DOT``), or both widened, B's block into ``own`` by the caller (``_widen_b``)."""
    if DOT:
        sb = bp.shape[1] * bp.shape[2]
        strips_dot(ap, 0, bf, s0 * sb + (k0 // 2) * bp.shape[2], sb, tile, r0, (n + NR - 1) // NR, (kcb + 1) // 2)
    else:
        strips_fp32(wide, own, tile, kcb, r0, n)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _widen_b(bp, s0, ns, k0, kcb, own):  # noqa: ANN001, ANN202
    """own[s, kk, j] = widened B strip s0 + s, depth k0 + kk (the fp32 kernel's panel)."""
    for s in range(ns):
        for kk in range(kcb):
            su, ku = _U(s0 + s), _U(k0 + kk)
            for j in range(_U(NR)):
                own[s, kk, j] = widen(bp[su, ku, j])


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _task(a, bp, bias, ops, task, rb_per_task, cols, out):  # noqa: ANN001, ANN202
    """Task ``task`` of ``linear`` (its rows and columns of ``out``; numbered as there)."""
    m, k = a.shape
    n_out = out.shape[1]
    bf = bp.reshape(bp.size)
    nrb = (m + MR - 1) // MR
    col_chunks = (n_out + cols - 1) // cols
    rc = task // col_chunks
    c0 = (task - rc * col_chunks) * cols
    n = min(cols, n_out - c0)
    rb0 = rc * rb_per_task
    nb = min(nrb, rb0 + rb_per_task) - rb0
    tile = np.empty((nb * MR, cols), dtype=np.float32)
    for r in range(nb * MR):
        for j in range(cols):
            tile[r, j] = bias[c0 + j] if j < n else np.float32(0.0)
    ap = np.empty(KC * MR if DOT else 0, dtype=np.uint16)
    own = np.empty((0 if DOT else cols // NR, KC, NR), dtype=np.float32)
    wide = np.empty((0 if DOT else KC, MR), dtype=np.float32)
    for k0 in range(0, k, KC):
        kcb = min(KC, k - k0)
        if not DOT:
            _widen_b(bp, c0 // NR, (n + NR - 1) // NR, k0, kcb, own)
        for i in range(nb):
            _pack_a(a, (rb0 + i) * MR, k0, kcb, ap, wide)
            _strip_product(ap, bp, bf, c0 // NR, k0, kcb, own, wide, tile, i * MR, n)
    rows = min(nb * MR, m - rb0 * MR)
    finish_tile(tile, 0, rows, n, out, rb0 * MR, c0, tile_pass(tile, rows, ops))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _task_count(out, rb_per_task, cols):  # noqa: ANN001, ANN202
    """How many tasks ``_task`` numbers over one (M, N) ``out``."""
    m, n_out = out.shape
    return ((m + MR - 1) // MR + rb_per_task - 1) // rb_per_task * ((n_out + cols - 1) // cols)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def linear(a, bp, bias, ops, rb_per_task, cols, out):  # noqa: ANN001
    """``a`` (M, K) bf16 -> ``out`` (M, N) (bf16 storage, or fp32); ``bp`` from ``pack_b``;
    ``bias`` fp32 per column (N); ``ops`` the epilogue; ``rb_per_task`` row blocks and ``cols``
    columns (a multiple of NR) a task, from ``split``. One parallel region: each
    task packs the blocks of A it reads (a pass of its own cost a second wake of the threads,
    ~80 us on the 2-core VM, where packing a block costs about 1 / ``cols`` of its products)."""
    for task in prange(_task_count(out, rb_per_task, cols)):
        _task(a, bp, bias, ops, task, rb_per_task, cols, out)


def packed_b_shape(k: int, n: int) -> tuple[int, int, int]:
    """One B's strips (``pack_b``'s shape) for a K x N product."""
    return -(-n // NR), -(-k // PAIR), NR * PAIR


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _pack_b_strip(b, trans, s, dst):  # noqa: ANN001, ANN202
    """Strip s of B (K, N) bf16, or of B stored transposed (N, K) with ``trans``, in
    ``pack_b``'s layout: dst[p, j PAIR + e] = B[p PAIR + e, s NR + j], zeros past B."""
    k, n = (b.shape[1], b.shape[0]) if trans else (b.shape[0], b.shape[1])
    zero = np.uint16(0)
    for p in range(dst.shape[0]):
        for j in range(NR):
            col = s * NR + j
            for e in range(PAIR):
                kk = p * PAIR + e
                if col < n and kk < k:
                    dst[p, j * PAIR + e] = b[col, kk] if trans else b[kk, col]
                else:
                    dst[p, j * PAIR + e] = zero


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _pack_b(b, trans, bp):  # noqa: ANN001
    """Every strip of one B into ``bp`` (``pack_b``)."""
    for s in range(bp.shape[0]):
        _pack_b_strip(b, trans, s, bp[s])


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def matmul(a, b, trans, a_of, b_of, bp, ops, rb_per_task, cols, out):  # noqa: ANN001
    """Batched ``out[i]`` (M, N) = A[a_of[i]] (M, K) times B[b_of[i]] (K, N; stored (N, K) with
    ``trans``), all bf16 from the arena (``out`` bf16 storage or fp32): MatMul with both
    operands computed by the model. Each B is packed into ``bp`` (``packed_b_shape`` per B)
    in a first parallel pass, then the products run as ``linear``'s tasks over every item."""
    strips = bp.shape[1]
    for item in prange(bp.shape[0] * strips):
        i = item // strips
        s = item - i * strips
        _pack_b_strip(b[i], trans, s, bp[i, s])
    per = _task_count(out[0], rb_per_task, cols)
    bias = np.zeros(out.shape[2], dtype=np.float32)
    for task in prange(out.shape[0] * per):
        i = task // per
        _task(a[a_of[i]], bp[b_of[i]], bias, ops, task - i * per, rb_per_task, cols, out[i])


__all__ = ["linear", "matmul", "pack_b", "packed_b_shape", "split"]
