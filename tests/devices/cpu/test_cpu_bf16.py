"""bf16 conversion: round to nearest even, exact cases, NaN/Inf, vectorised against a scalar model."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from vkserve.devices.cpu.bf16 import from_bf16, round_bf16, to_bf16


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def scalar_rne(b: int) -> int:
    """Reference rounding of fp32 bits to bf16 bits, done with exact integers."""
    if (b & 0x7F800000) == 0x7F800000 and (b & 0x007FFFFF):
        return (b >> 16) | 0x40
    upper, lower = b >> 16, b & 0xFFFF
    if lower > 0x8000 or (lower == 0x8000 and upper & 1):
        upper += 1
    return upper & 0xFFFF


def test_exact_values_unchanged() -> None:
    x = np.array([0.0, -0.0, 1.0, -2.5, 0.15625, 65280.0, 2.0**-126, 2.0**-133], np.float32)
    assert np.array_equal(round_bf16(x), x)
    assert to_bf16(np.array([-0.0], np.float32))[0] == 0x8000


def test_ties_round_to_even() -> None:
    # 1 + 2^-8 sits halfway between 1 (even mantissa) and 1 + 2^-7: goes down
    # 1 + 3*2^-8 sits halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), -(1 + 3 * 2**-8)], np.float32)
    assert round_bf16(x).tolist() == [1.0, 1 + 2**-6, -1.0, -(1 + 2**-6)]


def test_above_and_below_half() -> None:
    x = np.array([from_bits(0x3F808001), from_bits(0x3F807FFF)], np.float32)
    assert to_bf16(x).tolist() == [0x3F81, 0x3F80]


def test_nan_inf_and_overflow() -> None:
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, from_bits(0x7F800001), 3.4e38], np.float32)
    y = round_bf16(x)
    assert np.isnan(y[0]) and np.isnan(y[1]) and np.isnan(y[4])  # a signalling NaN stays NaN
    assert y[2] == np.inf and y[3] == -np.inf
    assert y[5] == np.inf  # above the largest bf16: RNE gives Inf


def test_out_parameter_and_shape() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    out = np.empty((3, 4), np.uint16)
    assert to_bf16(x, out=out) is out
    assert np.array_equal(from_bf16(out), round_bf16(x))
    assert from_bf16(out).shape == (3, 4)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_matches_scalar_reference(words: list[int]) -> None:
    x = np.array(words, dtype=np.uint32).view(np.float32)
    got = to_bf16(x).tolist()
    assert got == [scalar_rne(w) for w in words]


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_relative_error_bound(v: float) -> None:
    y = float(round_bf16(np.array([v], np.float32))[0])
    if abs(v) < 1e-37 or np.isinf(y):
        return
    assert abs(y - v) <= abs(v) * 2.0**-8
