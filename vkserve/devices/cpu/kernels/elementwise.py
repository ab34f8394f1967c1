"""Elementwise and reduction layers: activations, Dropout, BinaryOp, UnaryOp, Eltwise, Softmax, LRN."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.jit import elementwise as jit_elementwise
from vkserve.devices.cpu.jit import lrn as jit_lrn
from vkserve.devices.cpu.kernels.base import Kernel, StepCall, leaky_relu, register
from vkserve.devices.cpu.kernels.jitted import JitCall, JitKernel
from vkserve.models.layers import Shape, binary_broadcast_shape, positive_axis

#: multiply-adds an element of an element-wise kernel counts as, against ``jit.SMALL_WORK`` (memory-bound:
#: a 200K-element op took 0.24 ms on one core of a 16-core Xeon, the work of ~3M multiply-adds in
#: a GEMM; run on one thread, its operands also come from the other cores' caches)
ELEMENT_WORK = 8


class ElementwiseJit(JitKernel):
    """A layer run by a ``jit.elementwise`` kernel: no activation of its own (only fused ones),
    its work counted in elements (``ELEMENT_WORK``)."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.work = ELEMENT_WORK * math.prod(out[0])
        return out

    def _activation(self) -> tuple[int, tuple[float, ...]]:
        return 0, ()


class JitActivation(ElementwiseJit):
    """An activation layer its producer did not absorb: ``jit.elementwise.activation`` runs it
    as one pass (widen, the epilogue op of ``jit.epilogue``, narrow; the activations fused into
    it after), threaded over rows. ``forward`` stays numpy: it is what a numpy producer applies
    to its fp32 result when the activation is fused into it."""

    batched = True

    def _own_post(self) -> tuple[Kernel, ...]:
        return (self,)

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        rows, cols = jit_elementwise.rows_cols(out.shape, batch=out.ndim > len(self.out_shapes[0]))
        return jit_elementwise.activation, (xs[0].reshape(rows, cols), ops, jit.task_count(rows),
                                            out.reshape(rows, cols))


@register("ReLU")
class ReLU(JitActivation):
    @property
    def exact_store(self) -> bool:  # type: ignore[override]
        return self.p.slope == 0.0

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x, slope = xs[0], self.p.slope
        if slope == 0.0:
            return [np.maximum(x, 0.0, out=x)]
        return [leaky_relu(x, slope)]


@register("Clip")
class Clip(JitActivation):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.clip(xs[0], np.float32(self.p.min), np.float32(self.p.max), out=xs[0])]


