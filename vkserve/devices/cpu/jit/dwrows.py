"""Depthwise convolution (3x3 and 5x5, stride 1 and 2) by runs of 16 outputs of a row held in
registers (AVX-512).

``conv.depthwise`` widens each input channel into a padded fp32 plane, sums every tap over it
and narrows the sums in passes of their own: per channel a handful of loops, each with its
set-up and a scalar remainder, which on small maps cost more than the sums (a 384 x 14 x 14
3x3 layer 0.092 ms on one Zen 4 core against ncnn's 0.023). Here a channel's output rows are
summed 16 columns at a time in registers, read straight from the planar bf16 input: each input
row is loaded once per kernel column (a masked load widened to fp32, at stride 2 32 values and
the even ones kept; lanes left or right of the row, and rows above or below the map, read as
the pad value) and multiplied into the sums of every output row it reaches, ceil(kh / stride)
sums in flight; an output row's 16 sums are stored as soon as its last kernel row is in,
through the epilogue and rounded to bf16 in the register (``bf16dot.vstore_bf16``: none, ReLU
or Clip), or, for other epilogues, into an fp32 row that ``apply_ops`` finishes. Each sum is
the bias, then the taps ky-major, kx ascending, each one multiply-add: ``conv.depthwise``'s
bits.

Needs 512-bit vectors with byte and word masks (AVX-512BW; elsewhere masked 16-bit loads are
scalarized): ``worthwhile`` says so.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from vkserve.devices.cpu.jit.bf16dot import LANES, element_address, f32x16, vsplat, vstore_bf16
from vkserve.devices.cpu.jit.conv import G_KH, G_KW, G_OG, G_OH, G_OW, G_PL, G_PT, G_SH
from vkserve.devices.cpu.jit.epilogue import apply_ops, store_row_inline, stored_op, widen
from vkserve.devices.cpu.jit.generated import compile_source
from vkserve.devices.cpu.jit.vectors import SETTINGS

__all__ = ["KERNELS", "depthwise_rows", "worthwhile"]

#: kernel sizes (kh, kw) compiled, at stride 1 and 2 (the mobile models' depthwise layers)
KERNELS = ((3, 3), (5, 5))

_VF = ir.VectorType(ir.FloatType(), LANES)
_VI = ir.VectorType(ir.IntType(32), LANES)
_I32 = ir.IntType(32)
_MASK = ir.VectorType(ir.IntType(1), LANES)


def worthwhile(kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, ow: int,
               wide: bool = SETTINGS.vector_bits == 512) -> bool:
    """An undilated kernel of ``KERNELS`` at stride 1 or 2, on hosts compiled for 512-bit vectors
    (``wide``: AVX-512, whose word masks these loads and stores use); bf16 storage only (the
    caller checks). Not 5x5 kernels at stride 1 with outputs up to 8 wide, where
    ``jit.dwblocks``' 16 channels a vector did better: one Zen 4 core, ReLU6, ms blocks / rows
    (``benchmarks/depthwise_layers.py``): 1152 x 7 x 7 0.105 / 0.121; but 960 x 7 x 7 3x3
    0.061 / 0.051, 672 x 14 x 14 5x5 0.223 / 0.115, to 7 x 7 at stride 2 0.102 / 0.092."""
    small5 = kh * kw >= 25 and (sh, sw) == (1, 1) and ow <= 8
    return wide and (kh, kw) in KERNELS and sh == sw and sh in (1, 2) and (dh, dw) == (1, 1) and not small5


def _lanes_within(builder, lo, hi, positions):  # noqa: ANN001, ANN202
    """The mask of lanes whose ``positions`` p (a list of ints, one a lane) have lo <= p < hi
    (int64 bounds, any sign)."""
    width, top = len(positions), max(positions) + 1
    vi = ir.VectorType(_I32, width)

    def splat(v):  # noqa: ANN001, ANN202
        clamped = builder.select(builder.icmp_signed("<", v, ir.Constant(v.type, -1)), ir.Constant(v.type, -1), v)
        clamped = builder.select(builder.icmp_signed(">", clamped, ir.Constant(v.type, top)),
                                 ir.Constant(v.type, top), clamped)
        one = builder.insert_element(ir.Constant(vi, ir.Undefined), builder.trunc(clamped, _I32),
                                     ir.Constant(_I32, 0))
        return builder.shuffle_vector(one, ir.Constant(vi, ir.Undefined), ir.Constant(vi, [0] * width))

    at = ir.Constant(vi, list(positions))
    return builder.and_(builder.icmp_signed(">=", at, splat(lo)), builder.icmp_signed("<", at, splat(hi)))


def _load_bf16(context, builder, signature, args, step):  # noqa: ANN001, ANN202
    """``vload_bf16``'s code: ``LANES * step`` values from x[index] (lanes m within lo <= m < hi),
    every ``step``-th kept, widened; the rest ``fill``."""
    width = LANES * step
    vh = ir.VectorType(ir.IntType(16), width)
    p = element_address(context, builder, signature.args[0], args[0], args[1])
    lo_v, hi_v = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (2, 3))
    mask = _lanes_within(builder, lo_v, hi_v, range(width))
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vh, [vh.as_pointer(), _I32, mask.type, vh]),
        f"llvm.masked.load.v{width}i16.p0v{width}i16")
    bits = builder.call(fn, [builder.bitcast(p, vh.as_pointer()), ir.Constant(_I32, 2), mask, ir.Constant(vh, None)])
    if step > 1:  # (the kept lanes' mask computed anew: a shuffle of the wide one is scalarized)
        kept = [step * j for j in range(LANES)]
        bits = builder.shuffle_vector(bits, ir.Constant(vh, ir.Undefined), ir.Constant(_VI, kept))
        mask = _lanes_within(builder, lo_v, hi_v, kept)
    wide = builder.shl(builder.zext(bits, _VI), ir.Constant(_VI, [16] * LANES))
    return builder.select(mask, builder.bitcast(wide, _VF), args[4])


def _typed_load(x, index, lo, hi, fill):  # noqa: ANN001, ANN202
    if not (isinstance(x, types.Array) and x.ndim == 1 and x.dtype == types.uint16 and fill == f32x16
            and all(isinstance(t, types.Integer) for t in (index, lo, hi))):
        return None
    return f32x16(x, index, lo, hi, fill)


@intrinsic
def vload_bf16(typingctx, x, index, lo, hi, fill):  # noqa: ARG001, ANN001, ANN201
    """Lane j: x[index + j] (bf16 storage) widened to fp32 where lo <= j < hi, else ``fill``'s
    lane; nothing is read outside those lanes (a masked load: ``index`` may point before the
    array's start)."""
    return _typed_load(x, index, lo, hi, fill), lambda c, b, sig, args: _load_bf16(c, b, sig, args, 1)


@intrinsic
def vload_bf16_even(typingctx, x, index, lo, hi, fill):  # noqa: ARG001, ANN001, ANN201
    """Lane j: x[index + 2 j] widened where lo <= 2 j < hi, else ``fill``'s lane: ``vload_bf16``
    at stride 2 (32 values read, lanes m < lo or m >= hi not at all; the even ones kept)."""
    return _typed_load(x, index, lo, hi, fill), lambda c, b, sig, args: _load_bf16(c, b, sig, args, 2)


@intrinsic
def vfma(typingctx, a, b, c):  # noqa: ARG001, ANN001, ANN201
    """a b + c per lane, rounded once (what ``FASTMATH``'s contraction makes of the scalar
    kernels' ``c + a * b``)."""
    if not (a == f32x16 and b == f32x16 and c == f32x16):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), "llvm.fma.v16f32")
        return builder.call(fn, list(args))

    return f32x16(a, b, c), codegen


