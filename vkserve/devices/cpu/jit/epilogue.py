"""Scalar bf16 helpers for the numba kernels and the fused activation epilogue.

``widen``/``store_row`` dispatch on the array's dtype at compile time: uint16 is bf16 storage
(widened exactly, narrowed with round-to-nearest-even like ``vkserve.devices.cpu.bf16``), float32
is taken as it is (the fp32 ``Kernel.forward`` path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from vkserve.models.layers import activation_values

if TYPE_CHECKING:
    from vkserve.devices.cpu.kernels.base import Kernel

#: fused multiply-add contraction only: no reassociation, so every sum keeps its written order.
#: (The kernels also take error_model="numpy": no ZeroDivisionError check, a branch that keeps
#: a loop with a division from vectorizing; x / 0 gives inf or nan as in numpy.)
FASTMATH = {"contract"}

_U16 = np.uint32(16)
_LSB = np.uint32(1)
_HALF = np.uint32(0x7FFF)
_QUIET = np.uint32(0x40)


@intrinsic
def _f32_from_bf16(typingctx, bits):  # noqa: ARG001
    """bf16 bits -> float32 (the high half; exact)."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):  # noqa: ARG001
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def _f32_from_bits(typingctx, bits):  # noqa: ARG001
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):  # noqa: ARG001
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def _bits_from_f32(typingctx, value):  # noqa: ARG001
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):  # noqa: ARG001
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


def widen(v):  # noqa: ANN001, ANN201  (numba overload below)
    """One stored value as float32."""
    raise NotImplementedError


@overload(widen, inline="always")
def _widen(v):  # noqa: ANN001, ANN202
    if v == types.uint16:
        return lambda v: _f32_from_bf16(v)
    if v == types.float32:
        return lambda v: v
    return None


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def narrow(f: float) -> int:
    """float32 -> bf16 bits, round to nearest even; NaN stays NaN (quiet, sign kept)."""
    b = _bits_from_f32(f)
    if f != f:
        return np.uint16((b >> _U16) | _QUIET)
    return np.uint16((b + _HALF + ((b >> _U16) & _LSB)) >> _U16)


def store_row(src, s0, dst, row, col, n):  # noqa: ANN001, ANN201
    """dst[row, col:col + n] = src[s0:s0 + n] (fp32), narrowed when ``dst`` is bf16 storage."""
    raise NotImplementedError


def store_row_inline(src, s0, dst, row, col, n):  # noqa: ANN001, ANN201
    """``store_row`` inlined where it is called: the depthwise and pooling kernels store each
    output row apart, and on small maps (7x7 to 28x28) the calls cost ~15 % of a depthwise layer
    (measured, one core: 1.18x inlined; 3x3 stride-2 max pooling 1.08-1.25x). (Not ``store_row`` itself: numba warns where an inlined overload is
    called from another overload.)"""
    raise NotImplementedError


@overload(store_row)
@overload(store_row_inline, inline="always")
def _store_row(src, s0, dst, row, col, n):  # noqa: ANN001, ANN202
    if dst.dtype == types.uint16:
        def impl(src, s0, dst, row, col, n):  # noqa: ANN001, ANN202
            # unsigned indices: no wrap-around selects for negative ones, so the loop vectorizes
            s, r, c = np.uint64(s0), np.uint64(row), np.uint64(col)
            for i in range(np.uint64(n)):
                dst[r, c + i] = narrow(src[s + i])
        return impl

    def impl32(src, s0, dst, row, col, n):  # noqa: ANN001, ANN202
        s, r, c = np.uint64(s0), np.uint64(row), np.uint64(col)
        for i in range(np.uint64(n)):
            dst[r, c + i] = src[s + i]
    return impl32


