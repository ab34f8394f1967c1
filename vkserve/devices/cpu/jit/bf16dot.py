"""bf16 dot products on AVX-512 BF16 (``vdpbf16ps``): the GEMM micro kernel for CPUs that have them.

``vdpbf16ps`` multiplies 16 pairs of bf16 values by 16 others and adds each pair's two products
to one fp32 lane: twice the multiply-adds of an fp32 FMA per instruction, read straight from bf16
storage (nothing widened). Measured on this project's 2-core AMD Zen 4 box, one core, 256-deep
register tiles: the fp32 FMA kernel 113 GFLOP/s, bf16 pairs 166 GFLOP/s
at 8 rows x 16 pixels and 202 at 8 x 32 (8 accumulators leave the instruction's latency
showing; 16 hide it).

numba has no SIMD types, so this module gives it one: ``f32x16`` (an LLVM <16 x float> held in a
register) with three intrinsics, a load, a store and the product, and the micro kernel is
generated source over them like ``conv``'s, so LLVM keeps the accumulators in registers across
its k loop.

Operand layout (both bf16, as uint16): A, the weights, holds each k pair of a row next to each
other: a[ia + 2 r], a[ia + 2 r + 1] = W[r, k], W[r, k + 1]; B, the input, holds each pixel's pair
likewise: b[ib + 2 j], b[ib + 2 j + 1] = X[k, j], X[k + 1, j]. Intel defines the instruction to
add the odd k's product, then the even one's (both exact in fp32: one rounding each); an AMD
Zen 4 gave the bits of k ascending (every output of a 45-deep convolution, this project's Zen 4
box; ``tests/devices/cpu/test_cpu_bf16dot.py`` accepts either order).
Either way the order is fixed by the CPU and the shape. Denormals are read and written as zero.
"""

from __future__ import annotations

import enum

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from vkserve.devices.cpu.jit.epilogue import OP_CLIP, OP_RELU
from vkserve.devices.cpu.jit.generated import compile_source

__all__ = ["LANES", "PairsFrom", "Finish", "block_pairs", "compile_dot_micro", "dot_pairs", "dot_regs", "element_address",
           "f32x16", "pair_splat", "tail_pixels", "tail_pixels_table", "tail_width", "vload", "vstore",
           "TAIL_PIXELS"]

#: fp32 lanes of a register (and pixels of a strip: ``conv.NR``)
LANES = 16


class F32x16(types.Type):
    """16 float32 lanes in one AVX-512 register."""

    def __init__(self) -> None:
        super().__init__(name="f32x16")


f32x16 = F32x16()


class Pairs16(types.Type):
    """16 pairs of bf16 values in one AVX-512 register (a ``vdpbf16ps`` operand)."""

    def __init__(self) -> None:
        super().__init__(name="pairs16")


pairs16 = Pairs16()

_VF = ir.VectorType(ir.FloatType(), LANES)
_VI = ir.VectorType(ir.IntType(32), LANES)
_I32 = ir.IntType(32)
_I16 = ir.IntType(16)
_VH = ir.VectorType(_I16, LANES)
_VP = ir.VectorType(_I16, 2 * LANES)
_MASK = ir.VectorType(ir.IntType(1), LANES)


