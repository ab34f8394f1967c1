"""Activations and element-wise math layers: TanH, AbsVal, ELU, SELU, Mish, Softplus, GELU,
Exp, Log, Power, Erf, Threshold, PReLU (ncnn's expressions, in fp32)."""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.kernels.base import Kernel, register
from vkserve.devices.cpu.kernels.elementwise import JitActivation

_F = np.float32


def erf(x: np.ndarray) -> np.ndarray:
    """erf to about 1e-7 absolute (Abramowitz & Stegun 7.1.26), computed in float64."""
    z = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                         + t * 1.061405429))))
    y = 1.0 - poly * np.exp(-z * z)
    return (np.sign(x) * y).astype(_F)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(exp(x) + 1) without overflow for large x."""
    return (np.maximum(x, _F(0)) + np.log1p(np.exp(-np.abs(x)))).astype(_F)


class _Elementwise(Kernel):
    batched = True  # value by value (PReLU's per-channel slopes line up with the trailing axes)

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return [np.asarray(self.f(xs[0].astype(_F, copy=False)), dtype=_F)]

    def f(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@register("TanH")
class TanH(_Elementwise):
    def f(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x)


@register("AbsVal")
class AbsVal(_Elementwise):
    exact_store = True

    def f(self, x: np.ndarray) -> np.ndarray:
        return np.abs(x)


@register("ELU")
class ELU(_Elementwise):
    def f(self, x: np.ndarray) -> np.ndarray:
        return np.where(x < 0, _F(self.p.alpha) * np.expm1(x), x)


@register("SELU")
class SELU(_Elementwise):
    def f(self, x: np.ndarray) -> np.ndarray:
        lam = _F(self.p.lambda_)
        return np.where(x < 0, np.expm1(x) * (_F(self.p.alpha) * lam), x * lam)


@register("Mish")
class Mish(_Elementwise):
    def f(self, x: np.ndarray) -> np.ndarray:
        return x * np.tanh(softplus(x))


@register("Softplus")
class Softplus(_Elementwise):
    """ncnn's log(exp(x) + 1) as written: inf once exp overflows (x > ~88.7)."""

    def f(self, x: np.ndarray) -> np.ndarray:
        return np.log(np.exp(x) + _F(1))


@register("GELU")
class GELU(JitActivation):
    """One compiled pass on the Plan's path (``jit.epilogue.gelu_f32``; the tanh form as
    x * sigmoid(2u)); ``forward`` stays numpy (fp32): convnext_tiny's 18 GELUs took 79 ms of its
    175 on one core of the 2-core VM that way."""

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0].astype(_F, copy=False)
        with np.errstate(all="ignore"):
            if self.p.fast_gelu:
                inner = _F(0.79788452) * (x + _F(0.044715) * x * x * x)
                return [_F(0.5) * x * (_F(1) + np.tanh(inner))]
            return [_F(0.5) * x * (_F(1) + erf(x * _F(0.70710678)))]


def _argument(p: object, x: np.ndarray) -> np.ndarray:
    return _F(p.shift) + x * _F(p.scale)  # type: ignore[attr-defined]


@register("Exp")
class Exp(_Elementwise):
    def f(self, x: np.ndarray) -> np.ndarray:
        a = _argument(self.p, x)
        return np.exp(a) if self.p.base == -1.0 else np.power(_F(self.p.base), a)  # powf


@register("Log")
class Log(_Elementwise):
    def f(self, x: np.ndarray) -> np.ndarray:
        y = np.log(_argument(self.p, x))
        return y if self.p.base == -1.0 else y / _F(np.log(_F(self.p.base)))


@register("Power")
class Power(_Elementwise):
    def f(self, x: np.ndarray) -> np.ndarray:
        return np.power(_argument(self.p, x), _F(self.p.power))


@register("Erf")
class Erf(_Elementwise):
    def f(self, x: np.ndarray) -> np.ndarray:
        return erf(x)


@register("Threshold")
class Threshold(_Elementwise):
    exact_store = True

    def f(self, x: np.ndarray) -> np.ndarray:
        return (x > _F(self.p.threshold)).astype(_F)


@register("PReLU")
class PReLU(_Elementwise):
    """Slopes stay fp32 (one per channel, like a bias)."""

    def infer(self, in_shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        out = super().infer(in_shapes)
        slopes = self.fp32_bias(0)
        shape = in_shapes[0]
        if self.p.num_slope > 1:
            self.slope = slopes.reshape((shape[0],) + (1,) * (len(shape) - 1))
        else:
            self.slope = slopes[:1].reshape(())
        return out

    def f(self, x: np.ndarray) -> np.ndarray:
        return np.where(x < 0, x * self.slope, x)
