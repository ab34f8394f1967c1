"""MultiHeadAttention's scaled dot-product attention: per head, softmax(q k^T + mask) v.

Per task (a head and MR query rows) in one pass: the scores by the convolutions' fp32
register-tile kernel (``conv._micro``; the queries' values transposed as its weights, the
head's keys as NR-key strips packed once per run), the mask added, each row's softmax (its
maximum and sum in ``LANES`` interleaved partial results, ``exp_f32`` that vectorizes) written
transposed as the weights of the second product, the weighted values by the same kernel over
the head's values packed likewise, and the result narrowed into the head's columns of the
output. Every output's sums run in a fixed order (head dimension, then keys ascending): the
same bits whatever the thread count. (numpy took three passes and two batched matmuls per
layer: vit_tiny's 197 tokens x 3 heads 0.53 ms a layer on one core of the 2-core VM.)
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.conv import _U, MR, NR, _micro
from vkserve.devices.cpu.jit.epilogue import FASTMATH, exp_f32, store_row
from vkserve.devices.cpu.jit.norm import LANES, lane_sum


def panel_shapes(heads: int, dst: int, e: int) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """``attend``'s work spaces (fp32): each head's keys in NR-key strips (heads, strips, head
    dim, NR: key j of strip s at lane j % NR), its values in strips of NR columns (heads,
    strips, dst, NR)."""
    hd = e // heads
    return (heads, -(-dst // NR), hd, NR), (heads, -(-hd // NR), dst, NR)


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


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def attend(q, q0, k, k0, v, v0, mask, kp, vp, out):  # noqa: ANN001
    """``out`` (src, e: bf16 storage or fp32) = per head h (columns h hd .. h hd + hd - 1,
    hd = e / heads): softmax over the keys of q_h k_h^T (+ mask[h], or mask[0] when the mask has
    one channel; none when it has none) times v_h; the queries (already scaled) are the e
    columns of ``q`` (src rows, fp32) from ``q0``, the keys and values those of ``k`` and ``v``
    (dst rows) from ``k0`` and ``v0`` (the three may be one array: self-attention's one product;
    whole arrays rather than views, so that one compiled form serves every call); ``mask``
    (mask heads, src, dst) fp32; ``kp``, ``vp`` the work spaces of ``panel_shapes``."""
    src = q.shape[0]
    dst = k.shape[0]
    heads, ks, hd = kp.shape[0], kp.shape[1], kp.shape[2]
    vs = vp.shape[1]
    for item in prange(heads * ks):
        h = item // ks
        s = item - h * ks
        n = min(NR, dst - s * NR)
        for lane in range(NR):
            if lane < n:
                krow, first = _U(s * NR + lane), _U(k0 + h * hd)
                for d in range(_U(hd)):
                    kp[h, s, d, lane] = k[krow, first + d]
            else:
                for d in range(hd):
                    kp[h, s, d, lane] = np.float32(0.0)
    for item in prange(heads * vs):
        h = item // vs
        s = item - h * vs
        n = min(NR, hd - s * NR)
        for j in range(_U(dst)):
            first = _U(v0 + h * hd + s * NR)
            for lane in range(_U(n)):
                vp[h, s, j, lane] = v[j, first + lane]
            for lane in range(n, NR):
                vp[h, s, j, lane] = np.float32(0.0)
    blocks = (src + MR - 1) // MR
    for task in prange(heads * blocks):
        h = task // blocks
        i0 = (task - h * blocks) * MR
        rows = min(MR, src - i0)
        queries = np.zeros((hd, MR), dtype=np.float32)
        for r in range(rows):
            qrow, first = _U(i0 + r), _U(q0 + h * hd)
            for d in range(_U(hd)):
                queries[d, r] = q[qrow, first + d]
        scores = np.zeros((MR, ks * NR), dtype=np.float32)
        for s in range(ks):
            _micro(queries, kp[h], scores, hd, 0, s)
        probs = np.zeros((dst, MR), dtype=np.float32)
        mh = h if mask.shape[0] > 1 else 0
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
        mixed = np.zeros((MR, vs * NR), dtype=np.float32)
        for s in range(vs):
            _micro(probs, vp[h], mixed, dst, 0, s)
        for r in range(rows):
            store_row(mixed[r], 0, out, i0 + r, h * hd, hd)
