"""InnerProduct: y[b, o] = bias[o] + sum_k W[o, k] x[b, k] over bf16 weights packed in blocks of
RB output rows, k-major ((blocks, K, RB)): one task per block, whose RB sums stay in registers
across the k loop (a straight-line kernel that LLVM's SLP vectorizer turns into RB / 8 AVX2
registers: independent fma chains, so the loop is bound by the weights' loads, not by the fma
latency), every output summed k ascending whatever the thread count. Memory-bound on the
weights (two bytes per multiply-add) once the chains are independent."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.bf16 import to_bf16
from vkserve.devices.cpu.jit.epilogue import FASTMATH, apply_ops, store_row, widen

#: output rows per block (a task): 64 fp32 sums, eight AVX2 registers
RB = 64

_U = np.uint64


def pack_rows(w: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """fp32 weights [n_out][n_in] -> bf16 (blocks, n_in, RB), rows zero-padded to a whole
    block; narrowed block by block straight into the packed array, so that packing holds
    nothing of the weights' size beside it (vgg16's fc6: three bf16 copies at once before,
    a 480 MiB peak over the model's weights)."""
    nb = -(-n_out // RB)
    packed = np.zeros((nb, n_in, RB), dtype=np.uint16)
    rows = np.asarray(w, dtype=np.float32).reshape(n_out, n_in)
    for b in range(nb):
        block = rows[b * RB : (b + 1) * RB]
        to_bf16(block.T, out=packed[b, :, : block.shape[0]])
    return packed


def _block_source() -> str:
    """acc[r] += sum over k of widened wp[blk, k, r] * xf[b, k], r < RB, k ascending, written out
    per sum (numba has no SIMD types; the SLP vectorizer packs the RB scalars)."""
    lines = ["def block(xf, b, wp, blk, acc):", "    bu = U(b)", "    blk = U(blk)"]
    lines += [f"    s{r} = acc[{r}]" for r in range(RB)]
    lines += ["    for k in range(U(xf.shape[1])):", "        xk = xf[bu, k]"]
    lines += [f"        s{r} += widen(wp[blk, k, U({r})]) * xk" for r in range(RB)]
    lines += [f"    acc[{r}] = s{r}" for r in range(RB)]
    return "\n".join(lines) + "\n"


def _compile_block():  # noqa: ANN202
    """``_block_source`` compiled (numba does not cache exec'd code: compiled once per process)."""
    ns: dict[str, object] = {"U": _U, "widen": widen}
    exec(compile(_block_source(), f"<{__name__} block kernel {RB}>", "exec"), ns)  # noqa: S102
    return njit(fastmath=FASTMATH, error_model="numpy", inline="always")(ns["block"])


_block = _compile_block()


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def inner_product(x, wp, bias, ops, out):  # noqa: ANN001
    """``x`` (B, K) -> ``out`` (B, n_out); ``wp`` from ``pack_rows``; ``bias`` fp32."""
    nbatch, n_in = x.shape
    n_out = out.shape[1]
    xf = np.empty((nbatch, n_in), dtype=np.float32)
    for b in range(nbatch):
        for k in range(n_in):
            xf[b, k] = widen(x[b, k])
    for blk in prange(wp.shape[0]):
        o0 = blk * RB
        n = min(RB, n_out - o0)
        acc = np.empty(RB, dtype=np.float32)
        for b in range(nbatch):
            for r in range(RB):
                acc[r] = bias[o0 + r] if r < n else np.float32(0.0)
            _block(xf, b, wp, blk, acc)
            apply_ops(acc, n, ops)
            store_row(acc, 0, out, b, o0, n)
