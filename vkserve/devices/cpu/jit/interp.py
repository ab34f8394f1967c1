"""Bilinear and bicubic Interp in one threaded pass: each output row is the weighted sum of
``ky`` source rows, each of those resized along w first (ncnn's order) from the bf16 input.

Tasks are contiguous runs of output rows (channel by channel); a run resizes along w only the
source rows its output rows read, once each, into a buffer of its own, then sums them along h,
applies the fused activations and narrows. numpy's version made ``kx + ky`` full-size
temporaries on one thread (deeplabv3_mbv3's last upsampling, 21 x 16 x 16 -> 21 x 256 x 256:
about a tenth of the model on the CPU engine). Each output is computed by one task in a fixed
order, so results are the same bits whatever the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.epilogue import FASTMATH, apply_ops, store_row, widen


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def resize(x, tx, wx, ty, wy, ops, parts, out):  # noqa: ANN001
    """``out[c * oh + oy, ox]`` = sum over k of ``wy[oy, k]`` * (sum over j of ``wx[ox, j]`` *
    ``x[c, ty[oy, k], tx[ox, j]]``), the epilogue ``ops`` after; ``x`` (C, H, W) bf16 or fp32,
    ``out`` (C * OH, OW); the rows split into ``parts`` tasks."""
    c, h, w = x.shape
    oh, ow = ty.shape[0], tx.shape[0]
    kx, ky = tx.shape[1], ty.shape[1]
    rows = c * oh
    for part in prange(parts):
        r0, r1 = part * rows // parts, (part + 1) * rows // parts
        acc = np.empty(ow, dtype=np.float32)
        r = r0
        while r < r1:
            ch = r // oh
            end = min(r1, (ch + 1) * oh)  # this channel's rows of the run
            lo, hi = h, -1
            for oy in range(r - ch * oh, end - ch * oh):
                for k in range(ky):
                    lo = min(lo, ty[oy, k])
                    hi = max(hi, ty[oy, k])
            lines = np.empty((hi - lo + 1, ow), dtype=np.float32)
            for sy in range(lo, hi + 1):
                for ox in range(ow):
                    v = np.float32(0.0)
                    for j in range(kx):
                        v += wx[ox, j] * widen(x[ch, sy, tx[ox, j]])
                    lines[sy - lo, ox] = v
            for oy in range(r - ch * oh, end - ch * oh):
                for ox in range(ow):
                    acc[ox] = np.float32(0.0)
                for k in range(ky):
                    weight, line = wy[oy, k], ty[oy, k] - lo
                    for ox in range(ow):
                        acc[ox] += weight * lines[line, ox]
                apply_ops(acc, ow, ops)
                store_row(acc, 0, out, ch * oh + oy, 0, ow)
            r = end