def exp_neg_plus_one(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """1 + exp(-x) into ``out``."""
    np.negative(x, out=out)
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    return np.add(out, np.float32(1.0), out=out)


@register("Sigmoid")
class Sigmoid(JitActivation):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        d = exp_neg_plus_one(x, self.buf("tmp", x.shape))
        return [np.divide(np.float32(1.0), d, out=d)]


@register("Swish")
class Swish(JitActivation):
    """x / (1 + exp(-x)), ncnn's expression (one rounding fewer than x * sigmoid(x))."""

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        d = exp_neg_plus_one(x, self.buf("tmp", x.shape))
        return [np.divide(x, d, out=d)]


@register("HardSigmoid")
class HardSigmoid(JitActivation):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [hard_sigmoid_into(xs[0], self.p.alpha, self.p.beta, self.buf("tmp", xs[0].shape))]


def hard_sigmoid_into(x: np.ndarray, alpha: float, beta: float, out: np.ndarray) -> np.ndarray:
    """clip(x * alpha + beta, 0, 1) into ``out`` (in place, no temporaries)."""
    np.multiply(x, np.float32(alpha), out=out)
    np.add(out, np.float32(beta), out=out)
    np.maximum(out, np.float32(0.0), out=out)
    return np.minimum(out, np.float32(1.0), out=out)


@register("HardSwish")
class HardSwish(JitActivation):
    """x * clip(x * alpha + beta, 0, 1), in a scratch buffer (no per-run allocation)."""

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        t = hard_sigmoid_into(x, self.p.alpha, self.p.beta, self.buf("tmp", x.shape))
        return [np.multiply(x, t, out=t)]


@register("Dropout")
class Dropout(Kernel):
    batched = True

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        scale = self.p.scale
        return [xs[0] if scale == 1.0 else xs[0] * np.float32(scale)]


def _fmod(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> np.ndarray:
    """ncnn's x86 fmod: x - trunc(x / y) * y (the quotient rounded to float first)."""
    q = np.trunc(np.divide(x, y))
    return np.subtract(x, q * y, out=out)


def _remainder(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> np.ndarray:
    """ncnn's x86 remainder: x - round_half_even(x / y) * y."""
    q = np.rint(np.divide(x, y))
    return np.subtract(x, q * y, out=out)


def _floor_divide(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> np.ndarray:
    """floor(x / y) of the float quotient (numpy's floor_divide is exact, ncnn's is not)."""
    np.divide(x, y, out=out)
    return np.floor(out, out=out)


BinaryFn = Callable[..., np.ndarray]

#: op_type -> (function of (x, y, out=), operands swapped)
_BINARY: dict[int, tuple[BinaryFn, bool]] = {
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
    12: (_fmod, False),
    13: (_fmod, True),
    14: (np.logaddexp, False),
    15: (_floor_divide, False),
    16: (_floor_divide, True),
    17: (_remainder, False),
    18: (_remainder, True),
}


@dataclasses.dataclass(frozen=True)
class _JitForm:
    """How ``jit.elementwise.binary`` runs a BinaryOp or Eltwise: operands swapped (b op a), the op, the
    (rows, cols) view and ``b``'s broadcast form, Eltwise's coefficients."""

    swap: bool
    op: int
    rows: int
    cols: int
    bform: int
    ca: float = 1.0
    cb: float = 1.0


#: BinaryOp op_types ``jit.elementwise.binary`` runs with the operands as given, and with them swapped
_JIT_DIRECT = (jit_elementwise.ADD, jit_elementwise.SUB, jit_elementwise.MUL, jit_elementwise.DIV, jit_elementwise.MAX, jit_elementwise.MIN)
_JIT_SWAPPED = {**jit_elementwise.SWAPPED, 7: jit_elementwise.SUB, 8: jit_elementwise.DIV}  # rsub, rdiv


class _TwoOperands(ElementwiseJit):
    """A two-operand element-wise layer: ``jit.elementwise.binary`` (one pass, fused activations) where
    ``form`` found a way, else the numpy ``forward_numpy``."""

    form: _JitForm | None = None

    @property
    def raw_inputs(self) -> bool:  # type: ignore[override]
        return self.form is not None

    @property
    def batched(self) -> bool:  # type: ignore[override]
        """Operands of the output's shape (two blobs, or one and a parameter): a batch's
        items stack as rows. (A broadcast operand may be one blob for every item.)"""
        f = self.form
        return f is not None and (f.bform == jit_elementwise.B_FULL or (
            f.bform == jit_elementwise.B_SCALAR and len(self.in_shapes) == 1))

    def forward_numpy(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def channel_scale_operands(self) -> tuple[int, int] | None:
        f, out = self.form, self.out_shapes[0]
        if (f is None or f.op != jit_elementwise.MUL or f.bform != jit_elementwise.B_PER_ROW
                or (f.ca, f.cb) != (1.0, 1.0) or len(self.in_shapes) != 2 or len(out) != 3 or f.rows != out[0]):
            return None
        full = 1 if f.swap else 0
        if tuple(self.in_shapes[full]) != tuple(out) or math.prod(self.in_shapes[1 - full]) != out[0]:
            return None
        return full, 1 - full

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        if self.form is None:
            return self.forward_numpy(xs)
        return super().forward(xs)

    def store_call(self, us: list[np.ndarray], outs: list[np.ndarray], post: Sequence[Kernel]) -> StepCall | None:
        f = self.form
        if f is not None and f.bform == jit_elementwise.B_SCALAR and len(us) > 1:
            return None  # the one-value tensor is read as a scalar argument: each run's own
        return super().store_call(us, outs, post)

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        f = self.form
        assert f is not None
        a, b = (xs[1], xs[0]) if f.swap else (xs[0], xs[-1])
        bs = np.float32(0.0)
        if f.bform == jit_elementwise.B_SCALAR:
            if len(xs) == 1:  # with_scalar
                bs = np.float32(self.p.b)
            else:  # a one-value tensor
                one = b.reshape(-1)[:1]
                bs = np.float32((from_bf16(one) if one.dtype == np.uint16 else one)[0])
            b = a
        rows = f.rows * self.items(out)
        b_view = {jit_elementwise.B_PER_ROW: (rows, 1), jit_elementwise.B_ROW: (1, f.cols)}
        b2 = b.reshape(b_view.get(f.bform, (rows, f.cols)))
        return jit_elementwise.binary, (a.reshape(rows, f.cols), b2, f.op, f.bform, bs, np.float32(f.ca),
                                        np.float32(f.cb), ops, jit.task_count(rows), out.reshape(rows, f.cols))


@register("BinaryOp")
class BinaryOp(_TwoOperands):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        self.op = _BINARY[p.op_type]
        if p.with_scalar:
            if p.op_type in _JIT_DIRECT:
                self.form = _JitForm(False, p.op_type, *jit_elementwise.rows_cols(out[0]), jit_elementwise.B_SCALAR)
            return out
        self.a_shape, self.b_shape, _ = binary_broadcast_shape(in_shapes[0], in_shapes[1])
        direct = jit_elementwise.layout(self.a_shape, self.b_shape, out[0])
        flipped = jit_elementwise.layout(self.b_shape, self.a_shape, out[0])
        if direct is not None and p.op_type in _JIT_DIRECT:
            self.form = _JitForm(False, p.op_type, *direct)
        elif flipped is not None and p.op_type in _JIT_SWAPPED:
            self.form = _JitForm(True, _JIT_SWAPPED[p.op_type], *flipped)
        return out

    def forward_numpy(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        """One pass into this step's "out" scratch buffer (no per-run allocation)."""
        fn, swap = self.op
        y = self.buf("out", self.out_shapes[0])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.p.with_scalar:
                a, b = xs[0], np.float32(self.p.b)
            else:
                a, b = xs[0].reshape(self.a_shape), xs[1].reshape(self.b_shape)
            fn(*((b, a) if swap else (a, b)), out=y)
        return [y]


def _rsqrt(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.divide(np.float32(1.0), np.sqrt(x, out=out), out=out)


def _reciprocal(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.divide(np.float32(1.0), x, out=out)


def _square(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.multiply(x, x, out=out)


#: UnaryOp op_type -> function of (x, out=) (models.layers.UNARY_OPS names them)
_UNARY: dict[int, Callable[..., np.ndarray]] = {
    0: np.abs, 1: np.negative, 2: np.floor, 3: np.ceil, 4: _square, 5: np.sqrt, 6: _rsqrt,
    7: np.exp, 8: np.log, 9: np.sin, 10: np.cos, 11: np.tan, 12: np.arcsin, 13: np.arccos,
    14: np.arctan, 15: _reciprocal, 16: np.tanh, 17: np.log10, 18: np.rint, 19: np.trunc,
    20: np.sign, 21: np.expm1, 22: np.sinh, 23: np.arcsinh, 24: np.cosh, 25: np.arccosh,
    26: np.arctanh, 27: np.log1p,
}
#: ops whose result of a bf16 value is a bf16 value (abs neg floor ceil round trunc sign)
_EXACT_UNARY = {0, 1, 2, 3, 18, 19, 20}


@register("UnaryOp")
class UnaryOp(Kernel):
    """Into this step's "out" scratch buffer: the input may be a data-dependent blob that
    other steps still read."""

    @property
    def exact_store(self) -> bool:  # type: ignore[override]
        return self.p.op_type in _EXACT_UNARY

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        y = self.buf("out", self.out_shapes[0])
        with np.errstate(all="ignore"):
            return [_UNARY[self.p.op_type](xs[0], out=y)]


@register("Eltwise")
class Eltwise(_TwoOperands):
    #: Eltwise op_type (prod, sum, max) -> ``jit.elementwise.binary``'s op
    _JIT_OPS = {0: jit_elementwise.MUL, 1: jit_elementwise.ADD, 2: jit_elementwise.MAX}

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        op, coeffs = self.p.op_type, list(self.p.coeffs or [])
        if len(in_shapes) == 2 and in_shapes[0] == in_shapes[1] == out[0] and not (op == 1 and len(coeffs) == 1):
            ca, cb = (coeffs[0], coeffs[1]) if op == 1 and len(coeffs) >= 2 else (1.0, 1.0)
            self.form = _JitForm(False, self._JIT_OPS[op], *jit_elementwise.rows_cols(out[0]),
                                 jit_elementwise.B_FULL, ca, cb)
        return out

    def forward_numpy(self, xs: list[np.ndarray]) -> list[np.ndarray]:
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
class Softmax(ElementwiseJit):
    """``jit.elementwise.softmax`` on the Plan's path; ``forward`` stays numpy (fp32)."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        self.axis = positive_axis(self.p.axis, len(in_shapes[0]))
        return super().infer(in_shapes)

    batched = True

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        axis = self.axis + out.ndim - len(self.out_shapes[0])  # past a batch's item axis
        n, cols = out.shape[axis], math.prod(out.shape[axis + 1:])
        blocks = math.prod(out.shape[:axis])
        return jit_elementwise.softmax, (xs[0].reshape(blocks * n, cols), n, ops, jit.task_count(blocks),
                                         out.reshape(blocks * n, cols))

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        axis = self.axis + x.ndim - len(self.in_shapes[0])  # past a batch's item axis
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        e /= e.sum(axis=axis, keepdims=True)
        return [e]


@register("LRN")
class LRN(ElementwiseJit):
    """Across channels (region_type 0): ``jit.lrn`` stores it in one threaded pass, fused
    activations included. Within a channel (1), and the fp32 ``forward``: numpy."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.work *= 2 * self.p.local_size + 8  # a window of squares, a log and an exp a value
        return out

    @property
    def raw_inputs(self) -> bool:  # type: ignore[override]
        return self.p.region_type == 0

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        p = self.p
        c = self.out_shapes[0][0]
        return jit_lrn.lrn_across, (xs[0].reshape(c, -1), p.local_size // 2, np.float32(p.alpha / p.local_size),
                                    np.float32(p.bias), np.float32(-p.beta), ops, jit.task_count(c),
                                    out.reshape(c, -1))

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
