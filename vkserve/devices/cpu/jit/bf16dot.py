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

__all__ = ["LANES", "compile_dot_micro", "dot_pairs", "element_address", "f32x16", "vload", "vstore"]

#: fp32 lanes of a register (and pixels of a strip: ``conv.NR``)
LANES = 16


class F32x16(types.Type):
    """16 float32 lanes in one AVX-512 register."""

    def __init__(self) -> None:
        super().__init__(name="f32x16")


f32x16 = F32x16()

_VF = ir.VectorType(ir.FloatType(), LANES)
_VI = ir.VectorType(ir.IntType(32), LANES)
_I32 = ir.IntType(32)


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
        pa = element_address(context, builder, signature.args[1], args[1], args[2])
        pb = element_address(context, builder, signature.args[3], args[3], args[4])
        pair = builder.load(builder.bitcast(pa, _I32.as_pointer()), align=2)
        row = builder.load(builder.bitcast(pb, _VI.as_pointer()), align=2)
        one = builder.insert_element(ir.Constant(_VI, ir.Undefined), pair, ir.Constant(_I32, 0))
        splat = builder.shuffle_vector(one, ir.Constant(_VI, ir.Undefined), ir.Constant(_VI, [0] * LANES))
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VB, _VB]), _DPBF16)
        return builder.call(fn, [args[0], builder.bitcast(splat, _VB), builder.bitcast(row, _VB)])

    return f32x16(acc, a, ia, b, ib), codegen


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
