"""LayerNorm and RMSNorm over each row of the last dimensions, in one pass per row: widen, the
mean (LayerNorm) and the mean of squares, scale by 1 / sqrt(... + eps), gamma and beta, the
fused activations, narrow.

The sums run in ``LANES`` interleaved partial sums added pairwise at the end, so that they do
not wait on one chain of additions and every row's result is the same bits whatever the thread
count (numpy's version made five passes over the whole blob, its reductions on one thread:
convnext_tiny's LayerNorms 7-8 ms on one core of the 2-core VM).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.epilogue import FASTMATH, apply_ops, store_row, widen

#: partial sums of a row's reductions: eight independent chains, in scalars (partial sums kept
#: in an array were loaded and stored on every step: numba's arrays may alias the row)
LANES = 8


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _term(v, squares):  # noqa: ANN001, ANN202
    return v * v if squares else v


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def lane_sum(t, n, squares):  # noqa: ANN001, ANN202
    """sum of t[:n] (of their squares with ``squares``) in ``LANES`` interleaved partial sums,
    added pairwise at the end."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
    whole = n - n % LANES
    for b in range(0, whole, LANES):
        s0 += _term(t[b], squares)
        s1 += _term(t[b + 1], squares)
        s2 += _term(t[b + 2], squares)
        s3 += _term(t[b + 3], squares)
        s4 += _term(t[b + 4], squares)
        s5 += _term(t[b + 5], squares)
        s6 += _term(t[b + 6], squares)
        s7 += _term(t[b + 7], squares)
    for j in range(whole, n):
        s0 += _term(t[j], squares)
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def last_dims(a, gamma, beta, eps, centered, ops, parts, out):  # noqa: ANN001
    """``out[r, :]`` = (a[r, :] - mean) / sqrt(var + eps) (``centered``; else a[r, :] /
    sqrt(mean of squares + eps)), times ``gamma``, plus ``beta`` (each empty: none), the epilogue
    ``ops`` after; rows split into ``parts`` tasks."""
    rows, n = out.shape
    inv_n = np.float32(1.0) / np.float32(n)
    for part in prange(parts):
        t = np.empty(n, dtype=np.float32)
        for r in range(part * rows // parts, (part + 1) * rows // parts):
            for j in range(n):
                t[j] = widen(a[r, j])
            if centered:
                mean = lane_sum(t, n, False) * inv_n
                for j in range(n):
                    t[j] -= mean
            scale = np.float32(1.0) / np.sqrt(lane_sum(t, n, True) * inv_n + eps)
            for j in range(n):
                t[j] *= scale
            if gamma.size:
                for j in range(n):
                    t[j] *= gamma[j]
            if beta.size:
                for j in range(n):
                    t[j] += beta[j]
            apply_ops(t, n, ops)
            store_row(t, 0, out, r, 0, n)
