"""Intel AMX tiles (``TDPBF16PS``): the GEMM convolution's product on CPUs that have them.

An AMX core holds eight tile registers of up to 16 rows x 64 bytes; ``TDPBF16PS`` adds to a
16 x 16 fp32 tile C the product of a 16 x 32 bf16 tile A (16 rows of 32 depths) and a tile B of
16 rows, row p holding depths 2p and 2p + 1 of 16 pixels side by side (bf16 pairs: the layout
of ``jit.conv``'s bf16 input panels, one 32-deep step of a strip being 1 KiB in a run). That is
16 x 16 x 32 multiply-adds an instruction: measured on this project's 2-core Sapphire Rapids
VM, one core, tiles in L1, 1.5 TFLOP/s, against 68-83 GFLOP/s for the fp32 FMA kernel.

numba knows nothing of tiles, so this module gives it LLVM's AMX intrinsics with fixed tile
registers (the register number is an immediate): one intrinsic per (operation, register). The
kernel (``block``) works on up to 2 x 2 C tiles (32 rows x 32 pixels: tmm0-3), two A tiles
(tmm4-5) and two B tiles (tmm6-7), so each 32-deep step loads 4 KiB for 4 products.

Every tile is configured 16 rows x 64 bytes (``CONFIG``): shapes that do not fill them are
padded with zeros by the callers (weights: rows to 16, depths to 32; input panels: depths to
32, pixels to 16). Like ``vdpbf16ps`` the instruction reads bf16 denormals as zero and writes
fp32 denormals as zero; each C lane's sum over a step runs in the order the CPU fixes.

Linux hands the tile registers to a process only on request (``arch_prctl``
ARCH_REQ_XCOMP_PERM); ``jit.vectors`` asks before it chooses this path, and without the
permission the instruction would kill the process (SIGILL).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from vkserve.devices.cpu.jit.bf16dot import element_address

__all__ = ["CONFIG", "block", "configure", "release"]

_I8 = ir.IntType(8)
_I64 = ir.IntType(64)
_PTR = _I8.as_pointer()
_VOID = ir.VoidType()


def _tile_config() -> np.ndarray:
    """The 64-byte tile configuration (palette 1): every tile 16 rows x 64 bytes."""
    cfg = np.zeros(64, dtype=np.uint8)
    cfg[0] = 1
    cfg[16:32].view(np.uint16)[:8] = 64
    cfg[48:56] = 16
    return cfg


#: ``configure``'s argument
CONFIG = _tile_config()


def _call(builder: ir.IRBuilder, name: str, argtys: list[ir.Type], args: list[ir.Value]) -> None:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VOID, argtys), name)
    builder.call(fn, args)


def _byte_address(context, builder, arr_type, arr, index):  # noqa: ANN001, ANN202
    return builder.bitcast(element_address(context, builder, arr_type, arr, index), _PTR)


def _is_1d(arr: types.Type) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 1


@intrinsic
def configure(typingctx, cfg):  # noqa: ARG001, ANN001, ANN201
    """Load the tile configuration (``CONFIG``) into this thread's tile registers."""
    if not (_is_1d(cfg) and cfg.dtype == types.uint8):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        _call(builder, "llvm.x86.ldtilecfg", [_PTR],
              [_byte_address(context, builder, signature.args[0], args[0], ir.Constant(_I64, 0))])
        return context.get_dummy_value()

    return types.none(cfg), codegen


@intrinsic
def release(typingctx):  # noqa: ARG001, ANN001, ANN201
    """Return the thread's tile registers to their initial state (the OS then need not save them)."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
        _call(builder, "llvm.x86.tilerelease", [], [])
        return context.get_dummy_value()

    return types.none(), codegen


def _memory_op(name: str, tile: int):  # noqa: ANN202
    """``tile`` <- / -> the 16 rows at arr[index], ``stride`` bytes apart (llvm.x86.``name``)."""
    @intrinsic
    def op(typingctx, arr, index, stride):  # noqa: ARG001, ANN001, ANN202
        if not (_is_1d(arr) and isinstance(index, types.Integer) and isinstance(stride, types.Integer)):
            return None

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            address = _byte_address(context, builder, signature.args[0], args[0], args[1])
            stride = context.cast(builder, args[2], signature.args[2], types.int64)
            _call(builder, f"llvm.x86.{name}", [_I8, _PTR, _I64], [ir.Constant(_I8, tile), address, stride])
            return context.get_dummy_value()

        return types.none(arr, index, stride), codegen
    return op


def _product(c: int, a: int, b: int):  # noqa: ANN202
    """tmm``c`` += tmm``a`` x tmm``b`` (bf16 pairs, fp32 sums)."""
    @intrinsic
    def op(typingctx):  # noqa: ARG001, ANN001, ANN202
        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202, ARG001
            _call(builder, "llvm.x86.tdpbf16ps", [_I8, _I8, _I8], [ir.Constant(_I8, r) for r in (c, a, b)])
            return context.get_dummy_value()

        return types.none(), codegen
    return op


_load0, _load1, _load2, _load3, _load4, _load5, _load6, _load7 = (_memory_op("tileloadd64", t) for t in range(8))
_store0, _store1, _store2, _store3 = (_memory_op("tilestored64", t) for t in range(4))
_p046, _p147, _p256, _p357 = _product(0, 4, 6), _product(1, 4, 7), _product(2, 5, 6), _product(3, 5, 7)

#: values (bf16) of one A or B tile: 16 rows x 32, in a run
STEP = 512
#: depths of one step
DEPTH = 32


@njit(error_model="numpy", cache=True, inline="always")
def block(a, a0, a1, b, b0, b1, boffs, ldb, start, s0, lds, strip, c, c0, ldc, steps, rows2, strips2):  # noqa: ANN001
    """c (fp32, row-major, ``ldc`` values a row) = start + A x B over ``steps`` 32-deep steps,
    for a C block of 16 rows at c0 (32 with ``rows2``: the next 16 below) x 16 pixels (32 with
    ``strips2``). The starting sums come from ``start`` (fp32), the block's first 16 x 16 at s0,
    ``lds`` values a row, the second strip's ``strip`` values on (0: the same tile again, as
    for a bias block whose every column is the same), the second row block's 16 rows below;
    ``start`` may be ``c`` itself (s0 = c0, lds = ldc, strip = 16). A's tiles lie at a0
    (+ q STEP for step q) in ``a``, the second row block's at a1; step q's B tile at b0 +
    boffs[q] (and b1 + boffs[q]: the second strip) in ``b``, its rows ``ldb`` bytes apart. The
    tile configuration must be loaded."""
    ldcb = ldc * 4
    ldsb = lds * 4
    both = rows2 and strips2
    _load0(start, s0, ldsb)
    if strips2:
        _load1(start, s0 + strip, ldsb)
    if rows2:
        _load2(start, s0 + 16 * lds, ldsb)
    if both:
        _load3(start, s0 + 16 * lds + strip, ldsb)
    for q in range(steps):
        o = q * STEP
        bo = boffs[q]
        _load4(a, a0 + o, 64)
        _load6(b, b0 + bo, ldb)
        _p046()
        if strips2:
            _load7(b, b1 + bo, ldb)
            _p147()
        if rows2:
            _load5(a, a1 + o, 64)
            _p256()
        if both:
            _p357()
    _store0(c, c0, ldcb)
    if strips2:
        _store1(c, c0 + 16, ldcb)
    if rows2:
        _store2(c, c0 + 16 * ldc, ldcb)
    if both:
        _store3(c, c0 + 16 * ldc + 16, ldcb)
