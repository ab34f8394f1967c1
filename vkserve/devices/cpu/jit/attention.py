"""MultiHeadAttention's scaled dot-product attention: per head, softmax(q k^T + mask) v.

Per task (a head and a run of query rows), in one parallel region: the head's keys packed as
NR-key strips and its values as strips of NR columns, then per MR query rows the scores by the
convolutions' fp32 register tiles (``conv.strips_fp32``; the queries' values transposed as its
weights), the mask added, each row's softmax (its maximum and sum in ``LANES`` interleaved
partial results, ``exp_f32`` that vectorizes) written transposed as the weights of the second
product, the weighted values by the same kernel over
the head's values packed likewise, and the result narrowed into the head's columns of the
output. Every output's sums run in a fixed order (head dimension, then keys ascending): the
same bits whatever the thread count. (numpy took three passes and two batched matmuls per
layer: vit_tiny's 197 tokens x 3 heads 0.53 ms a layer on one core of the 2-core VM.)
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.conv import _U, MR, NR, strips_fp32
from vkserve.devices.cpu.jit.epilogue import FASTMATH, exp_f32, store_row
from vkserve.devices.cpu.jit.norm import LANES, lane_sum

#: query rows a task computes at most
TASK_ROWS = 256


def split(heads: int, src: int, threads: int) -> int:
    """Query rows a task (a multiple of MR): TASK_ROWS, halved (down to MR) while the layer
    has fewer than about three tasks a thread. Each task packs its head's keys and values
    (about 1 / rows of its products)."""
    rows = max(MR, min(TASK_ROWS, -(-src // MR) * MR))
    while rows > MR and heads * -(-src // rows) < 3 * threads:
        rows = max(MR, rows // 2 // MR * MR)
    return rows


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _lane_max(t, n):  # noqa: ANN001, ANN202
    """max of t[:n] (n >= 1) in ``LANES`` interleaved partial maxima."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = t[0]
    whole = n - n % LANES
    for b in range(0, whole, LANES):
        m0 = max(m0, t[b])
        m1 = max(m1, t[b + 1])
        m2 = max(m2, t[b + 2])
        m3 = max(m3, t[b + 3])
        m4 = max(m4, t[b + 4])
        m5 = max(m5, t[b + 5])
        m6 = max(m6, t[b + 6])
        m7 = max(m7, t[b + 7])
    for j in range(whole, n):
        m0 = max(m0, t[j])
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _product(a, b, tile, kc, n):  # noqa: ANN001
    """``strips_fp32`` from the tile's row 0, not inlined: ``attend`` makes two products, and
    two inlined copies of it in one function tripped numba's SSA check
    (NumbaIRAssumptionWarning, compiling afresh)."""
    strips_fp32(a, b, tile, kc, 0, n)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def attend(q, q0, k, k0, v, v0, mask, heads, rows_per_task, out):  # noqa: ANN001
    """``out`` (src, e: bf16 storage or fp32) = per head h (columns h hd .. h hd + hd - 1,
    hd = e / heads): softmax over the keys of q_h k_h^T (+ mask[h], or mask[0] when the mask has
    one channel; none when it has none) times v_h; the queries (already scaled) are the e
    columns of ``q`` (src rows, fp32) from ``q0``, the keys and values those of ``k`` and ``v``
    (dst rows) from ``k0`` and ``v0`` (the three may be one array: self-attention's one product;
    whole arrays rather than views, so that one compiled form serves every call); ``mask``
    (mask heads, src, dst) fp32; ``rows_per_task`` from ``split``. Tasks: (head, query rows)."""
    src, e = out.shape
    dst = k.shape[0]
    hd = e // heads
    ks = (dst + NR - 1) // NR
    vs = (hd + NR - 1) // NR
    chunks = (src + rows_per_task - 1) // rows_per_task
    for task in prange(heads * chunks):
        h = task // chunks
        first_row = (task - h * chunks) * rows_per_task
        kp = np.empty((ks, hd, NR), dtype=np.float32)  # key j of strip s at lane j % NR
        vp = np.empty((vs, dst, NR), dtype=np.float32)  # column c of strip s at lane c % NR
        for s in range(ks):
            n = min(NR, dst - s * NR)
            for lane in range(NR):
                if lane < n:
                    krow, first = _U(s * NR + lane), _U(k0 + h * hd)
                    for d in range(_U(hd)):
                        kp[s, d, lane] = k[krow, first + d]
                else:
                    for d in range(hd):
                        kp[s, d, lane] = np.float32(0.0)
        for s in range(vs):
            n = min(NR, hd - s * NR)
            first = _U(v0 + h * hd + s * NR)
            for j in range(_U(dst)):
                for lane in range(_U(n)):
                    vp[s, j, lane] = v[j, first + lane]
                for lane in range(n, NR):
                    vp[s, j, lane] = np.float32(0.0)
        queries = np.empty((hd, MR), dtype=np.float32)
        scores = np.empty((MR, ks * NR), dtype=np.float32)
        probs = np.empty((dst, MR), dtype=np.float32)
        mixed = np.empty((MR, vs * NR), dtype=np.float32)
        mh = h if mask.shape[0] > 1 else 0
        for i0 in range(first_row, min(src, first_row + rows_per_task), MR):
            rows = min(MR, src - i0)
            queries[:] = np.float32(0.0)
            for r in range(rows):
                qrow, first = _U(i0 + r), _U(q0 + h * hd)
                for d in range(_U(hd)):
                    queries[d, r] = q[qrow, first + d]
            scores[:] = np.float32(0.0)
            _product(queries, kp, scores, hd, dst)
            if rows < MR:
                probs[:] = np.float32(0.0)
            for r in range(rows):
                row = scores[r]
                if mask.shape[0]:
                    mrow = _U(i0 + r)
                    for j in range(_U(dst)):
                        row[j] += mask[mh, mrow, j]
                top = _lane_max(row, dst)
                for j in range(_U(dst)):
                    row[j] = exp_f32(row[j] - top)
                inv = np.float32(1.0) / lane_sum(row, dst, False)
                for j in range(_U(dst)):
                    row[j] *= inv
                ru = _U(r)
                for j in range(_U(dst)):
                    probs[j, ru] = row[j]
            mixed[:] = np.float32(0.0)
            _product(probs, vp, mixed, dst, hd)
            for r in range(rows):
                store_row(mixed[r], 0, out, i0 + r, h * hd, hd)
