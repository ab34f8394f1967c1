"""InnerProduct: y[b, o] = bias[o] + sum_k W[o, k] x[b, k] over bf16 weights packed in blocks of
RB output rows, k-major ((blocks, K, RB)): the inner loop runs over RB rows at once (one weight
load and an fma per row for each k), and every output sums k ascending whatever the thread
count. Memory-bound on the weights (two bytes per multiply-add)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.epilogue import FASTMATH, apply_ops, store_row, widen

#: output rows per block (a task): 16 fp32 accumulators, two AVX2 registers
RB = 16


def pack_rows(w16: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """bf16 weights [n_out][n_in] -> (blocks, n_in, RB), rows zero-padded to a whole block."""
    nb = -(-n_out // RB)
    w = np.zeros((nb * RB, n_in), dtype=np.uint16)
    w[:n_out] = w16.reshape(n_out, n_in)
    return np.ascontiguousarray(w.reshape(nb, RB, n_in).transpose(0, 2, 1))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def inner_product(x, wp, bias, ops, out):  # noqa: ANN001
    """``x`` (B, K) -> ``out`` (B, n_out); ``wp`` from ``pack_rows``; ``bias`` fp32."""
    nbatch, n_in = x.shape
    n_out = out.shape[1]
    xf = np.empty((nbatch, n_in), dtype=np.float32)
    for b in range(nbatch):
        for k in range(n_in):
            xf[b, k] = widen(x[b, k])
    for blk in prange(wp.shape[0]):
        o0 = blk * RB
        n = min(RB, n_out - o0)
        w = wp[blk]
        acc = np.empty(RB, dtype=np.float32)
        width = w.shape[1]  # RB, read at run time: a loop of unknown length is vectorized, not unrolled
        for b in range(nbatch):
            for r in range(RB):
                acc[r] = bias[o0 + r] if r < n else np.float32(0.0)
            xb = xf[b]
            for k in range(n_in):
                xk = xb[k]
                wk = w[k]
                for r in range(width):
                    acc[r] += widen(wk[r]) * xk
            apply_ops(acc, n, ops)
            store_row(acc, 0, out, b, o0, n)
