"""Seeded random weights whose magnitudes keep activations near unit scale in deep nets.

Walking the graph in order, we track a rough estimate of each blob's second moment E[x^2]
(assuming unit-scale model inputs) and scale each Convolution / InnerProduct so its
pre-activation output has E[x^2] ~ 1: weights uniform with variance (1 - bias var) /
(fan_in * E[x_in^2]), biases uniform in [-0.1, 0.1]. Residual adds, SE multiplications and
pooling therefore neither blow up nor vanish, so final logits keep a spread of O(1).

The generator is ``np.random.default_rng(seed)``, consumed layer by layer in file order and
weight by weight in ncnn load order; ``load_model(param, None, seed=s)`` and
``write_random_bin(param, bin, seed=s)`` therefore give the same float32 numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

import vkserve.models.layers as L


class Layer(Protocol):
    """What `random_weights` reads of a layer (vkserve.models.graph's Layer, which imports
    this module)."""

    params: L.LayerParams
    inputs: list[str]
    outputs: list[str]

BIAS_LIMIT = 0.1
_BIAS_VAR = BIAS_LIMIT**2 / 3
_M2_FLOOR, _M2_CEIL = 1e-4, 1e4


@dataclasses.dataclass(frozen=True)
class _Moment:
    """E[x^2] of a blob split into a sign-symmetric part and a non-negative part (ReLU keeps
    all of the latter and half of the former)."""

    sym: float
    pos: float

    @property
    def total(self) -> float:
        return self.sym + self.pos

    def scaled(self, k: float) -> _Moment:
        return _Moment(self.sym * k, self.pos * k)

    def relu(self, slope: float = 0.0) -> _Moment:
        return _Moment(0.0, self.pos + self.sym * (1 + slope * slope) / 2)

    def clipped(self, lo: float, hi: float) -> _Moment:
        base = self.relu() if lo >= 0 else self
        return base.scaled(min(1.0, max(lo * lo, hi * hi) / max(base.total, _M2_FLOOR)))


_UNIT = _Moment(1.0, 0.0)
_SQUASHED = _Moment(0.0, 0.3)  # sigmoid-like outputs in (0, 1)


def _swish(m: _Moment) -> _Moment:
    return _Moment(0.0, 0.35 * m.total)


def _activation(activation_type: int, params: tuple[float, ...], m: _Moment) -> _Moment:
    if activation_type == 1:
        return m.relu()
    if activation_type == 2:
        return m.relu(params[0])
    if activation_type == 3:
        return m.clipped(params[0], params[1])
    if activation_type == 4:
        return _SQUASHED
    if activation_type in (5, 6):
        return _swish(m)
    return m


def _product(ms: list[_Moment]) -> _Moment:
    total = math.prod(m.total for m in ms)
    return _Moment(0.0, total) if all(m.sym == 0 for m in ms) else _Moment(total, 0.0)


def _binary(p: L.BinaryOpParams, ms: list[_Moment]) -> _Moment:
    a = ms[0]
    b = _Moment(0.0, p.b * p.b) if p.with_scalar else ms[1]
    op = L.BINARY_OPS[p.op_type]
    if op in ("add", "sub", "rsub"):
        return _Moment(a.sym + b.sym, a.pos + b.pos)
    if op == "mul":
        return _product([a, b])
    if op == "div":
        return a.scaled(1 / max(b.total, _M2_FLOOR))
    if op == "rdiv":
        return b.scaled(1 / max(a.total, _M2_FLOOR))
    if op in ("max", "min"):
        return a if (a.total >= b.total) == (op == "max") else b
    return a


def _eltwise(p: L.EltwiseParams, ms: list[_Moment]) -> _Moment:
    if p.op_type == 0:
        return _product(ms)
    if p.op_type == 2:
        return max(ms, key=lambda m: m.total).scaled(1.3)
    coeffs = p.coeffs or (1.0,) * len(ms)
    return _Moment(sum(c * c * m.sym for c, m in zip(coeffs, ms)),
                   sum(c * c * m.pos for c, m in zip(coeffs, ms)))


def _pooling(p: L.PoolingParams, m: _Moment) -> _Moment:
    if p.pooling_type == 0:
        return m.scaled(3.0 if p.global_pooling else 2.5)
    # averaging keeps the (shared) mean of non-negative maps, shrinks the symmetric part
    if p.global_pooling:
        return _Moment(0.1 * m.sym, 0.8 * m.pos)
    return _Moment(0.5 * m.sym, 0.9 * m.pos)


def _concat(ms: list[_Moment]) -> _Moment:
    return _Moment(sum(m.sym for m in ms) / len(ms), sum(m.pos for m in ms) / len(ms))


# moment of the (first) output from the params and the inputs' moments; others pass input 0
_RULES: dict[type, Callable[[Any, list[_Moment]], _Moment]] = {
    L.BinaryOpParams: _binary,
    L.EltwiseParams: _eltwise,
    L.ConcatParams: lambda p, ms: _concat(ms),
    L.PoolingParams: lambda p, ms: _pooling(p, ms[0]),
    L.ReLUParams: lambda p, ms: ms[0].relu(p.slope),
    L.ClipParams: lambda p, ms: ms[0].clipped(p.min, p.max),
    L.SigmoidParams: lambda p, ms: _SQUASHED,
    L.HardSigmoidParams: lambda p, ms: _SQUASHED,
    L.SwishParams: lambda p, ms: _swish(ms[0]),
    L.HardSwishParams: lambda p, ms: _swish(ms[0]),
    L.SoftmaxParams: lambda p, ms: _Moment(0.0, 0.01),
    # normalisations: unit-scale runs (gamma, beta uniform in [-1, 1] keep it O(1))
    L.LayerNormParams: lambda p, ms: _UNIT,
    L.RMSNormParams: lambda p, ms: _UNIT,
    L.GroupNormParams: lambda p, ms: _UNIT,
    L.InstanceNormParams: lambda p, ms: _UNIT,
}


def _uniform(rng: np.random.Generator, count: int, limit: float) -> np.ndarray:
    return rng.uniform(-limit, limit, count).astype(np.float32)


def random_weights(layers: Sequence[Layer], seed: int = 0) -> list[list[np.ndarray]]:
    """Weights for every layer (same structure as ``Layer.weights``), float32, flat."""
    rng = np.random.default_rng(seed)
    moments: dict[str, _Moment] = {}
    result: list[list[np.ndarray]] = []
    for layer in layers:
        p = layer.params
        ins = [moments.get(b, _UNIT) for b in layer.inputs]
        weights: list[np.ndarray] = []
        if isinstance(p, (L.ConvolutionParams, L.ConvolutionDepthWiseParams, L.InnerProductParams,
                          L.DeconvolutionParams, L.DeconvolutionDepthWiseParams)):
            fan_in = max(p.weight_data_size // p.num_output, 1)
            bias_var = _BIAS_VAR if p.bias_term else 0.0
            std = math.sqrt((1.0 - bias_var) / (fan_in * ins[0].total))
            weights.append(_uniform(rng, p.weight_data_size, std * math.sqrt(3.0)))
            if p.bias_term:
                weights.append(_uniform(rng, p.num_output, BIAS_LIMIT))
            out = _activation(p.activation_type, p.activation_params, _UNIT)
        elif isinstance(p, L.GemmParams) and p.constantB and not p.constantA:
            # a Linear layer as pnnx writes it: B scaled as InnerProduct's weights, C a bias
            bias_var = _BIAS_VAR if p.has_constant_c() else 0.0
            std = math.sqrt((1.0 - bias_var) / (max(p.constantK, 1) * ins[0].total))
            weights.append(_uniform(rng, p.constantN * p.constantK, std * math.sqrt(3.0)))
            if p.has_constant_c():
                weights.append(_uniform(rng, p.c_count(), BIAS_LIMIT))
            out = _UNIT
        elif isinstance(p, L.MultiHeadAttentionParams):
            # each projection scaled as a Linear's (unit-scale q / k keep the softmax soft);
            # the mixed values are averages of unit-scale v rows
            q, k, v, _mask = p.roles(len(ins))
            fans = ((p.qdim(), ins[q].total), (p.kdim, ins[k].total), (p.vdim, ins[v].total),
                    (p.embed_dim, 1.0))
            for spec, (fan_in, m2) in zip(p.weight_specs()[::2], fans):
                std = math.sqrt((1.0 - _BIAS_VAR) / (fan_in * m2))
                weights += [_uniform(rng, spec.count, std * math.sqrt(3.0)),
                            _uniform(rng, spec.count // fan_in, BIAS_LIMIT)]
            out = _UNIT
        else:
            weights = [_uniform(rng, spec.count, 1.0) for spec in p.weight_specs()]
            if isinstance(p, L.BatchNormParams):
                weights[2] = np.abs(weights[2]) + np.float32(0.25)  # var_data: positive
            rule = _RULES.get(type(p))
            out = rule(p, ins) if rule else (ins[0] if ins else _UNIT)
        out = out.scaled(min(max(out.total, _M2_FLOOR), _M2_CEIL) / max(out.total, 1e-30))
        for i, blob in enumerate(layer.outputs):
            # Noop passes input i through as output i
            moments[blob] = ins[i] if isinstance(p, L.NoopParams) else out
        result.append(weights)
    return result