_EXP_HI = np.float32(88.3762626647949)
_EXP_LO = np.float32(-88.3762626647949)
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_P = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3),
          np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def exp_f32(x: float) -> float:
    """e**x in fp32 (Cephes expf, as ncnn's SIMD exp_ps: about 1 ulp, the argument clamped to
    +-88.376), in plain arithmetic so that loops over it vectorize (libm's expf is a call)."""
    x = min(max(x, _EXP_LO), _EXP_HI)
    fx = np.floor(x * _LOG2E + np.float32(0.5))
    x = x - fx * _LN2_HI
    x = x - fx * _LN2_LO
    p0, p1, p2, p3, p4, p5 = _EXP_P
    y = ((((p0 * x + p1) * x + p2) * x + p3) * x + p4) * x + p5
    y = y * (x * x) + x + np.float32(1.0)
    return y * _f32_from_bits(np.int32((np.int32(fx) + np.int32(127)) << np.int32(23)))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def scaled_bits(v, s, act):  # noqa: ANN001, ANN201
    """bf16 bits of ``v`` (fp32, or bf16 bits) times ``s``, then the activation ``act`` (code,
    a, b: OP_NONE, OP_RELU, OP_CLIP or OP_HARDSWISH, ``scale_act``): a per-channel BinaryOp
    Mul's stored product (with the activation fused into it) as the convolution reading it
    computes it (``Kernel.channel_scale``); the activation as ``apply_ops`` applies it, so the
    bits are the BinaryOp's."""
    code, a, b = act
    zero = np.float32(0.0)
    p = widen(v) * s
    if code == OP_RELU:
        p = max(p, zero) + zero
    elif code == OP_CLIP:
        p = min(max(p, a), b)
    elif code == OP_HARDSWISH:
        p = p * min(max(p * a + b, zero), np.float32(1.0))
    return bf16_bits(p)


# epilogue op codes: ncnn's activation_type 0..6, then the fusable activation layers' own forms
# and the other activation layers run as one pass (GELU, its tanh form)
(OP_NONE, OP_RELU, OP_LEAKY, OP_CLIP, OP_SIGMOID, OP_MISH, OP_HARDSWISH, OP_SWISH, OP_HARDSIGMOID,
 OP_GELU, OP_GELU_TANH) = range(11)

# erfc(z) = t * poly(t) * exp(-z * z) for z >= 0, t = 1 / (1 + P z) (Abramowitz & Stegun 7.1.26,
# about 1.5e-7 absolute)
_ERF_P = np.float32(0.3275911)
_ERF_A = (np.float32(1.061405429), np.float32(-1.453152027), np.float32(1.421413741),
          np.float32(-0.284496736), np.float32(0.254829592))
