"""ncnn's shape expressions (src/expression.cpp): a comma-separated list of prefix-notation
expressions, e.g. Reshape's ``6="0w,-1"`` or ``6="//(0c,2),*(0h,2),0w"``.

Tokens are separated by ``(``, ``)`` and ``,`` (the brackets only group for the reader):

- ``<i><w|h|d|c|n>`` (two characters): dimension of input blob ``i`` (0..9) as ncnn's Mat
  w, h, d, c (absent axes are 1); ``n`` is the batch, 1 here;
- a number: an int when it reads as one (``3``, ``-1``), else a float32 (``2.5``);
- operators, evaluated right to left on a stack, so each takes the values that follow it:
  binary ``+ - * //`` ``max min`` (int when both are ints, else float32; ``//`` floors
  floats and truncates ints), ``/ atan2 fmod pow remainder logaddexp`` (always float32),
  ``and or xor lshift rshift`` (ints); unary ``abs neg sign square`` (keep the type),
  ``trunc ceil floor round`` (to int), ``acos ... tanh`` (float32 functions).

What stays on the stack is the list, first value first; floats are truncated to ints.
Parsing (``parse``) checks the tokens and that every operator has its operands, so a bad
expression is refused when the model loads; ``evaluate`` computes the list for given input
shapes (ncnn (w, h, d, c) per input).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

_BLOB_RE = re.compile(r"[0-9][whdcn]")
_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")

_ARITH = ("+", "-", "*", "//", "max", "min")
_FLOAT_BINARY = ("/", "atan2", "fmod", "pow", "remainder", "logaddexp")
_BITWISE = ("and", "or", "xor", "lshift", "rshift")
_KEEP_UNARY = ("abs", "neg", "sign", "square")
_ROUND_UNARY = ("trunc", "ceil", "floor", "round")
_FLOAT_UNARY: dict[str, Callable[[float], float]] = {
    "acos": math.acos, "acosh": math.acosh, "asin": math.asin, "asinh": math.asinh,
    "atan": math.atan, "atanh": math.atanh, "cos": math.cos, "cosh": math.cosh,
    "erf": math.erf, "exp": math.exp, "log": math.log, "log10": math.log10,
    "reciprocal": lambda a: 1.0 / a, "rsqrt": lambda a: 1.0 / math.sqrt(a), "sin": math.sin,
    "sinh": math.sinh, "sqrt": math.sqrt, "tan": math.tan, "tanh": math.tanh,
}
_BINARY = set(_ARITH) | set(_FLOAT_BINARY) | set(_BITWISE)
_UNARY = set(_KEEP_UNARY) | set(_ROUND_UNARY) | set(_FLOAT_UNARY)

Value = int | np.float32


class ExpressionError(ValueError):
    """A shape expression that cannot be parsed or evaluated (the caller adds file/line)."""


def tokenize(expr: str) -> list[str]:
    return [t for t in re.split(r"[(),]", expr) if t]


def _literal(token: str) -> Value | None:
    if _INT_RE.fullmatch(token):
        return int(token)
    if _FLOAT_RE.fullmatch(token):
        f = np.float32(float(token))
        return int(f) if float(f).is_integer() and abs(f) < 2**31 else f
    return None


class ShapeExpression:
    """A parsed expression: ``len(self)`` values, reading ``blob_count`` input blobs."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        if not self.tokens:
            raise ExpressionError(f"empty shape expression {text!r}")
        self.blob_count = 0
        depth = 0
        for t in reversed(self.tokens):
            if _BLOB_RE.fullmatch(t):
                self.blob_count = max(self.blob_count, int(t[0]) + 1)
                depth += 1
            elif t in _BINARY or t in _UNARY:
                need = 2 if t in _BINARY else 1
                if depth < need:
                    raise ExpressionError(
                        f"shape expression {text!r}: operator {t!r} lacks operands")
                depth -= need - 1
            elif _literal(t) is not None:
                depth += 1
            else:
                raise ExpressionError(f"shape expression {text!r}: unknown token {t!r}")
        self.count = depth

    def __len__(self) -> int:
        return self.count

    def evaluate(self, blobs: Sequence[tuple[int, int, int, int]]) -> list[int]:
        """The list for inputs of ncnn dims ``blobs[i] = (w, h, d, c)``."""
        if len(blobs) < self.blob_count:
            raise ExpressionError(f"shape expression {self.text!r} reads input "
                                  f"{self.blob_count - 1}, the layer has {len(blobs)}")
        stack: list[Value] = []
        with np.errstate(all="ignore"):
            for t in reversed(self.tokens):
                if _BLOB_RE.fullmatch(t):
                    w, h, d, c = blobs[int(t[0])]
                    stack.append({"w": w, "h": h, "d": d, "c": c, "n": 1}[t[1]])
                elif t in _BINARY:
                    a, b = stack.pop(), stack.pop()
                    stack.append(self._binary(t, a, b))
                elif t in _UNARY:
                    stack.append(self._unary(t, stack.pop()))
                else:
                    value = _literal(t)
                    assert value is not None
                    stack.append(value)
        out = []
        for v in reversed(stack):
            if isinstance(v, np.float32):
                if not np.isfinite(v) or abs(float(v)) >= 2**31:
                    raise ExpressionError(f"shape expression {self.text!r} gives {float(v)}")
                v = int(v)  # trunc, as ncnn's to_int
            out.append(int(v))
        return out

    def _binary(self, t: str, a: Value, b: Value) -> Value:
        both_int = isinstance(a, int) and isinstance(b, int)
        if t in _BITWISE:
            if not both_int:
                raise ExpressionError(f"shape expression {self.text!r}: {t} of a float")
            ai, bi = int(a), int(b)
            if t in ("lshift", "rshift") and not 0 <= bi < 32:
                raise ExpressionError(f"shape expression {self.text!r}: {t} by {bi}")
            return {"and": ai & bi, "or": ai | bi, "xor": ai ^ bi,
                    "lshift": ai << bi, "rshift": ai >> bi}[t]
        if t in _ARITH and both_int:
            ai, bi = int(a), int(b)
            if t == "//":
                if bi == 0:
                    raise ExpressionError(f"shape expression {self.text!r}: divide by zero")
                q = abs(ai) // abs(bi)  # C division truncates toward zero
                return q if (ai >= 0) == (bi > 0) else -q
            return {"+": ai + bi, "-": ai - bi, "*": ai * bi,
                    "max": max(ai, bi), "min": min(ai, bi)}[t]
        fa, fb = np.float32(a), np.float32(b)
        if t == "+":
            return np.float32(fa + fb)
        if t == "-":
            return np.float32(fa - fb)
        if t == "*":
            return np.float32(fa * fb)
        if t == "//":
            return np.float32(np.floor(fa / fb))
        if t == "max":
            return np.float32(max(fa, fb))
        if t == "min":
            return np.float32(min(fa, fb))
        if t == "/":
            return np.float32(fa / fb)
        if t == "atan2":
            return np.float32(np.arctan2(fa, fb))
        if t == "fmod":
            return np.float32(np.fmod(fa, fb))
        if t == "pow":
            return np.float32(np.power(fa, fb))
        if t == "remainder":
            r = np.float32(np.fmod(fa, fb))
            return np.float32(r + fb) if fa * fb < 0 else r
        return np.float32(np.log(np.exp(fa) + np.exp(fb)))  # logaddexp

    def _unary(self, t: str, a: Value) -> Value:
        if t in _KEEP_UNARY:
            if isinstance(a, int):
                return {"abs": abs(a), "neg": -a, "sign": (a > 0) - (a < 0), "square": a * a}[t]
            return np.float32({"abs": abs(a), "neg": -a, "sign": np.sign(a),
                               "square": a * a}[t])
        if t in _ROUND_UNARY:
            if isinstance(a, int):
                return a
            if not np.isfinite(a):
                raise ExpressionError(f"shape expression {self.text!r}: {t} of {float(a)}")
            f = float(a)
            if t == "round":  # C round: half away from zero
                return math.floor(abs(f) + 0.5) * (1 if f >= 0 else -1)
            return {"trunc": int(f), "ceil": math.ceil(f), "floor": math.floor(f)}[t]
        try:
            return np.float32(_FLOAT_UNARY[t](float(np.float32(a))))
        except (ValueError, OverflowError, ZeroDivisionError):
            return np.float32(np.nan)


def parse(text: str) -> ShapeExpression:
    """Parse ``text`` (ExpressionError naming the problem when it is malformed)."""
    return ShapeExpression(text)
