"""Max pooling by runs of 16 outputs of a row in registers (AVX-512), as ``jit.dwrows`` convolves.

``pooling.pool2d`` widens each channel into padded fp32 phase planes and takes the maxima in a
pass over them, then narrows: per channel a plane fill and two loops. Here each output row's 16
maxima come from the window's taps loaded straight from the planar bf16 input (masked loads,
32 values and the even ones kept at stride 2; lanes and rows outside the input read as the pad
value), in ``pool2d``'s order (``_window9``'s and ``_window4``'s trees, each ``max`` numba's:
the second operand only where it is greater, then ``+ 0``), stored rounded to bf16 from the
register: the same bits.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.extending import intrinsic

from vkserve.devices.cpu.jit.bf16dot import f32x16, vsplat, vstore_bf16
from vkserve.devices.cpu.jit.conv import G_KH, G_OH, G_OW, G_PL, G_PT, G_SH
from vkserve.devices.cpu.jit.dwrows import vload_bf16, vload_bf16_even
from vkserve.devices.cpu.jit.epilogue import OP_NONE
from vkserve.devices.cpu.jit.generated import compile_source
from vkserve.devices.cpu.jit.vectors import SETTINGS

__all__ = ["max_pool_rows", "worthwhile"]

#: window sizes compiled (square), each at stride 1 and 2
WINDOWS = (2, 3)


def worthwhile(kh: int, kw: int, sh: int, sw: int, is_max: bool, wide: bool = SETTINGS.vector_bits == 512) -> bool:
    """Max pooling with a 2x2 or 3x3 window at stride 1 or 2, on hosts compiled for 512-bit
    vectors (``jit.dwrows``' loads); bf16 storage only (the caller checks)."""
    return wide and is_max and kh == kw and kh in WINDOWS and sh == sw and sh in (1, 2)


@intrinsic
def vmax(typingctx, a, b):  # noqa: ARG001, ANN001, ANN201
    """Per lane numba's ``max(a, b)``: b where b > a, else a (so a NaN in ``a`` stays)."""
    if not (a == f32x16 and b == f32x16):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.select(builder.fcmp_ordered(">", args[1], args[0]), args[1], args[0])

    return f32x16(a, b), codegen


@intrinsic
def vplus_zero(typingctx, a):  # noqa: ARG001, ANN001, ANN201
    """a + 0 per lane (a -0.0 becomes +0.0, as ``pool2d``'s stores)."""
    if a != f32x16:
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.fadd(args[0], ir.Constant(args[0].type, None))

    return f32x16(a), codegen


def _tree(taps: list[str]) -> str:
    """``pool2d``'s maximum of the taps: pairs of pairs (``_window9``, ``_window4``), the ninth last."""
    if len(taps) == 4:
        return f"vmax(vmax({taps[0]}, {taps[1]}), vmax({taps[2]}, {taps[3]}))"
    return f"vmax(vmax({_tree(taps[:4])}, {_tree(taps[4:8])}), {taps[8]})"


def _channel_source(k: int, st: int) -> str:
    """One channel of k x k max pooling at stride ``st``: input rows ``xb`` + iy ``w`` of
    ``x`` (iy < h), pads ``pt``/``pl`` (value ``fill``); output row ``o`` of ``out`` (oh x ow)."""
    load = "vload_bf16" if st == 1 else "vload_bf16_even"
    lines = ["def channel(x, xb, h, w, pt, pl, fill, oh, ow, out, o):",
             "    for x0 in range(0, ow, 16):",
             f"        c0 = {st} * x0 - pl",
             "        for y in range(oh):"]
    for ky in range(k):
        lines += [f"            iy = {st} * y + {ky} - pt",
                  "            if iy >= 0 and iy < h:",
                  "                r = xb + iy * w + c0"]
        lines += [f"                t{ky * k + kx} = {load}(x, r + {kx}, -c0 - {kx}, w - c0 - {kx}, fill)"
                  for kx in range(k)]
        lines += ["            else:"] + [f"                t{ky * k + kx} = fill" for kx in range(k)]
    lines += [f"            m = vplus_zero({_tree([f't{i}' for i in range(k * k)])})",
              "            vstore_bf16(out, o, y * ow + x0, m, ow - x0, none, zero, zero)"]
    return "\n".join(lines) + "\n"


def _compile_channel(k: int, st: int):  # noqa: ANN202
    """``_channel_source`` compiled, inlined into ``max_pool_rows`` (``jit.generated``)."""
    ns: dict[str, object] = {"vload_bf16": vload_bf16, "vload_bf16_even": vload_bf16_even, "vmax": vmax,
                             "vplus_zero": vplus_zero, "vstore_bf16": vstore_bf16, "none": OP_NONE,
                             "zero": np.float32(0.0)}
    return compile_source(_channel_source(k, st), "channel", f"{__name__} {k}x{k} stride {st}", ns, inline=True)


_max2 = _compile_channel(2, 1)
_max2s2 = _compile_channel(2, 2)
_max3 = _compile_channel(3, 1)
_max3s2 = _compile_channel(3, 2)


@njit(parallel=True, error_model="numpy", cache=True)
def max_pool_rows(x, geo, padv, out, parts):  # noqa: ANN001
    """Max pooling (``worthwhile``): ``x`` (C, H, W) bf16 -> ``out`` (C, OH OW) bf16, ``geo``
    from ``conv.geometry``, pad value ``padv``; the channels in ``parts`` contiguous tasks."""
    k, st, oh, ow, pt, pl = geo[G_KH], geo[G_SH], geo[G_OH], geo[G_OW], geo[G_PT], geo[G_PL]
    h, w = x.shape[1], x.shape[2]
    flat = x.reshape(x.shape[0] * h * w)
    channels = out.shape[0]
    for part in prange(parts):
        fill = vsplat(np.float32(padv))
        for c in range(part * channels // parts, (part + 1) * channels // parts):
            xb = c * h * w
            if k == 3 and st == 1:
                _max3(flat, xb, h, w, pt, pl, fill, oh, ow, out, c)
            elif k == 3:
                _max3s2(flat, xb, h, w, pt, pl, fill, oh, ow, out, c)
            elif st == 1:
                _max2(flat, xb, h, w, pt, pl, fill, oh, ow, out, c)
            else:
                _max2s2(flat, xb, h, w, pt, pl, fill, oh, ow, out, c)