_SQRT_HALF = np.float32(0.70710678)
_GELU_TANH_A = np.float32(2.0 * 0.79788452)  # 2 sqrt(2 / pi): x * sigmoid(2u) = 0.5 x (1 + tanh u)
_GELU_TANH_B = np.float32(2.0 * 0.79788452 * 0.044715)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def gelu_f32(x: float) -> float:
    """0.5 x (1 + erf(x / sqrt 2)) in fp32 arithmetic that vectorizes (``exp_f32``), with
    1 + erf(z) taken as erfc(-z) so that large negative x lose nothing to cancellation."""
    z = x * _SQRT_HALF
    t = np.float32(1.0) / (np.float32(1.0) + _ERF_P * abs(z))
    a4, a3, a2, a1, a0 = _ERF_A
    q = t * ((((a4 * t + a3) * t + a2) * t + a1) * t + a0) * exp_f32(-z * z)
    return np.float32(0.5) * x * (q if z < np.float32(0.0) else np.float32(2.0) - q)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def apply_ops(row: np.ndarray, n: int, ops: np.ndarray) -> None:
    """Apply the epilogue ``ops`` ((code, a, b) rows, in order) to ``row[:n]`` in place."""
    one = np.float32(1.0)
    zero = np.float32(0.0)
    for i in range(ops.shape[0]):
        code = int(ops[i, 0])
        a = ops[i, 1]
        b = ops[i, 2]
        # "+ zero" on the ReLU-like ops: with it every value is stored; without, LLVM stores
        # only the changed ones, a masked vector store that AMD cores run ~8x slower (measured
        # on the 2-core EPYC VM: 0.78-0.86 ns a value against 0.10). It only turns -0.0 into
        # +0.0, as x86's max(x, 0) does in ncnn.
        if code == OP_RELU:
            for j in range(n):
                row[j] = max(row[j], zero) + zero
        elif code == OP_LEAKY:
            for j in range(n):
                v = row[j]
                row[j] = (v * a if v < zero else v) + zero
        elif code == OP_CLIP:
            for j in range(n):
                row[j] = min(max(row[j], a), b)
        elif code == OP_SIGMOID:
            for j in range(n):
                row[j] = one / (one + exp_f32(-row[j]))
        elif code == OP_MISH:
            for j in range(n):
                v = row[j]
                sp = max(v, zero) + np.log1p(np.exp(-abs(v)))
                row[j] = v * np.tanh(sp)
        elif code == OP_HARDSWISH:
            for j in range(n):
                v = row[j]
                row[j] = v * min(max(v * a + b, zero), one)
        elif code == OP_SWISH:
            for j in range(n):
                v = row[j]
                row[j] = v / (one + exp_f32(-v))
        elif code == OP_HARDSIGMOID:
            for j in range(n):
                row[j] = min(max(row[j] * a + b, zero), one)
        elif code == OP_GELU:
            for j in range(n):
                row[j] = gelu_f32(row[j])
        elif code == OP_GELU_TANH:
            for j in range(n):
                v = row[j]
                row[j] = v / (one + exp_f32(-(_GELU_TANH_A * v + _GELU_TANH_B * v * v * v)))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def stored_op(ops):  # noqa: ANN001, ANN201
    """What a kernel storing its results applies itself of the epilogue ``ops``: (whether it
    can, ``ops`` being none or a lone ReLU or Clip (the usual epilogues); that op's code,
    OP_NONE for none; Clip's low and high bounds, 0 for the others)."""
    zero = np.float32(0.0)
    code = int(ops[0, 0]) if ops.shape[0] == 1 else OP_NONE
    lo = ops[0, 1] if code == OP_CLIP else zero
    hi = ops[0, 2] if code == OP_CLIP else zero
    return ops.shape[0] == 0 or code == OP_RELU or code == OP_CLIP, code, lo, hi


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def tile_pass(tile, rows, ops):  # noqa: ANN001, ANN201
    """The epilogue ``ops`` that ``finish_tile`` cannot apply while storing (any chain but a
    lone ReLU or Clip), applied in place to the first ``rows`` rows of ``tile``, whole (the
    values past the columns stored too: the callers keep them finite), in one pass; returns the
    ops left for ``finish_tile``: ``ops`` itself, or none. One pass per tile: a tile stored in
    pieces (``jit.direct``: a block's output rows) took one per piece and row before, and its
    hardswish / sigmoid first layers ran 1.20-1.28x slower (measured on the 2-core VM, same
    bits)."""
    if stored_op(ops)[0]:
        return ops
    apply_ops(tile.reshape(tile.size), rows * tile.shape[1], ops)
    return ops[:0]


def finish_tile(tile, s0, rows, n, dst, row0, col, ops):  # noqa: ANN001, ANN201  (numba overload below)
    """dst[row0 + r, col + q] = tile[r, s0 + q] for r < rows, q < n, as ``dst`` stores it, with
    ``ops`` what ``tile_pass`` left of the epilogue: none, or a lone ReLU or Clip (other ops are
    not applied here; no check either: a raise inside a kernel's prange body makes numba run
    that loop on one thread).

    A lone ReLU or Clip (the usual epilogues) goes in the storing pass itself: a separate pass
    writing the fp32 values back cost more than the narrowing store (measured on the 2-core VM:
    0.65 ns a value in place, against 0.21 for the store and 0.24 for ReLU and store
    together). Inlined where it is called, one loop per row with no view: a call per row (its
    view's reference count update, the call) made conv_gemm's 1x1 layers of few input channels
    1.1-1.45x slower (measured on the 2-core VM, old and new kernel alternating in one process,
    same bits: 16 -> 96 channels at 112 x 112, 0.71 -> 0.51 ms)."""
    raise NotImplementedError


