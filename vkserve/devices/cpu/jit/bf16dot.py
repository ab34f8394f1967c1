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

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = ["LANES", "compile_dot_micro", "compile_rows_micro", "dot_pairs", "element_address", "f32x16", "vload",
           "vstore"]

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


def _dot_micro_source(rows: int, strips: int, table: bool) -> str:
    """rows x (strips x 16) register tile: for r < rows, s < strips, lanes j:
    c[ic + r ldc + 16 s + j] += sum over k pairs p < kc2 of the pair products of
    a[ia + 2 rows p + 2 r ...] and b[pb + s sb + 2 j ...] (p ascending), where pb is
    ib + 32 p (strips of 16 pixels' pairs, one k pair after another) or, with ``table``,
    ib + offs[p] (each k pair's 16 pixels wherever the table says: ``jit.implicit_pairs``)."""
    acc = [[f"c{r}_{s}" for s in range(strips)] for r in range(rows)]
    args = "a, ia, b, ib, sb, offs, c, ic, ldc, kc2" if table else "a, ia, b, ib, sb, c, ic, ldc, kc2"
    lines = [f"def micro({args}):"]
    lines += [f"    {acc[r][s]} = vload(c, ic + {r} * ldc + {LANES * s})" for r in range(rows) for s in range(strips)]
    pb = "ib + offs[p]" if table else f"ib + p * {2 * LANES}"
    lines += ["    for p in range(kc2):", f"        pa = ia + p * {2 * rows}", f"        pb = {pb}"]
    for r in range(rows):
        lines += [f"        {acc[r][s]} = dot_pairs({acc[r][s]}, a, pa + {2 * r}, b, pb + {s} * sb)"
                  for s in range(strips)]
    lines += [f"    vstore(c, ic + {r} * ldc + {LANES * s}, {acc[r][s]})" for r in range(rows) for s in range(strips)]
    return "\n".join(lines) + "\n"


def compile_dot_micro(rows: int, strips: int, table: bool = False):  # noqa: ANN201
    """The register-tile kernel of ``_dot_micro_source`` compiled (numba does not cache exec'd
    code; the kernels calling it are cached with it)."""
    ns: dict[str, object] = {"vload": vload, "vstore": vstore, "dot_pairs": dot_pairs}
    name = f"<{__name__} {rows}x{strips * LANES}{' table' if table else ''}>"
    exec(compile(_dot_micro_source(rows, strips, table), name, "exec"), ns)  # noqa: S102
    return njit(error_model="numpy")(ns["micro"])


def _rows_micro_source(rows: int, strips: int) -> str:
    """``_dot_micro_source``'s tile with B read from a planar bf16 blob instead of a packed
    panel: k pair p is channels 2 p and 2 p + 1 at b[ib + 2 p ldb ...] and one ldb on, pixels
    16 s + j of strip s valid below n (the rest read as zero); with ``odd``, one more k (its
    pair's second channel zero)."""
    acc = [[f"c{r}_{s}" for s in range(strips)] for r in range(rows)]

    def step(indent: str, pair: str) -> list[str]:
        """One k pair's products; ``pair``: the pair's second channel is read (else zero)."""
        body = [f"pa = ia + p * {2 * rows}", "pb = ib + 2 * p * ldb"]
        body += [f"b{s} = row_pairs(b, pb + {LANES * s}, pb + ldb + {LANES * s}, n{s}, {f'n{s}' if pair else 0})"
                 for s in range(strips)]
        body += [f"{acc[r][s]} = dot_rows({acc[r][s]}, a, pa + {2 * r}, b{s})"
                 for r in range(rows) for s in range(strips)]
        return [indent + ln for ln in body]

    lines = ["def micro(a, ia, b, ib, ldb, n, c, ic, ldc, kc2, odd):"]
    lines += [f"    {acc[r][s]} = vload(c, ic + {r} * ldc + {LANES * s})" for r in range(rows) for s in range(strips)]
    lines += [f"    n{s} = n - {LANES * s}" for s in range(strips)]
    lines += ["    for p in range(kc2):", *step(" " * 8, True)]
    lines += ["    if odd:", "        p = kc2", *step(" " * 8, False)]
    lines += [f"    vstore(c, ic + {r} * ldc + {LANES * s}, {acc[r][s]})" for r in range(rows) for s in range(strips)]
    return "\n".join(lines) + "\n"


def compile_rows_micro(rows: int, strips: int):  # noqa: ANN201
    """The register-tile kernel of ``_rows_micro_source`` compiled (the callers are cached)."""
    ns: dict[str, object] = {"vload": vload, "vstore": vstore, "row_pairs": row_pairs, "dot_rows": dot_rows}
    name = f"<{__name__} {rows}x{strips * LANES} rows>"
    exec(compile(_rows_micro_source(rows, strips), name, "exec"), ns)  # noqa: S102
    return njit(error_model="numpy")(ns["micro"])