class _BFloat(ir.Type):
    """LLVM's ``bfloat`` (llvmlite names no class for it); only its vectors are used, as the
    intrinsic's operand type."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BFloat)

    def __hash__(self) -> int:
        return hash("bfloat")


_VB = ir.VectorType(_BFloat(), 2 * LANES)
_DPBF16 = "llvm.x86.avx512bf16.dpbf16ps.512"


@register_model(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type) -> None:  # noqa: ANN001
        super().__init__(dmm, fe_type, _VF)


@register_model(Pairs16)
class _Pairs16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type) -> None:  # noqa: ANN001
        super().__init__(dmm, fe_type, _VP)


def _is_1d(arr: types.Type, dtype: types.Type) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == dtype


def element_address(context, builder, arr_type, arr, index):  # noqa: ANN001, ANN202
    """&arr[index] (no bounds check: the callers' indices come from the tile shapes)."""
    data = context.make_array(arr_type)(context, builder, arr).data
    return builder.gep(data, [index])


@intrinsic
def vload(typingctx, arr, index):  # noqa: ARG001, ANN001, ANN201
    """arr[index:index + 16] of a float32 array as one register."""
    if not (_is_1d(arr, types.float32) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        p = element_address(context, builder, signature.args[0], args[0], args[1])
        return builder.load(builder.bitcast(p, _VF.as_pointer()), align=4)

    return f32x16(arr, index), codegen


@intrinsic
def vstore(typingctx, arr, index, value):  # noqa: ARG001, ANN001, ANN201
    """arr[index:index + 16] = value."""
    if not (_is_1d(arr, types.float32) and isinstance(index, types.Integer) and value == f32x16):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        p = element_address(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(p, _VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(arr, index, value), codegen


@intrinsic
def dot_pairs(typingctx, acc, a, ia, b, ib):  # noqa: ARG001, ANN001, ANN201
    """acc + per lane j: a[ia] b[ib + 2 j] + a[ia + 1] b[ib + 2 j + 1] (bf16 arrays: A's pair
    broadcast to every lane, B's 16 pairs)."""
    if not (acc == f32x16 and _is_1d(a, types.uint16) and _is_1d(b, types.uint16)
            and isinstance(ia, types.Integer) and isinstance(ib, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        pb = element_address(context, builder, signature.args[3], args[3], args[4])
        row = builder.load(builder.bitcast(pb, _VI.as_pointer()), align=2)
        return _dot_with_pair(context, builder, signature.args[1], args[0], args[1], args[2], row)

    return f32x16(acc, a, ia, b, ib), codegen


def _dot_with_pair(context, builder, a_type, acc, a, ia, pairs):  # noqa: ANN001, ANN202
    """acc + the pair a[ia], a[ia + 1] (broadcast to every lane) times the 16 pairs ``pairs``."""
    pa = element_address(context, builder, a_type, a, ia)
    pair = builder.load(builder.bitcast(pa, _I32.as_pointer()), align=2)
    one = builder.insert_element(ir.Constant(_VI, ir.Undefined), pair, ir.Constant(_I32, 0))
    splat = builder.shuffle_vector(one, ir.Constant(_VI, ir.Undefined), ir.Constant(_VI, [0] * LANES))
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VB, _VB]), _DPBF16)
    return builder.call(fn, [acc, builder.bitcast(splat, _VB), builder.bitcast(pairs, _VB)])


def _lanes_below(builder, count):  # noqa: ANN001, ANN202
    """The mask of lanes j < count (count an int64; negative: none)."""
    lanes = ir.Constant(_VI, list(range(LANES)))
    n = builder.trunc(builder.select(builder.icmp_signed("<", count, ir.Constant(count.type, LANES)), count,
                                     ir.Constant(count.type, LANES)), _I32)
    n = builder.select(builder.icmp_signed("<", n, ir.Constant(_I32, 0)), ir.Constant(_I32, 0), n)
    one = builder.insert_element(ir.Constant(_VI, ir.Undefined), n, ir.Constant(_I32, 0))
    splat = builder.shuffle_vector(one, ir.Constant(_VI, ir.Undefined), ir.Constant(_VI, [0] * LANES))
    return builder.icmp_unsigned("<", lanes, splat)


@intrinsic
def row_pairs(typingctx, b, ib0, ib1, n0, n1):  # noqa: ARG001, ANN001, ANN201
    """The pairs (b[ib0 + j], b[ib1 + j]) for lanes j < 16 of a bf16 array: two rows of a
    planar blob (two channels' runs of pixels) interleaved as ``dot_rows`` takes them; lanes
    j >= n0 (first row) or j >= n1 (second) read as zero and not read at all (masked loads:
    a run's end may be the array's)."""
    if not (_is_1d(b, types.uint16) and all(isinstance(t, types.Integer) for t in (ib0, ib1, n0, n1))):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VH, [_VH.as_pointer(), _I32, _MASK, _VH]),
            "llvm.masked.load.v16i16.p0v16i16")
        rows = []
        for index, count in ((args[1], args[3]), (args[2], args[4])):
            p = element_address(context, builder, signature.args[0], args[0], index)
            count = context.cast(builder, count, signature.args[3], types.int64)
            rows.append(builder.call(fn, [builder.bitcast(p, _VH.as_pointer()), ir.Constant(_I32, 2),
                                          _lanes_below(builder, count), ir.Constant(_VH, None)]))
        order = [k // 2 + (k % 2) * LANES for k in range(2 * LANES)]
        return builder.shuffle_vector(rows[0], rows[1], ir.Constant(ir.VectorType(_I32, 2 * LANES), order))

    return pairs16(b, ib0, ib1, n0, n1), codegen


@intrinsic
def dot_rows(typingctx, acc, a, ia, pairs):  # noqa: ARG001, ANN001, ANN201
    """``dot_pairs`` with B's 16 pairs given in a register (``row_pairs``)."""
    if not (acc == f32x16 and _is_1d(a, types.uint16) and isinstance(ia, types.Integer) and pairs == pairs16):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return _dot_with_pair(context, builder, signature.args[1], args[0], args[1], args[2], args[3])

    return f32x16(acc, a, ia, pairs), codegen


@intrinsic
def block_pairs(typingctx, a, i0, i1):  # noqa: ARG001, ANN001, ANN201
    """Two row blocks' weights for one k pair as one operand: the 8 pairs a[i0:i0 + 16] in lanes
    0-7 and the 8 pairs a[i1:i1 + 16] in lanes 8-15 (``tail_pixels``: rows as the lanes)."""
    if not (_is_1d(a, types.uint16) and isinstance(i0, types.Integer) and isinstance(i1, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        halves = []
        for index in (args[1], args[2]):
            p = element_address(context, builder, signature.args[0], args[0], index)
            halves.append(builder.load(builder.bitcast(p, _VH.as_pointer()), align=2))
        return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 2 * LANES),
                                                                        list(range(2 * LANES))))

    return pairs16(a, i0, i1), codegen


@intrinsic
def pair_splat(typingctx, lo, hi):  # noqa: ARG001, ANN001, ANN201
    """The pair (lo, hi) of bf16 bits (uint16) in every lane: one pixel's two depths."""
    if not (lo == types.uint16 and hi == types.uint16):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        low = builder.zext(args[0], _I32)
        high = builder.shl(builder.zext(args[1], _I32), ir.Constant(_I32, 16))
        one = builder.insert_element(ir.Constant(_VI, ir.Undefined), builder.or_(low, high), ir.Constant(_I32, 0))
        splat = builder.shuffle_vector(one, ir.Constant(_VI, ir.Undefined), ir.Constant(_VI, [0] * LANES))
        return builder.bitcast(splat, _VP)

    return pairs16(lo, hi), codegen


@intrinsic
def dot_regs(typingctx, acc, a, b):  # noqa: ARG001, ANN001, ANN201
    """acc + per lane j: a's pair j times b's pair j (both in registers), as ``dot_pairs``."""
    if not (acc == f32x16 and a == pairs16 and b == pairs16):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VB, _VB]), _DPBF16)
        return builder.call(fn, [args[0], builder.bitcast(args[1], _VB), builder.bitcast(args[2], _VB)])

    return f32x16(acc, a, b), codegen


