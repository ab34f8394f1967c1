"""Elementwise and reduction layers: activations, Dropout, BinaryOp, Eltwise, Softmax, LRN."""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.kernels.base import (
    Kernel,
    Shape,
    UnsupportedError,
    leaky_relu,
    register,
)


class Unary(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        return [in_shapes[0]]


@register("ReLU")
class ReLU(Unary):
    @property
    def exact_store(self) -> bool:  # type: ignore[override]
        return self.p.slope == 0.0

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x, slope = xs[0], self.p.slope
        if slope == 0.0:
            return [np.maximum(x, 0.0, out=x)]
        return [leaky_relu(x, slope)]


@register("Clip")
class Clip(Unary):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.clip(xs[0], np.float32(self.p.min), np.float32(self.p.max), out=xs[0])]


def exp_neg_plus_one(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """1 + exp(-x) into ``out``."""
    np.negative(x, out=out)
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    return np.add(out, np.float32(1.0), out=out)


@register("Sigmoid")
class Sigmoid(Unary):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        d = exp_neg_plus_one(x, self.buf("tmp", x.shape))
        return [np.divide(np.float32(1.0), d, out=d)]


@register("Swish")
class Swish(Unary):
    """x / (1 + exp(-x)), ncnn's expression (one rounding fewer than x * sigmoid(x))."""

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        d = exp_neg_plus_one(x, self.buf("tmp", x.shape))
        return [np.divide(x, d, out=d)]


@register("HardSigmoid")
class HardSigmoid(Unary):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [hard_sigmoid_into(xs[0], self.p.alpha, self.p.beta, self.buf("tmp", xs[0].shape))]


def hard_sigmoid_into(x: np.ndarray, alpha: float, beta: float, out: np.ndarray) -> np.ndarray:
    """clip(x * alpha + beta, 0, 1) into ``out`` (in place, no temporaries)."""
    np.multiply(x, np.float32(alpha), out=out)
    np.add(out, np.float32(beta), out=out)
    np.maximum(out, np.float32(0.0), out=out)
    return np.minimum(out, np.float32(1.0), out=out)


@register("HardSwish")
class HardSwish(Unary):
    """x * clip(x * alpha + beta, 0, 1), in a scratch buffer (no per-run allocation)."""

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        t = hard_sigmoid_into(x, self.p.alpha, self.p.beta, self.buf("tmp", x.shape))
        return [np.multiply(x, t, out=t)]


@register("Dropout")
class Dropout(Unary):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        scale = self.p.scale
        return [xs[0] if scale == 1.0 else xs[0] * np.float32(scale)]


#: op_type -> (ufunc, operands swapped)
_BINARY = {
    0: (np.add, False),
    1: (np.subtract, False),
    2: (np.multiply, False),
    3: (np.divide, False),
    4: (np.maximum, False),
    5: (np.minimum, False),
    6: (np.power, False),
    7: (np.subtract, True),
    8: (np.divide, True),
    9: (np.power, True),
    10: (np.arctan2, False),
    11: (np.arctan2, True),
}


def expand_for_binary(shape: Shape, other: Shape, outdims: int) -> Shape:
    """ncnn's BinaryOp rule for the lower-rank operand ("expand inner axes").

    Shapes are numpy-ordered ncnn shapes: (w,), (h, w), (c, h, w), (c, d, h, w).
    A 1-D operand lines up with the other's outermost axis when the lengths match
    (channels for 3-D/4-D, rows for 2-D), else with its innermost (w); a 2-D (h, w)
    lines up as (c=h, h=w) against 3-D and as (c=h, d=w) against 4-D; a 3-D (c, h, w)
    as (c, d=h, h=w) against 4-D.
    """
    n = len(shape)
    if n == outdims:
        return shape
    if n == 1:
        if shape[0] == other[0]:
            return shape + (1,) * (outdims - 1)
        return (1,) * (outdims - 1) + shape
    return shape + (1,) * (outdims - n)


@register("BinaryOp")
class BinaryOp(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        if p.op_type not in _BINARY:
            raise UnsupportedError(f"op_type={p.op_type}")
        self.op = _BINARY[p.op_type]
        if p.with_scalar:
            return [in_shapes[0]]
        a, b = in_shapes[0], in_shapes[1]
        outdims = max(len(a), len(b))
        self.a_shape = expand_for_binary(a, b, outdims)
        self.b_shape = expand_for_binary(b, a, outdims)
        try:
            out = np.broadcast_shapes(self.a_shape, self.b_shape)
        except ValueError as e:
            raise UnsupportedError(f"shapes {a} and {b} do not broadcast") from e
        return [tuple(int(v) for v in out)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        """One ufunc pass into this step's "out" scratch buffer (no per-run allocation)."""
        ufunc, swap = self.op
        y = self.buf("out", self.out_shapes[0])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.p.with_scalar:
                a, b = xs[0], np.float32(self.p.b)
            else:
                a, b = xs[0].reshape(self.a_shape), xs[1].reshape(self.b_shape)
            ufunc(*((b, a) if swap else (a, b)), out=y)
        return [y]


@register("Eltwise")
class Eltwise(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        if self.p.op_type not in (0, 1, 2):
            raise UnsupportedError(f"op_type={self.p.op_type}")
        if any(s != in_shapes[0] for s in in_shapes):
            raise UnsupportedError(f"inputs differ in shape: {in_shapes}")
        return [in_shapes[0]]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        op, coeffs = self.p.op_type, list(self.p.coeffs or [])
        y = self.buf("out", self.out_shapes[0])
        if op == 1 and coeffs:
            np.multiply(xs[0], np.float32(coeffs[0]), out=y)
            for x, k in zip(xs[1:], coeffs[1:]):
                y += np.float32(k) * x
            return [y]
        ufunc = {0: np.multiply, 1: np.add, 2: np.maximum}[op]
        if len(xs) == 1:
            np.copyto(y, xs[0])
            return [y]
        ufunc(xs[0], xs[1], out=y)
        for x in xs[2:]:
            ufunc(y, x, out=y)
        return [y]


@register("Softmax")
class Softmax(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        shape = in_shapes[0]
        axis = self.p.axis
        if not self.p.fixbug0 and axis != 0:
            # ncnn refuses these params ("param is too old, please regenerate")
            raise UnsupportedError(f"axis={axis} without fixbug0=1 (old converter output)")
        self.axis = axis + len(shape) if axis < 0 else axis
        if not 0 <= self.axis < len(shape):
            raise UnsupportedError(f"axis={axis} for a {len(shape)}-D input")
        return [shape]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        e = np.exp(x - x.max(axis=self.axis, keepdims=True))
        e /= e.sum(axis=self.axis, keepdims=True)
        return [e]


@register("LRN")
class LRN(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        if len(in_shapes[0]) != 3:
            raise UnsupportedError(f"input of {len(in_shapes[0])} dims (need c,h,w)")
        if self.p.region_type not in (0, 1):
            raise UnsupportedError(f"region_type={self.p.region_type}")
        return [in_shapes[0]]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        x = xs[0]
        c, h, w = x.shape
        n = p.local_size
        half = n // 2
        sq = x * x
        if p.region_type == 0:
            # window [q - n/2, q + n/2] over channels, out-of-range channels count as 0
            csum = np.zeros((c + 2 * half + 1, h, w), dtype=np.float32)
            np.cumsum(np.pad(sq, ((half, half), (0, 0), (0, 0))), axis=0, out=csum[1:])
            total = csum[2 * half + 1 :] - csum[: c]
            scale = np.float32(p.alpha / n)
        else:
            # n x n spatial window, zero border of n/2 before and n - n/2 - 1 after
            padded = np.pad(sq, ((0, 0), (half, n - half - 1), (half, n - half - 1)))
            ii = np.zeros((c, h + n, w + n), dtype=np.float32)
            ii[:, 1:, 1:] = padded.cumsum(axis=1).cumsum(axis=2)
            total = ii[:, n:, n:] - ii[:, :h, n:] - ii[:, n:, :w] + ii[:, :h, :w]
            scale = np.float32(p.alpha / (n * n))
        return [x * np.power(np.float32(p.bias) + scale * total, np.float32(-p.beta))]
