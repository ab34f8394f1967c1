"""bfloat16 storage: fp32 <-> bf16 held as uint16, vectorised.

Narrowing rounds to nearest, ties to even (the rule of hardware converters such as
AVX512-BF16 ``vcvtneps2bf16`` and ARMv8.6 ``BFCVTN``), unlike ncnn's portable C path,
which truncates. NaN stays NaN (made quiet, sign kept); +-Inf stay Inf; finite values
above the largest bf16 round to Inf as RNE requires.
Widening is exact: the 16 bits become the high half of an fp32.

Both directions can write into caller-owned buffers (``out=``, ``scratch=``) so the
executor's hot path allocates nothing: widening is one converting copy u16 -> u32 plus an
in-place shift; narrowing is a handful of in-place integer ufunc passes over a uint32
scratch and one converting copy into the uint16 destination.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu import threads
from vkserve.devices.cpu.threads import MIN_SPLIT, parallel

BF16 = np.uint16
#: the lowest finite bf16 (0xFF7F), as fp32. Max pooling pads with it where ncnn pads with
#: -FLT_MAX: a window lying wholly in the padding then stores it, while -FLT_MAX would round to
#: -inf (ncnn's fp32 answer there is -FLT_MAX, 0.4 % away).
BF16_LOWEST = float(np.uint32(0xFF7F0000).view(np.float32))

_QUIET_BIT = np.uint32(0x0040)
_U16 = np.uint32(16)
_ONE = np.uint32(1)
_HALF_MINUS_ONE = np.uint32(0x7FFF)
#: values narrowed per chunk (1 MiB of fp32 + 1 MiB of uint32 scratch: about one L2)
NARROW_CHUNK = 256 * 1024


def _narrow_flat(f: np.ndarray, t: np.ndarray, out: np.ndarray) -> None:
    """RNE-narrow the flat float32 ``f`` into the flat uint16 ``out``, using the uint32
    scratch ``t`` (same size)."""
    bits = f.view(np.uint32)
    # rounded = (bits + 0x7FFF + lsb) >> 16, lsb = bit 16 of bits (ties go to even)
    np.right_shift(bits, _U16, out=t)
    np.bitwise_and(t, _ONE, out=t)
    np.add(t, _HALF_MINUS_ONE, out=t)
    np.add(t, bits, out=t)
    np.right_shift(t, _U16, out=t)
    # (a shift straight into the uint16 ``out`` with casting="unsafe" would save the copy
    # below but goes through numpy's buffered casting: measured 5-7 % slower overall)
    if f.size and np.isnan(f.max()):  # max propagates NaN: one cheap pass when there is none
        m = np.isnan(f)
        t[m] = (bits[m] >> _U16) | _QUIET_BIT
    np.copyto(out, t, casting="unsafe")


def to_bf16(x: np.ndarray, out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
    """Round float32 values to bf16 (RNE); returns uint16 bits (written into ``out`` if given).

    ``scratch``, when given, is a uint32 buffer of at least ``x.size`` elements used for the
    intermediate (so nothing is allocated); without it each piece narrows through a
    `NARROW_CHUNK`-sized one of its own, so narrowing a large weight holds no second copy of
    it (vgg16's fc6: 392 MiB of fp32 once took 392 MiB of intermediate on top). ``x`` itself is
    never modified. Large arrays are narrowed in chunks on the engine's threads
    (``vkserve.devices.cpu.threads``).
    """
    f = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    n = f.size
    if out is None:
        out = np.empty(np.shape(x), BF16)
    if not out.flags.c_contiguous:
        np.copyto(out, to_bf16(f).reshape(out.shape), casting="unsafe")
        return out
    o = out.reshape(-1)
    given = scratch is not None and scratch.size >= n

    def piece(_: int, lo: int, hi: int) -> None:
        # cache-sized chunks, each through all the passes while hot (the scratch chunk is
        # reused), for 2M+ values: 3.2M values 4.5 -> 2.6 ms; no gain below ~1M values
        step = NARROW_CHUNK if hi - lo > 8 * NARROW_CHUNK else hi - lo
        t = scratch.reshape(-1)[lo : lo + step] if given else np.empty(step, np.uint32)
        for c0 in range(lo, hi, step):
            c1 = min(hi, c0 + step)
            _narrow_flat(f[c0:c1], t[: c1 - c0], o[c0:c1])

    if threads.THREADS == 1 and n <= 8 * NARROW_CHUNK:
        piece(0, 0, n)  # the common case, without the split's Python overhead
    else:
        parallel(piece, n, n)
    return out


def narrow_exact_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Store float32 values that are already bf16 values (low 16 bits zero: maxima, ReLU,
    copies of widened data) into the uint16 ``out``: the high halves, one pass, no rounding."""
    f = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    bits = f.view(np.uint32)
    if out.flags.c_contiguous:
        o = out.reshape(-1)
        parallel(lambda _, lo, hi: np.right_shift(bits[lo:hi], _U16, out=o[lo:hi], casting="unsafe"),
                 f.size, f.size)
    else:
        np.copyto(out, (bits >> _U16).reshape(out.shape), casting="unsafe")
    return out


def widen_into(u: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Widen bf16 bits ``u`` into the float32 array ``out`` (same shape, or same size if flat)."""
    o32 = out.view(np.uint32)
    src = u.reshape(o32.shape) if u.shape != o32.shape else u
    if threads.THREADS > 1 and o32.ndim >= 1 and o32.shape[0] > 1 and o32.size >= 4 * MIN_SPLIT:  # a widen is 2 passes: splits pay later
        def part(_: int, lo: int, hi: int) -> None:
            np.copyto(o32[lo:hi], src[lo:hi], casting="unsafe")
            np.left_shift(o32[lo:hi], _U16, out=o32[lo:hi])
        parallel(part, o32.shape[0], o32.size)
        return out
    np.copyto(o32, src, casting="unsafe")
    np.left_shift(o32, _U16, out=o32)
    return out


def from_bf16(u: np.ndarray) -> np.ndarray:
    """Widen bf16 bits (uint16) to float32, exactly; always returns a new array."""
    wide = np.asarray(u, dtype=BF16).astype(np.uint32)
    wide <<= _U16
    return wide.view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 -> float32: the value bf16 storage keeps."""
    return from_bf16(to_bf16(x))
