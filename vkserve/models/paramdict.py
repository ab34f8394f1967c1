"""ncnn's typed ``key=value`` layer parameters (the tail of each .param layer line).

Forms (ncnn docs/developer-guide/param-and-model-file-structure.md, src/paramdict.cpp):

- ``0=3``            int (a token without '.', 'e' or 'E')
- ``2=1.000000e-04`` float (a token with '.', 'e' or 'E'); held rounded to float32
- ``-23304=3,1.0,2.0,3.0`` old-style array: key <= -23300 names array id ``-key - 23300``
  and the value is ``count,v1,...,vcount``; every element is typed on its own like a scalar
- ``3=0.1,0.2``      new-style array (a value with commas)
- ``4=hello``        string (a value starting with a letter or '"'); kept as str so layers
  that cannot use one report it

Ids run 0..31 (NCNN_MAX_PARAM_COUNT). Id 30 (``-23330=...``) carries ncnn's per-output shape
hints and id 31 the feature mask; layers ignore both.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable

import numpy as np

from vkserve.models.errors import ModelFormatError, Where

MAX_PARAM_COUNT = 32
ARRAY_KEY_BASE = -23300

Scalar = int | float
Value = int | float | str | list[Scalar]

_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_FLT_MAX = float(np.finfo(np.float32).max)


def is_float_token(token: str) -> bool:
    """ncnn's rule: a numeric token is a float when it holds '.', 'e' or 'E'."""
    return any(ch in token for ch in ".eE")


def to_float32(value: float) -> float:
    """Round a Python float to the nearest float32 (ncnn holds params as float)."""
    return float(np.float32(value))


def int_bits_to_float(value: int) -> float:
    """Reinterpret an int32 as the float32 with the same bits.

    ncnn stores int and float params in one union, so a layer that reads a float where the
    file wrote an int sees that int's bit pattern (yolov3 masks are written this way).
    """
    return struct.unpack("<f", struct.pack("<i", value))[0]


class ParamDict(dict[int, Value]):
    """Param id -> int | float | str | list of int/float (one Python type per element)."""


def _parse_scalar(token: str, where: Where, key: str) -> Scalar:
    if is_float_token(token):
        if not _FLOAT_RE.fullmatch(token):
            raise ModelFormatError.at(where, f"param {key}: malformed float {token!r}")
        value = float(token)
        if abs(value) > _FLT_MAX:
            raise ModelFormatError.at(where, f"param {key}: float {token!r} out of float32 range")
        return to_float32(value)
    if not _INT_RE.fullmatch(token):
        raise ModelFormatError.at(where, f"param {key}: malformed number {token!r}")
    number = int(token)
    if not _INT32_MIN <= number <= _INT32_MAX:
        raise ModelFormatError.at(where, f"param {key}: int {token!r} out of int32 range")
    return number


def _is_string_token(token: str) -> bool:
    return token[:1].isalpha() or token.startswith('"')


def parse_param_token(token: str, where: Where) -> tuple[int, Value]:
    """Parse one ``key=value`` token into (param id, value)."""
    key_text, sep, value_text = token.partition("=")
    if not sep:
        raise ModelFormatError.at(where, f"expected key=value, got {token!r}")
    if not _INT_RE.fullmatch(key_text):
        raise ModelFormatError.at(where, f"param key {key_text!r} is not an integer")
    key = int(key_text)
    old_style_array = key <= ARRAY_KEY_BASE
    pid = ARRAY_KEY_BASE - key if old_style_array else key
    if not 0 <= pid < MAX_PARAM_COUNT:
        raise ModelFormatError.at(
            where, f"param key {key}: id {pid} outside 0..{MAX_PARAM_COUNT - 1}"
        )
    if value_text == "":
        raise ModelFormatError.at(where, f"param {key}: empty value")
    if old_style_array:
        parts = value_text.split(",")
        count = _parse_scalar(parts[0], where, key_text)
        if not isinstance(count, int) or count < 0:
            raise ModelFormatError.at(
                where, f"param {key}: array length {parts[0]!r} is not a non-negative int"
            )
        if len(parts) - 1 != count:
            raise ModelFormatError.at(
                where, f"param {key}: array declares {count} elements, has {len(parts) - 1}"
            )
        return pid, [_parse_scalar(p, where, key_text) for p in parts[1:]]
    if _is_string_token(value_text):
        return pid, value_text.strip('"')
    if "," in value_text:
        return pid, [_parse_scalar(p, where, key_text) for p in value_text.split(",")]
    return pid, _parse_scalar(value_text, where, key_text)


def parse_paramdict(tokens: Iterable[str], where: Where) -> ParamDict:
    """Parse the ``key=value`` tokens of one layer line; a repeated id is an error."""
    pd = ParamDict()
    for token in tokens:
        pid, value = parse_param_token(token, where)
        if pid in pd:
            raise ModelFormatError.at(where, f"param id {pid} given twice")
        pd[pid] = value
    return pd
