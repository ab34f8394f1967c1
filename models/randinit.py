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

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from models import layers as L

if TYPE_CHECKING:
    from models.graph import Layer

BIAS_LIMIT = 0.1
_BIAS_VAR = BIAS_LIMIT**2 / 3
_M2_FLOOR, _M2_CEIL = 1e-4, 1e4


def _activation_m2(activation_type: int, params: tuple[float, ...], m2: float) -> float:
    if activation_type in (1, 2):
        slope = params[0] if activation_type == 2 else 0.0
        return m2 * (1 + slope * slope) / 2
    if activation_type == 3:
        return min(m2 / 2 if params[0] >= 0 else m2, max(params[0] ** 2, params[1] ** 2))
    if activation_type == 4:
        return 0.25 + 0.05 * min(m2, 1.0)
    if activation_type in (5, 6):
        return 0.35 * m2
    return m2


def _binary_m2(p: L.BinaryOpParams, m2s: list[float]) -> float:
    a = m2s[0]
    b = p.b * p.b if p.with_scalar else m2s[1]
    op = L.BINARY_OPS[p.op_type]
    if op in ("add", "sub", "rsub"):
        return a + b
    if op == "mul":
        return a * b
    if op == "div":
        return a / max(b, _M2_FLOOR)
    if op == "rdiv":
        return b / max(a, _M2_FLOOR)
    if op == "max":
        return max(a, b)
    if op == "min":
        return min(a, b)
    return a


def _eltwise_m2(p: L.EltwiseParams, m2s: list[float]) -> float:
    if p.op_type == 0:
        return math.prod(m2s)
    if p.op_type == 2:
        return 1.3 * max(m2s)
    coeffs = p.coeffs or (1.0,) * len(m2s)
    return sum(c * c * m for c, m in zip(coeffs, m2s))


def _pooling_m2(p: L.PoolingParams, m2: float) -> float:
    if p.pooling_type == 0:
        return m2 * (4.0 if p.global_pooling else 2.0)
    return m2 * (0.35 if p.global_pooling else 0.5)


def _clip_m2(p: L.ClipParams, m2: float) -> float:
    return min(m2, max(p.min * p.min, p.max * p.max))


# second moment of the (first) output, from the params and the inputs' second moments
_M2_RULES: dict[type, Callable[..., float]] = {
    L.BinaryOpParams: _binary_m2,
    L.EltwiseParams: _eltwise_m2,
    L.ConcatParams: lambda p, m2s: sum(m2s) / len(m2s),
    L.PoolingParams: lambda p, m2s: _pooling_m2(p, m2s[0]),
    L.ReLUParams: lambda p, m2s: m2s[0] * (1 + p.slope * p.slope) / 2,
    L.ClipParams: lambda p, m2s: _clip_m2(p, m2s[0]),
    L.SigmoidParams: lambda p, m2s: 0.25 + 0.05 * min(m2s[0], 1.0),
    L.HardSigmoidParams: lambda p, m2s: 0.25 + 0.05 * min(m2s[0], 1.0),
    L.SwishParams: lambda p, m2s: 0.35 * m2s[0],
    L.HardSwishParams: lambda p, m2s: 0.35 * m2s[0],
    L.SoftmaxParams: lambda p, m2s: 0.01,
}


def _uniform(rng: np.random.Generator, count: int, limit: float) -> np.ndarray:
    return rng.uniform(-limit, limit, count).astype(np.float32)


def random_weights(layers: Sequence[Layer], seed: int = 0) -> list[list[np.ndarray]]:
    """Weights for every layer (same structure as ``Layer.weights``), float32, flat."""
    rng = np.random.default_rng(seed)
    m2: dict[str, float] = {}
    result: list[list[np.ndarray]] = []
    for layer in layers:
        p = layer.params
        m2_in = [m2.get(b, 1.0) for b in layer.inputs]
        weights: list[np.ndarray] = []
        if isinstance(p, (L.ConvolutionParams, L.ConvolutionDepthWiseParams, L.InnerProductParams)):
            fan_in = max(p.weight_data_size // p.num_output, 1)
            bias_var = _BIAS_VAR if p.bias_term else 0.0
            std = math.sqrt((1.0 - bias_var) / (fan_in * m2_in[0]))
            weights.append(_uniform(rng, p.weight_data_size, std * math.sqrt(3.0)))
            if p.bias_term:
                weights.append(_uniform(rng, p.num_output, BIAS_LIMIT))
            out = _activation_m2(p.activation_type, p.activation_params, 1.0)
        else:
            weights = [_uniform(rng, spec.count, 1.0) for spec in p.weight_specs()]
            rule = _M2_RULES.get(type(p))
            out = rule(p, m2_in) if rule else (m2_in[0] if m2_in else 1.0)
        out = min(max(out, _M2_FLOOR), _M2_CEIL)
        for i, blob in enumerate(layer.outputs):
            # Noop passes input i through as output i
            m2[blob] = m2_in[i] if isinstance(p, L.NoopParams) else out
        result.append(weights)
    return result