@intrinsic
def vstore_first(typingctx, arr, index, value, count):  # noqa: ARG001, ANN001, ANN201
    """arr[index + j] = lane j of ``value`` for j < count (fp32; a masked store)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.float32 and value == f32x16
            and isinstance(index, types.Integer) and isinstance(count, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        p = element_address(context, builder, signature.args[0], args[0], args[1])
        count = context.cast(builder, args[3], signature.args[3], types.int64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_VF, _VF.as_pointer(), _I32, _MASK]),
            "llvm.masked.store.v16f32.p0v16f32")
        mask = _lanes_within(builder, ir.Constant(count.type, 0), count, range(LANES))
        builder.call(fn, [args[2], builder.bitcast(p, _VF.as_pointer()), ir.Constant(_I32, 4), mask])
        return context.get_dummy_value()

    return types.none(arr, index, value, count), codegen


def _channel_source(kh: int, kw: int, st: int) -> str:
    """One channel of a kh x kw depthwise layer at stride ``st`` (both ways): input rows ``xb`` +
    iy ``w`` of ``x`` (iy < h), pads ``pt``/``pl`` (value ``fill``), weights ``wf`` (fp32,
    ky-major), bias ``bv``; outputs row ``o`` of ``out`` (oh x ow, through ``code``/``lo``/
    ``hi``), or, with ``rows32``, ``acc``'s first oh ow values in fp32.

    Input row t - pt (t < st (oh - 1) + kh) feeds output row (t - ky) / st with weights row ky
    where st divides t - ky; ``sums`` = ceil(kh / st) output rows are in flight, row y's sum
    named ``a{y % sums}``. The loop over t is unrolled st sums times so that every name is
    fixed: at its step s, the sum of row t / st + (s - ky) // st is ``a{((s - ky) // st) % sums}``."""
    taps, sums = kh * kw, -(-kh // st)
    unroll = st * sums
    load = "vload_bf16" if st == 1 else "vload_bf16_even"
    lines = ["def channel(x, xb, h, w, pt, pl, fill, wf, bv, oh, ow, out, o, code, lo, hi, acc, rows32):",
             f"    steps = {st} * (oh - 1) + {kh}",
             "    b = vsplat(bv)"]
    lines += [f"    w{i} = vsplat(wf[{i}])" for i in range(taps)]
    lines += ["    for x0 in range(0, ow, 16):",
              "        n = ow - x0",
              f"        c0 = {st} * x0 - pl"]
    lines += [f"        a{i} = b" for i in range(sums)]
    lines += [f"        for t in range(0, steps, {unroll}):"]
    for s in range(unroll):
        body = [f"iy = t + {s} - pt",
                "if iy >= 0 and iy < h:",
                "    r = xb + iy * w + c0"]
        body += [f"    l{kx} = {load}(x, r + {kx}, -c0 - {kx}, w - c0 - {kx}, fill)" for kx in range(kw)]
        body += ["else:"] + [f"    l{kx} = fill" for kx in range(kw)]
        if s % st == 0:
            body += [f"a{(s // st) % sums} = b"]
        for ky in range(s % st, kh, st):
            a = f"a{((s - ky) // st) % sums}"
            body += [f"{a} = vfma(w{ky * kw + kx}, l{kx}, {a})" for kx in range(kw)]
        if (s - (kh - 1)) % st == 0:
            done = f"a{((s - (kh - 1)) // st) % sums}"
            body += [f"y = t // {st} + {(s - (kh - 1)) // st}",
                     "if y >= 0:",
                     "    if rows32:",
                     f"        vstore_first(acc, y * ow + x0, {done}, n)",
                     "    else:",
                     f"        vstore_bf16(out, o, y * ow + x0, {done}, n, code, lo, hi)"]
        indent = " " * 12
        if s:
            lines += [f"{indent}if t + {s} < steps:"]
            indent += "    "
        lines += [indent + ln for ln in body]
    return "\n".join(lines) + "\n"


def _compile_channel(kh: int, kw: int, st: int):  # noqa: ANN202
    """``_channel_source`` compiled, inlined into ``depthwise_rows`` (``jit.generated``)."""
    ns: dict[str, object] = {"vsplat": vsplat, "vload_bf16": vload_bf16, "vload_bf16_even": vload_bf16_even,
                             "vfma": vfma, "vstore_first": vstore_first, "vstore_bf16": vstore_bf16}
    return compile_source(_channel_source(kh, kw, st), "channel", f"{__name__} {kh}x{kw} stride {st}", ns,
                          inline=True)


_channel3 = _compile_channel(3, 3, 1)
_channel5 = _compile_channel(5, 5, 1)
_channel3s2 = _compile_channel(3, 3, 2)
_channel5s2 = _compile_channel(5, 5, 2)


@njit(parallel=True, error_model="numpy", cache=True)
def depthwise_rows(x, w16, bias, ops, padv, geo, parts, out):  # noqa: ANN001
    """Depthwise convolution (``worthwhile``): ``x`` (C, H, W) bf16 -> ``out`` (C og,
    OH OW) bf16; ``w16`` bf16 (C og, kh kw); the output channels split into ``parts`` tasks."""
    kh, kw, st, og = geo[G_KH], geo[G_KW], geo[G_SH], geo[G_OG]
    oh, ow, pt, pl = geo[G_OH], geo[G_OW], geo[G_PT], geo[G_PL]
    h, w = x.shape[1], x.shape[2]
    flat = x.reshape(x.shape[0] * h * w)
    n_out = out.shape[0]
    stores, code, lo, hi = stored_op(ops)
    for part in prange(parts):
        fill = vsplat(np.float32(padv))
        wf = np.empty(kh * kw, dtype=np.float32)
        acc = np.empty(0 if stores else oh * ow, dtype=np.float32)
        for o in range(part * n_out // parts, (part + 1) * n_out // parts):
            for t in range(kh * kw):
                wf[t] = widen(w16[o, t])
            xb = o // og * h * w
            bv = bias[o]
            if kh == 3 and st == 1:
                _channel3(flat, xb, h, w, pt, pl, fill, wf, bv, oh, ow, out, o, code, lo, hi, acc, not stores)
            elif kh == 3:
                _channel3s2(flat, xb, h, w, pt, pl, fill, wf, bv, oh, ow, out, o, code, lo, hi, acc, not stores)
            elif st == 1:
                _channel5(flat, xb, h, w, pt, pl, fill, wf, bv, oh, ow, out, o, code, lo, hi, acc, not stores)
            else:
                _channel5s2(flat, xb, h, w, pt, pl, fill, wf, bv, oh, ow, out, o, code, lo, hi, acc, not stores)
            if not stores:
                apply_ops(acc, oh * ow, ops)
                store_row_inline(acc, 0, out, o, 0, oh * ow)
