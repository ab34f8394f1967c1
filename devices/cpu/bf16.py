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

BF16 = np.uint16

_QUIET_BIT = np.uint32(0x0040)
_U16 = np.uint32(16)
_ONE = np.uint32(1)
_HALF_MINUS_ONE = np.uint32(0x7FFF)


def to_bf16(x: np.ndarray, out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
    """Round float32 values to bf16 (RNE); returns uint16 bits (written into ``out`` if given).

    ``scratch``, when given, is a uint32 buffer of at least ``x.size`` elements used for the
    intermediate (so nothing is allocated); ``x`` itself is never modified.
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32).reshape(-1)
    n = bits.size
    t = np.empty(n, np.uint32) if scratch is None or scratch.size < n else scratch.reshape(-1)[:n]
    # rounded = (bits + 0x7FFF + lsb) >> 16, lsb = bit 16 of bits (ties go to even)
    np.right_shift(bits, _U16, out=t)
    np.bitwise_and(t, _ONE, out=t)
    np.add(t, _HALF_MINUS_ONE, out=t)
    np.add(t, bits, out=t)
    np.right_shift(t, _U16, out=t)
    if n and np.isnan(f.max()):  # max propagates NaN: one cheap pass when there is none
        nan = np.isnan(f.reshape(-1))
        t[nan] = (bits[nan] >> _U16) | _QUIET_BIT
    if out is None:
        return t.astype(BF16).reshape(f.shape)
    if out.flags.c_contiguous:
        np.copyto(out.reshape(-1), t, casting="unsafe")
    else:
        np.copyto(out, t.reshape(out.shape), casting="unsafe")
    return out


def widen_into(u: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Widen bf16 bits ``u`` into the float32 array ``out`` (same shape, or same size if flat)."""
    o32 = out.view(np.uint32)
    np.copyto(o32, u.reshape(o32.shape) if u.shape != o32.shape else u, casting="unsafe")
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
