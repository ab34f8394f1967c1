"""Element-wise kernels: ``binary`` (BinaryOp, two-input Eltwise), ``activation`` (the
activation layers not fused into a producer) and ``affine`` (BatchNorm's per-channel scale and
shift): widen, op, fused activations, narrow, in one pass over each row; and ``softmax``, over
one axis.

The operands are seen as (rows, cols) matrices: ``a`` full, ``b`` full too, or broadcast as
one value per row (a per-channel scale), one row for all rows (along w), or one scalar.
The usual layers (an add or a multiply, no coefficients, at most a ReLU or Clip after) take one
loop a row: widen, op, activation, narrow (``_add_or_mul``). The others, per row: ``a`` widened
into an fp32 row buffer (scaled by ``ca`` where not 1), ``b`` applied to it with the op, the
epilogue run and the row narrowed into ``out``; each loop runs one op over a contiguous row, so
LLVM vectorizes it. Both give the same bits. An output value depends only on its operands: the
same bits whatever the thread count.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.epilogue import (
    FASTMATH,
    OP_CLIP,
    OP_RELU,
    apply_ops,
    as_stored,
    store_row,
    stored_op,
    widen,
)

#: ops (ncnn's BinaryOp op_type codes; Eltwise maps onto the first three)
ADD, SUB, MUL, DIV, MAX, MIN = 0, 1, 2, 3, 4, 5
#: ``b``'s form: (rows, cols), (rows, 1), (1, cols), or one value (``bs``)
B_FULL, B_PER_ROW, B_ROW, B_SCALAR = range(4)
#: these ops with the operands swapped (b op a), for when ``a`` is the broadcast one
SWAPPED = {ADD: ADD, MUL: MUL, MAX: MAX, MIN: MIN}

_U = np.uint64
#: added to in-place maxima and minima so that every value is stored (see ``jit.pooling._tap``)
_ZERO = np.float32(0.0)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _with_scalar(op, t, s, n):  # noqa: ANN001
    """t[:n] = t op s."""
    if op == ADD:
        for j in range(_U(n)):
            t[j] = t[j] + s
    elif op == SUB:
        for j in range(_U(n)):
            t[j] = t[j] - s
    elif op == MUL:
        for j in range(_U(n)):
            t[j] = t[j] * s
    elif op == DIV:
        for j in range(_U(n)):
            t[j] = t[j] / s
    elif op == MAX:
        for j in range(_U(n)):
            t[j] = max(t[j], s) + _ZERO
    else:
        for j in range(_U(n)):
            t[j] = min(t[j], s) + _ZERO


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _with_row(op, t, b, r, n, cb):  # noqa: ANN001
    """t[:n] = t op (cb * widened b[r, :n]); cb only for ADD (Eltwise's coefficients)."""
    ru = _U(r)
    if op == ADD:
        if cb == np.float32(1.0):
            for j in range(_U(n)):
                t[j] = t[j] + widen(b[ru, j])
        else:
            for j in range(_U(n)):
                t[j] = t[j] + cb * widen(b[ru, j])
    elif op == SUB:
        for j in range(_U(n)):
            t[j] = t[j] - widen(b[ru, j])
    elif op == MUL:
        for j in range(_U(n)):
            t[j] = t[j] * widen(b[ru, j])
    elif op == DIV:
        for j in range(_U(n)):
            t[j] = t[j] / widen(b[ru, j])
    elif op == MAX:
        for j in range(_U(n)):
            t[j] = max(t[j], widen(b[ru, j])) + _ZERO
    else:
        for j in range(_U(n)):
            t[j] = min(t[j], widen(b[ru, j])) + _ZERO


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _stored(v, code, lo, hi):  # noqa: ANN001, ANN202
    """``v`` after a lone ReLU or Clip (``code``; OP_NONE: as it is), as ``apply_ops`` gives it."""
    if code == OP_RELU:
        return max(v, _ZERO) + _ZERO
    if code == OP_CLIP:
        return min(max(v, lo), hi)
    return v


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _add_or_mul(op, a, r, b, br, s, cols, code, lo, hi, out):  # noqa: ANN001, ANN202
    """out[r, :] = a[r, :] + or * (b[br, :] where ``br`` >= 0, else ``s``), then a lone ReLU
    or Clip, in one loop (no row buffer, no call a row): 2.5-3.7x faster than the buffered
    passes on 7 x 7 maps' rows, 1.0-1.4x on 56 x 56 (measured on the 2-core VM, one thread,
    (2048, 49) and (256, 3136) adds, (960, 49) per-channel multiplies; same bits)."""
    ru, cu = _U(r), _U(cols)
    if br >= 0:
        bu = _U(br)
        if op == ADD:
            for j in range(cu):
                out[ru, j] = as_stored(_stored(widen(a[ru, j]) + widen(b[bu, j]), code, lo, hi), out)
        else:
            for j in range(cu):
                out[ru, j] = as_stored(_stored(widen(a[ru, j]) * widen(b[bu, j]), code, lo, hi), out)
    elif op == ADD:
        for j in range(cu):
            out[ru, j] = as_stored(_stored(widen(a[ru, j]) + s, code, lo, hi), out)
    else:
        for j in range(cu):
            out[ru, j] = as_stored(_stored(widen(a[ru, j]) * s, code, lo, hi), out)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def binary(a, b, op, bform, bs, ca, cb, ops, parts, out):  # noqa: ANN001
    """out[r, j] = (ca a[r, j]) op b' then the epilogue ``ops``, with b' = cb b[r, j], b[r, 0],
    b[0, j] or ``bs`` by ``bform``; rows split into ``parts`` tasks. ``ca``/``cb`` are 1 except
    for Eltwise's weighted sum."""
    rows, cols = out.shape
    one = np.float32(1.0)
    stores, code, lo, hi = stored_op(ops)
    one_loop = stores and (op == ADD or op == MUL) and ca == one and cb == one
    for part in prange(parts):
        t = np.empty(0 if one_loop else cols, dtype=np.float32)
        for r in range(part * rows // parts, (part + 1) * rows // parts):
            ru = _U(r)
            if one_loop:
                if bform == B_FULL or bform == B_ROW:
                    _add_or_mul(op, a, r, b, r if bform == B_FULL else 0, bs, cols, code, lo, hi, out)
                else:
                    _add_or_mul(op, a, r, b, -1, widen(b[ru, 0]) if bform == B_PER_ROW else bs, cols,
                                code, lo, hi, out)
                continue
            if ca == np.float32(1.0):
                for j in range(_U(cols)):
                    t[j] = widen(a[ru, j])
            else:
                for j in range(_U(cols)):
                    t[j] = ca * widen(a[ru, j])
            if bform == B_FULL:
                _with_row(op, t, b, r, cols, cb)
            elif bform == B_ROW:
                _with_row(op, t, b, 0, cols, cb)
            elif bform == B_PER_ROW:
                _with_scalar(op, t, widen(b[ru, 0]), cols)
            else:
                _with_scalar(op, t, bs, cols)
            apply_ops(t, cols, ops)
            store_row(t, 0, out, r, 0, cols)


def rows_cols(shape: tuple[int, ...], batch: bool = False) -> tuple[int, int]:
    """A whole blob as the kernels' (rows, cols): its outer axis by the rest (one row if 1-D).
    ``batch``: ``shape`` has a leading item axis before the blob's; the items' rows stack."""
    if batch:
        rows, cols = rows_cols(shape[1:])
        return int(shape[0]) * rows, cols
    rows = int(shape[0]) if len(shape) > 1 else 1
    return rows, math.prod(shape) // rows  # (not np.prod: ~10 us a call on a tuple)


def layout(a_shape: tuple[int, ...], b_shape: tuple[int, ...], out_shape: tuple[int, ...]
           ) -> tuple[int, int, int] | None:
    """(rows, cols, b's form) viewing ``a`` (which must have the output's shape) and ``b``
    (lined up to the same rank) as matrices, or None when ``b`` broadcasts in a way this
    kernel does not take (e.g. over a middle axis only)."""
    if tuple(a_shape) != tuple(out_shape):
        return None
    n = len(out_shape)
    total = int(np.prod(out_shape))
    if tuple(b_shape) == tuple(out_shape):
        return (*rows_cols(out_shape), B_FULL)
    if all(d == 1 for d in b_shape):
        return (*rows_cols(out_shape), B_SCALAR)
    for k in range(1, n):
        head, tail = out_shape[:k], out_shape[k:]
        rows = int(np.prod(head))
        if tuple(b_shape) == tuple(head) + (1,) * (n - k):
            return rows, total // rows, B_PER_ROW
        if tuple(b_shape) == (1,) * k + tuple(tail):
            return rows, total // rows, B_ROW
    return None


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def activation(a, ops, parts, out):  # noqa: ANN001
    """out[r, :] = the epilogue ``ops`` applied to widened a[r, :]; rows split into ``parts``
    tasks."""
    rows, cols = out.shape
    for part in prange(parts):
        t = np.empty(cols, dtype=np.float32)
        for r in range(part * rows // parts, (part + 1) * rows // parts):
            ru = _U(r)
            for j in range(_U(cols)):
                t[j] = widen(a[ru, j])
            apply_ops(t, cols, ops)
            store_row(t, 0, out, r, 0, cols)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def affine(a, scale, shift, ops, parts, out):  # noqa: ANN001
    """out[r, :] = the epilogue ``ops`` applied to widened a[r, :] * scale[r] + shift[r] (one
    rounding: a fused multiply-add); rows (channels) split into ``parts`` tasks."""
    rows, cols = out.shape
    for part in prange(parts):
        t = np.empty(cols, dtype=np.float32)
        for r in range(part * rows // parts, (part + 1) * rows // parts):
            ru = _U(r)
            s, b = scale[ru], shift[ru]
            for j in range(_U(cols)):
                t[j] = widen(a[ru, j]) * s + b
            apply_ops(t, cols, ops)
            store_row(t, 0, out, r, 0, cols)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def softmax(a, n, ops, parts, out):  # noqa: ANN001
    """Softmax along the middle axis of ``a`` seen as (outer, ``n``, inner) = (rows / n, n,
    cols): each block of n rows is widened once, then per column its maximum, exp(x - max), their
    sum in row order and the division, the epilogue, and the block's n narrowed rows; blocks
    split into ``parts`` tasks. (numpy took ~0.1 ms for a classifier's 1,000 scores in its six
    passes and their calls.)"""
    rows, cols = out.shape
    blocks = rows // n
    for part in prange(parts):
        t = np.empty(n * cols, dtype=np.float32)
        acc = np.empty(cols, dtype=np.float32)
        for blk in range(part * blocks // parts, (part + 1) * blocks // parts):
            r0 = blk * n
            for k in range(n):
                ru, b = _U(r0 + k), _U(k * cols)
                for j in range(_U(cols)):
                    t[b + j] = widen(a[ru, j])
            for j in range(cols):
                acc[j] = t[j]
            for k in range(1, n):
                b = k * cols
                for j in range(cols):
                    acc[j] = max(acc[j], t[b + j])
            for k in range(n):
                b = k * cols
                for j in range(cols):
                    t[b + j] = np.exp(t[b + j] - acc[j])
            for j in range(cols):
                acc[j] = t[j]
            for k in range(1, n):
                b = k * cols
                for j in range(cols):
                    acc[j] += t[b + j]
            for k in range(n):
                b = k * cols
                for j in range(cols):
                    t[b + j] /= acc[j]
                apply_ops(t[b:b + cols], cols, ops)
                store_row(t, b, out, r0 + k, 0, cols)
