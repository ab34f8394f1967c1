"""Pooling over bf16 (or fp32) planes: windowed max / average (``pool2d``, the channels in
contiguous tasks, each with its scratch planes made once) and global average (``global_avg``).

``pool2d`` works like ``conv.depthwise``: each channel is widened once into padded fp32 planes, one per stride
phase (border = ``padv``: the lowest finite bf16 for max, 0 for average), whose rows run on into each other,
so each tap is one unit-stride pass over all outputs (3x3 and 2x2 windows: all their taps in
one pass). Per output: the taps ky-major, kx ascending (max, or a sum), then for an average
the division by ``divisor[oy, ox]`` (padding excluded) or the multiplication by ``scale``
(padding counted), as the numpy path computes it, then the narrowing store: the same bits as
that path whatever the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.conv import (
    _U,
    G_KH,
    G_KW,
    G_OH,
    G_OW,
    G_PL,
    G_PT,
    G_SH,
    G_SW,
    SMALL_PHASE_MAX_COLS,
    fill_phases,
    fill_phases_small,
)
from vkserve.devices.cpu.jit.epilogue import FASTMATH, store_row, store_row_inline, widen


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _tap(acc, p, b, cnt, first, is_max):  # noqa: ANN001
    """acc[q] = p[b + q] (the first tap), else max(acc[q], p[b + q]) or acc[q] + p[b + q]."""
    i0 = _U(b)
    if first:
        for q in range(_U(cnt)):
            acc[q] = p[i0 + q]
    elif is_max:
        # "+ 0": every value stored. Without it LLVM stores only the changed ones, a masked
        # vector store that AMD cores run several times slower (this EPYC VM: 3x3 stride-2
        # max pooling 1.4-2.6x faster with it); it only turns a -0.0 maximum into +0.0
        zero = np.float32(0.0)
        for q in range(_U(cnt)):
            acc[q] = max(acc[q], p[i0 + q]) + zero
    else:
        for q in range(_U(cnt)):
            acc[q] += p[i0 + q]


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _window9(acc, p, offs, cnt, is_max):  # noqa: ANN001
    """The 9 taps of a 3x3 window in one pass over the outputs (each written once, where a pass
    per tap reads and writes them 9 times): acc[q] = the maximum, or the sum in tap order (no
    reassociation: FASTMATH), of p[offs[t] + q], for q < cnt; the same values as ``_tap`` tap
    by tap (a maximum does not depend on the order)."""
    i0, i1, i2, i3, i4 = _U(offs[0]), _U(offs[1]), _U(offs[2]), _U(offs[3]), _U(offs[4])
    i5, i6, i7, i8 = _U(offs[5]), _U(offs[6]), _U(offs[7]), _U(offs[8])
    if is_max:
        zero = np.float32(0.0)  # as in _tap: every value stored
        for q in range(_U(cnt)):
            a = max(max(p[i0 + q], p[i1 + q]), max(p[i2 + q], p[i3 + q]))
            b = max(max(p[i4 + q], p[i5 + q]), max(p[i6 + q], p[i7 + q]))
            acc[q] = max(max(a, b), p[i8 + q]) + zero
    else:
        for q in range(_U(cnt)):
            acc[q] = (p[i0 + q] + p[i1 + q] + p[i2 + q] + p[i3 + q] + p[i4 + q] + p[i5 + q] + p[i6 + q]
                      + p[i7 + q] + p[i8 + q])


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _window4(acc, p, offs, cnt, is_max):  # noqa: ANN001
    """``_window9`` for the 4 taps of a 2x2 window."""
    i0, i1, i2, i3 = _U(offs[0]), _U(offs[1]), _U(offs[2]), _U(offs[3])
    if is_max:
        zero = np.float32(0.0)
        for q in range(_U(cnt)):
            acc[q] = max(max(p[i0 + q], p[i1 + q]), max(p[i2 + q], p[i3 + q])) + zero
    else:
        for q in range(_U(cnt)):
            acc[q] = p[i0 + q] + p[i1 + q] + p[i2 + q] + p[i3 + q]


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def pool2d(x, geo, is_max, padv, divisor, scale, out, parts):  # noqa: ANN001
    """``x`` (C, H, W) -> ``out`` (C, OH * OW); ``geo`` from ``conv.geometry`` (groups = C, 1,
    1, dilation 1); an average divides by ``divisor`` (OH, OW) when it is not empty, else
    multiplies by ``scale``. The channels run in ``parts`` contiguous tasks (a channel's two
    scratch allocations cost as much as pooling a 14 x 14 map's)."""
    kh, kw, sh, sw = geo[G_KH], geo[G_KW], geo[G_SH], geo[G_SW]
    pt, pl, oh, ow = geo[G_PT], geo[G_PL], geo[G_OH], geo[G_OW]
    prow = oh + (kh - 1) // sh
    wq = ow + (kw - 1) // sw
    plen = prow * wq
    span = (oh - 1) * wq + ow
    divide = divisor.size > 0
    channels = out.shape[0]
    small = (sh > 1 or sw > 1) and x.shape[2] <= SMALL_PHASE_MAX_COLS
    # each tap's first value in the phase planes
    offs = np.empty(kh * kw, dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            offs[ky * kw + kx] = (ky % sh) * sw * plen + ky // sh * wq + kx % sw * plen + kx // sw
    for part in prange(parts):
        planes = np.empty((sh * sw, prow, wq), dtype=np.float32)
        pf = planes.reshape(sh * sw * plen)
        acc = np.empty(span, dtype=np.float32)
        img = np.empty((prow * sh, wq * sw) if small else (0, 0), dtype=np.float32)
        for c in range(part * channels // parts, (part + 1) * channels // parts):
            if small:
                fill_phases_small(x, c, pt, pl, sh, sw, padv, planes, img)
            else:
                fill_phases(x, c, pt, pl, sh, sw, padv, planes)
            if kh * kw == 9:
                _window9(acc, pf, offs, span, is_max)
            elif kh * kw == 4:
                _window4(acc, pf, offs, span, is_max)
            else:
                for t in range(kh * kw):
                    _tap(acc, pf, offs[t], span, t == 0, is_max)
            if not is_max:
                for oy in range(oh):
                    base = oy * wq
                    if divide:
                        for ox in range(ow):
                            acc[base + ox] /= divisor[oy, ox]
                    else:
                        for ox in range(ow):
                            acc[base + ox] *= scale
            for oy in range(oh):
                store_row_inline(acc, oy * wq, out, c, oy * ow, ow)



@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _row_sum(x, c, n):  # noqa: ANN001, ANN202
    """Sum of x[c, :n]: element i into partial sum i % 8 in order (eight scalars that LLVM keeps
    in one vector register), then (0+4, 1+5, 2+6, 3+7), (0+2, 1+3), 0+1, then the tail."""
    cu = _U(c)
    z = np.float32(0.0)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = z
    body = _U(n - n % 8)
    for b in range(_U(0), body, _U(8)):
        s0 += widen(x[cu, b])
        s1 += widen(x[cu, b + _U(1)])
        s2 += widen(x[cu, b + _U(2)])
        s3 += widen(x[cu, b + _U(3)])
        s4 += widen(x[cu, b + _U(4)])
        s5 += widen(x[cu, b + _U(5)])
        s6 += widen(x[cu, b + _U(6)])
        s7 += widen(x[cu, b + _U(7)])
    s0, s1, s2, s3 = s0 + s4, s1 + s5, s2 + s6, s3 + s7
    s0, s1 = s0 + s2, s1 + s3
    v = s0 + s1
    for i in range(body, _U(n)):
        v += widen(x[cu, i])
    return v


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def global_avg(x, parts, out):  # noqa: ANN001
    """``x`` (C, N) bf16 or fp32 -> ``out`` (1, C): the mean of each row (``_row_sum`` / N),
    the channels split into ``parts`` contiguous tasks; a fixed order whatever the threads."""
    c_total, n = x.shape
    res = np.empty(c_total, dtype=np.float32)
    for part in prange(parts):
        for c in range(part * c_total // parts, (part + 1) * c_total // parts):
            res[c] = _row_sum(x, c, n) / np.float32(n)
    store_row(res, 0, out, 0, 0, c_total)