@overload(finish_tile, inline="always")
def _finish_tile(tile, s0, rows, n, dst, row0, col, ops):  # noqa: ANN001, ANN202
    def impl(tile, s0, rows, n, dst, row0, col, ops):  # noqa: ANN001, ANN202
        zero = np.float32(0.0)
        _, code, lo, hi = stored_op(ops)
        su, cu, nu = np.uint64(s0), np.uint64(col), np.uint64(n)
        for r in range(rows):
            ru, du = np.uint64(r), np.uint64(row0 + r)
            if code == OP_RELU:
                for q in range(nu):
                    dst[du, cu + q] = as_stored(max(tile[ru, su + q], zero) + zero, dst)  # as apply_ops
            elif code == OP_CLIP:
                for q in range(nu):
                    dst[du, cu + q] = as_stored(min(max(tile[ru, su + q], lo), hi), dst)
            else:
                for q in range(nu):
                    dst[du, cu + q] = as_stored(tile[ru, su + q], dst)
    return impl


def as_stored(v, dst):  # noqa: ANN001, ANN201  (numba overload below)
    """``v`` (fp32, or bf16 bits) as array ``dst`` stores it: bf16 bits for uint16 storage
    (fp32 rounded to nearest even), fp32 otherwise (bf16 widened)."""
    raise NotImplementedError


@overload(as_stored)
def _as_stored(v, dst):  # noqa: ANN001, ANN202
    if dst.dtype == types.uint16:
        return lambda v, dst: bf16_bits(v)
    return lambda v, dst: widen(v)


def bf16_bits(v):  # noqa: ANN001, ANN201  (numba overload below)
    """``v`` (fp32, or bf16 bits) as bf16 bits (fp32 rounded to nearest even)."""
    raise NotImplementedError


@overload(bf16_bits)
def _bf16_bits(v):  # noqa: ANN001, ANN202
    if v == types.uint16:
        return lambda v: v
    return lambda v: narrow(v)


def _post_op(k: Kernel) -> tuple[int, float, float]:
    """A fused activation layer (the executor's FUSABLE_ACTIVATIONS) as an epilogue op."""
    p, kind = k.p, k.layer.type
    if kind == "ReLU":
        return (OP_RELU, 0.0, 0.0) if p.slope == 0.0 else (OP_LEAKY, p.slope, 0.0)
    if kind == "Clip":
        return OP_CLIP, p.min, p.max
    if kind == "Sigmoid":
        return OP_SIGMOID, 0.0, 0.0
    if kind == "Swish":
        return OP_SWISH, 0.0, 0.0
    if kind == "HardSigmoid":
        return OP_HARDSIGMOID, p.alpha, p.beta
    if kind == "HardSwish":
        return OP_HARDSWISH, p.alpha, p.beta
    if kind == "GELU":
        return (OP_GELU_TANH if p.fast_gelu else OP_GELU), 0.0, 0.0
    raise ValueError(f"{kind} cannot be fused into a numba kernel's epilogue")


#: no activation after a channel scale (``scaled_bits``)
NO_SCALE_ACT = (OP_NONE, np.float32(0.0), np.float32(0.0))


def scale_act(post: Sequence[Kernel]) -> tuple[int, np.float32, np.float32] | None:
    """The activation layers fused into a per-channel multiply as ``scaled_bits`` applies them
    (code, a, b; float32 as ``apply_ops`` reads them): none, or one ReLU, Clip (ReLU6) or
    HardSwish (mobilenet_v3's); None for any other."""
    if not post:
        return NO_SCALE_ACT
    if len(post) != 1:
        return None
    code, a, b = _post_op(post[0])
    if code not in (OP_RELU, OP_CLIP, OP_HARDSWISH):
        return None
    return code, np.float32(a), np.float32(b)


def epilogue_ops(act_type: int, act_params: Sequence[float], post: Sequence[Kernel] = ()) -> np.ndarray:
    """(n, 3) float32 rows (code, a, b): the layer's own activation, then the fused layers'."""
    rows = []
    if act_type:
        a, b = activation_values(act_type, tuple(act_params))
        rows.append((act_type, a, b))
    rows.extend(_post_op(k) for k in post)
    return np.array(rows, dtype=np.float32).reshape(-1, 3)
