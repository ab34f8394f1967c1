"""bfloat16 storage: fp32 <-> bf16 held as uint16, vectorised.

Narrowing rounds to nearest, ties to even (the rule of hardware converters such as
AVX512-BF16 ``vcvtneps2bf16`` and ARMv8.6 ``BFCVTN``), unlike ncnn's portable C path,
which truncates. NaN stays NaN (made quiet, sign kept); +-Inf stay Inf; finite values
above the largest bf16 round to Inf as RNE requires.
Widening is exact: the 16 bits become the high half of an fp32.
"""

from __future__ import annotations

import numpy as np

BF16 = np.uint16

_QUIET_BIT = np.uint32(0x0040)


def to_bf16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 values to bf16 (RNE); returns uint16 bits (written into ``out`` if given)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    lsb = (bits >> 16) & 1
    rounded = bits + np.uint32(0x7FFF)
    rounded += lsb
    rounded >>= 16
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = (bits[nan] >> 16) | _QUIET_BIT
    if out is None:
        return rounded.astype(BF16)
    np.copyto(out, rounded.reshape(out.shape), casting="unsafe")
    return out


def from_bf16(u: np.ndarray) -> np.ndarray:
    """Widen bf16 bits (uint16) to float32, exactly; always returns a new array."""
    wide = np.asarray(u, dtype=BF16).astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 -> float32: the value bf16 storage keeps."""
    return from_bf16(to_bf16(x))