@intrinsic
def vsplat(typingctx, value):  # noqa: ARG001, ANN001, ANN201
    """``value`` (float32) in every lane."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        one = builder.insert_element(ir.Constant(_VF, ir.Undefined), args[0], ir.Constant(_I32, 0))
        return builder.shuffle_vector(one, ir.Constant(_VF, ir.Undefined), ir.Constant(_VI, [0] * LANES))

    return f32x16(value), codegen


@intrinsic
def vstore_bf16(typingctx, out, row, col, value, count, code, lo, hi):  # noqa: ARG001, ANN001, ANN201
    """out[row, col + j] = lane j of ``value`` after the epilogue ``code`` (OP_NONE; OP_RELU:
    max(v, 0) + 0; OP_CLIP: min(max(v, lo), hi), each as numba's max and min select), rounded
    to bf16 (nearest even; a NaN quiet, sign kept), for lanes j < count: ``finish_tile``'s
    store of 16 values (a masked store: nothing written past count)."""
    if not (isinstance(out, types.Array) and out.ndim == 2 and out.dtype == types.uint16 and value == f32x16
            and all(isinstance(t, types.Integer) for t in (row, col, count, code))
            and lo == types.float32 and hi == types.float32):
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        out_t = signature.args[0]
        arr = context.make_array(out_t)(context, builder, args[0])
        shape = cgutils.unpack_tuple(builder, arr.shape, 2)
        strides = cgutils.unpack_tuple(builder, arr.strides, 2)
        index = [context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 2)]
        ptr = cgutils.get_item_pointer2(context, builder, arr.data, shape, strides, out_t.layout, index)
        v, lo_v, hi_v = args[3], args[6], args[7]
        zero = ir.Constant(_VF, None)

        def splat(x):  # noqa: ANN001, ANN202
            one = builder.insert_element(ir.Constant(_VF, ir.Undefined), x, ir.Constant(_I32, 0))
            return builder.shuffle_vector(one, ir.Constant(_VF, ir.Undefined), ir.Constant(_VI, [0] * LANES))

        relu = builder.fadd(builder.select(builder.fcmp_ordered(">", zero, v), zero, v), zero)
        lo_s, hi_s = splat(lo_v), splat(hi_v)
        above = builder.select(builder.fcmp_ordered(">", lo_s, v), lo_s, v)
        clip = builder.select(builder.fcmp_ordered("<", hi_s, above), hi_s, above)
        code_v = context.cast(builder, args[5], signature.args[5], types.int64)
        is_relu = builder.icmp_signed("==", code_v, ir.Constant(code_v.type, OP_RELU))
        is_clip = builder.icmp_signed("==", code_v, ir.Constant(code_v.type, OP_CLIP))
        v = builder.select(is_relu, relu, builder.select(is_clip, clip, v))
        bits = builder.bitcast(v, _VI)
        high = builder.lshr(bits, ir.Constant(_VI, [16] * LANES))
        rounded = builder.lshr(builder.add(builder.add(bits, ir.Constant(_VI, [0x7FFF] * LANES)),
                                           builder.and_(high, ir.Constant(_VI, [1] * LANES))),
                               ir.Constant(_VI, [16] * LANES))
        quiet = builder.or_(high, ir.Constant(_VI, [0x40] * LANES))
        narrowed = builder.trunc(builder.select(builder.fcmp_unordered("uno", v, v), quiet, rounded), _VH)
        count = context.cast(builder, args[4], signature.args[4], types.int64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_VH, _VH.as_pointer(), _I32, _MASK]),
            "llvm.masked.store.v16i16.p0v16i16")
        builder.call(fn, [narrowed, builder.bitcast(ptr, _VH.as_pointer()), ir.Constant(_I32, 2),
                          _lanes_below(builder, count)])
        return context.get_dummy_value()

    return types.none(out, row, col, value, count, code, lo, hi), codegen


#: rows of a block of packed weights (``conv.pack_gemm_weights``: k pair p of a block is its
#: rows' 8 pairs, 16 values at 16 p), where ``tail_pixels`` reads them
BLOCK_ROWS = LANES // 2
#: row blocks and pixels ``tail_pixels`` multiplies at once (four registers of two blocks per
#: pixel, each weight register loaded once for every pixel), and the values of ``col`` a pixel
#: needs per such group of blocks
TAIL_BLOCKS = 8
TAIL_PIXELS = 4
TAIL_COL = TAIL_BLOCKS * BLOCK_ROWS


@njit(cache=True, inline="always")
def tail_width(nb):  # noqa: ANN001, ANN201
    """Values of ``col`` per pixel (``tail_pixels``' ``ldcol``) for nb row blocks."""
    return -(-nb // TAIL_BLOCKS) * TAIL_COL


def _tail_source(b_read: PairsFrom) -> str:
    """``tail_pixels`` written out: TAIL_PIXELS pixels x TAIL_BLOCKS / 2 registers of sums, k
    pair p's input at ``p sp`` (``PairsFrom.PANEL``) or ``offs[p]`` (``PairsFrom.TABLE``) past
    the pixel's."""
    regs = TAIL_BLOCKS // 2
    acc = [[f"a{j}_{q}" for q in range(regs)] for j in range(TAIL_PIXELS)]
    step = "sp" if b_read == PairsFrom.PANEL else "offs"
    lines = [f"def tail(w, w0, kstride, nb, b, ib, {step}, kc2, m, col, ldcol):", "    last = nb - 1",
             "    for g0 in range(0, nb, TAIL_BLOCKS):"]
    lines += [f"        i{i} = w0 + min(g0 + {i}, last) * kstride" for i in range(TAIL_BLOCKS)]
    lines += [f"        c{j} = min({j}, m - 1) * ldcol + g0 * BLOCK_ROWS" for j in range(TAIL_PIXELS)]
    lines += [f"        b{j} = ib + min({j}, m - 1) * 2" for j in range(TAIL_PIXELS)]
    lines += [f"        {acc[j][q]} = vload(col, c{j} + {q * LANES})" for j in range(TAIL_PIXELS) for q in range(regs)]
    lines += ["        for p in range(kc2):", "            at = " + ("p * sp" if b_read == PairsFrom.PANEL else "offs[p]"),
              "            o = p * 2 * BLOCK_ROWS"]
    lines += [f"            x{j} = pair_splat(b[b{j} + at], b[b{j} + at + 1])" for j in range(TAIL_PIXELS)]
    for q in range(regs):
        lines.append(f"            v = block_pairs(w, i{2 * q} + o, i{2 * q + 1} + o)")
        lines += [f"            {acc[j][q]} = dot_regs({acc[j][q]}, v, x{j})" for j in range(TAIL_PIXELS)]
    # (pixels past m repeat the last one's and store the same sums in its place, last)
    lines += [f"        vstore(col, c{j} + {q * LANES}, {acc[j][q]})" for j in range(TAIL_PIXELS) for q in range(regs)]
    return "\n".join(lines) + "\n"


class PairsFrom(enum.Enum):
    """Where a register tile's B operand lies."""

    PANEL = "panel"  # strips of 16 pixels' pairs, one k pair after another (b[ib + s sb + 32 p ...])
    TABLE = "table"  # each k pair's 16 pixels' pairs where an offset table says (b[ib + s sb + offs[p] ...])
    #: a planar blob's channel rows: k pair p is channels 2 p and 2 p + 1 at b[ib + 2 p ldb ...]
    #: and one ldb on (``row_pairs``); pixels 16 s + j valid below n (the rest read as zero),
    #: with ``odd`` one more k (its pair's second channel zero)
    ROWS = "rows"


class Finish(enum.Enum):
    """Where a register tile's sums start and end."""

    TILE = "tile"  # added to an fp32 tile: c[ic + r ldc + 16 s + j]
    #: from the bias (bias[bi + r]), stored through the epilogue as bf16 (``vstore_bf16``):
    #: rows r < nv of out[orow + r, ocol + 16 s + j], pixels below n
    STORE = "store"


def _dot_micro_source(rows: int, strips: int, b_read: PairsFrom, finish: Finish) -> str:
    """rows x (strips x 16) register tile: for r < rows, s < strips, lanes j, its sum plus, over k
    pairs p < kc2 ascending, the pair products of a[ia + 2 rows p + 2 r ...] and B's pair for
    pixel 16 s + j (``b_read``), the sums starting and ending as ``finish`` says."""
    acc = [[f"c{r}_{s}" for s in range(strips)] for r in range(rows)]
    b_args = {PairsFrom.PANEL: "sb", PairsFrom.TABLE: "sb, offs", PairsFrom.ROWS: "ldb, odd"}[b_read]
    count = ", n" if b_read == PairsFrom.ROWS or finish == Finish.STORE else ""
    c_args = "c, ic, ldc" if finish == Finish.TILE else "bias, bi, nv, out, orow, ocol, code, lo, hi"
    lines = [f"def micro(a, ia, b, ib, {b_args}{count}, {c_args}, kc2):"]
    if finish == Finish.TILE:
        lines += [f"    {acc[r][s]} = vload(c, ic + {r} * ldc + {LANES * s})"
                  for r in range(rows) for s in range(strips)]
    else:
        lines += [f"    {acc[r][s]} = vsplat(bias[bi + {r}] if {r} < nv else zero)"
                  for r in range(rows) for s in range(strips)]
    if count:
        lines += [f"    n{s} = n - {LANES * s}" for s in range(strips)]

    def step(pair: bool) -> list[str]:
        """One k pair's products (ROWS: ``pair``, its second channel read, else zero)."""
        pb = {PairsFrom.PANEL: f"ib + p * {2 * LANES}", PairsFrom.TABLE: "ib + offs[p]",
              PairsFrom.ROWS: "ib + 2 * p * ldb"}[b_read]
        body = [f"pa = ia + p * {2 * rows}", f"pb = {pb}"]
        if b_read == PairsFrom.ROWS:
            body += [f"b{s} = row_pairs(b, pb + {LANES * s}, pb + ldb + {LANES * s}, n{s}, {f'n{s}' if pair else 0})"
                     for s in range(strips)]
            body += [f"{acc[r][s]} = dot_rows({acc[r][s]}, a, pa + {2 * r}, b{s})"
                     for r in range(rows) for s in range(strips)]
        else:
            body += [f"{acc[r][s]} = dot_pairs({acc[r][s]}, a, pa + {2 * r}, b, pb + {s} * sb)"
                     for r in range(rows) for s in range(strips)]
        return [" " * 8 + ln for ln in body]

    lines += ["    for p in range(kc2):", *step(True)]
    if b_read == PairsFrom.ROWS:
        lines += ["    if odd:", "        p = kc2", *step(False)]
    if finish == Finish.TILE:
        lines += [f"    vstore(c, ic + {r} * ldc + {LANES * s}, {acc[r][s]})"
                  for r in range(rows) for s in range(strips)]
    else:
        for r in range(rows):
            lines += [f"    if {r} < nv:"]
            lines += [f"        vstore_bf16(out, orow + {r}, ocol + {LANES * s}, {acc[r][s]}, n{s}, code, lo, hi)"
                      for s in range(strips)]
    return "\n".join(lines) + "\n"


def compile_dot_micro(rows: int, strips: int, b_read: PairsFrom = PairsFrom.PANEL,  # noqa: ANN201
                      finish: Finish = Finish.TILE):
    """The register-tile kernel of ``_dot_micro_source`` compiled (``jit.generated``)."""
    ns: dict[str, object] = {"vload": vload, "vstore": vstore, "dot_pairs": dot_pairs, "row_pairs": row_pairs,
                             "dot_rows": dot_rows, "vsplat": vsplat, "vstore_bf16": vstore_bf16,
                             "zero": np.float32(0.0)}
    return compile_source(_dot_micro_source(rows, strips, b_read, finish), "micro",
                          f"{__name__} {rows}x{strips * LANES} {b_read.value} {finish.value}", ns, inline=False)


def _compile_tail(b_read: PairsFrom):  # noqa: ANN202
    return compile_source(_tail_source(b_read), "tail", f"{__name__} tail {b_read.value}", {
        "vload": vload, "vstore": vstore, "pair_splat": pair_splat, "block_pairs": block_pairs, "dot_regs": dot_regs,
        "TAIL_BLOCKS": TAIL_BLOCKS, "BLOCK_ROWS": BLOCK_ROWS}, inline=True)


#: col[j ldcol + 8 i + r] += the pair products of row r of weight block i < nb (blocks from
#: w[w0:], one every ``kstride`` values) with pixel j < m's input pairs (b[ib + 2 j + at],
#: b[ib + 2 j + at + 1]) for k pairs p < kc2 ascending, at = p sp (a packed panel's pixels),
#: m <= TAIL_PIXELS. The rows are the lanes (two blocks a register), a pixel's pair in every
#: lane: for a map's last few pixels, where a strip kernel (pixels as the lanes) would compute a
#: whole strip for them. Each lane's arithmetic is ``dot_pairs``'s for the same row, pixel and
#: pairs in the same order, so the sums are the strip kernels' bits. A pixel's ``col`` holds
#: TAIL_COL values per TAIL_BLOCKS blocks (nb rounded up; ``ldcol`` apart): lanes of blocks past
#: nb repeat the last block's and land past 8 nb.
tail_pixels = _compile_tail(PairsFrom.PANEL)
#: the same with k pair p's input at at = offs[p] (an offset table: ``jit.implicit_pairs``)
tail_pixels_table = _compile_tail(PairsFrom.TABLE)
