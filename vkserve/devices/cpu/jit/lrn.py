"""LRN across channels (ncnn's region_type 0) in one pass: widen, the window's sum of squares,
``x * (bias + scale * sum) ** -beta``, the fused activations, narrow.

The power is ``exp(-beta * log(v))`` with Cephes' logf and expf in plain float32 arithmetic
(about 2 ulp), so the loop over a channel's pixels vectorizes; libm's powf is a call per
value and numpy's pass runs on one thread (alexnet's two LRN layers: 11 ms of its 53 ms on one
core of the 2-core box, unchanged on two). Values the polynomial does not cover (v not a
positive normal number: a zero or negative bias) take libm's pow. The window's squares are
added in channel order, so results are the same bits whatever the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.epilogue import (
    FASTMATH,
    _bits_from_f32,
    _f32_from_bits,
    apply_ops,
    exp_f32,
    store_row,
    widen,
)

_SQRTHF = np.float32(0.707106781186547524)
_LOG_P = (np.float32(7.0376836292e-2), np.float32(-1.1514610310e-1), np.float32(1.1676998740e-1),
          np.float32(-1.2420140846e-1), np.float32(1.4249322787e-1), np.float32(-1.6668057665e-1),
          np.float32(2.0000714765e-1), np.float32(-2.4999993993e-1), np.float32(3.3333331174e-1))
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_SMALLEST_NORMAL = np.float32(1.17549435e-38)
_LARGEST = np.float32(3.40282347e38)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def log_f32(v: float) -> float:
    """Natural log of a positive normal float32 (Cephes logf; other inputs: see ``lrn_across``)."""
    bits = _bits_from_f32(v)
    e = np.float32(np.int32(bits >> np.uint32(23)) - np.int32(126))
    m = _f32_from_bits(np.int32((bits & np.uint32(0x007FFFFF)) | np.uint32(0x3F000000)))  # [0.5, 1)
    small = m < _SQRTHF
    e = e - np.float32(1.0) if small else e
    x = (m + m - np.float32(1.0)) if small else (m - np.float32(1.0))
    z = x * x
    p0, p1, p2, p3, p4, p5, p6, p7, p8 = _LOG_P
    y = ((((((((p0 * x + p1) * x + p2) * x + p3) * x + p4) * x + p5) * x + p6) * x + p7) * x + p8) * x * z
    y = y + _LN2_LO * e - np.float32(0.5) * z
    return x + y + _LN2_HI * e


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def lrn_across(x, half, scale, bias, neg_beta, ops, parts, out):  # noqa: ANN001
    """``out[q, :]`` = LRN of ``x`` (C, pixels; bf16 or fp32) over channels q - half .. q + half
    (those that exist); ``scale`` = alpha / local_size; the epilogue ``ops`` after; channels
    split into ``parts`` tasks."""
    c, n = x.shape
    for part in prange(parts):
        total = np.empty(n, dtype=np.float32)
        row = np.empty(n, dtype=np.float32)
        for q in range(part * c // parts, (part + 1) * c // parts):
            for j in range(n):
                total[j] = np.float32(0.0)
            for k in range(max(0, q - half), min(c, q + half + 1)):
                for j in range(n):
                    v = widen(x[k, j])
                    total[j] += v * v
            odd = 0
            for j in range(n):
                v = bias + scale * total[j]
                odd += not (_SMALLEST_NORMAL <= v <= _LARGEST)
                row[j] = widen(x[q, j]) * exp_f32(neg_beta * log_f32(v))
            if odd:
                for j in range(n):
                    v = bias + scale * total[j]
                    if not (_SMALLEST_NORMAL <= v <= _LARGEST):
                        row[j] = widen(x[q, j]) * np.float32(v ** neg_beta)
            apply_ops(row, n, ops)
            store_row(row, 0, out, q, 0, n)
