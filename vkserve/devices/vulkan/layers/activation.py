"""Vulkan layers for the activation / element-wise math layers: TanH, AbsVal, ELU, SELU, Mish,
Softplus, GELU, Exp, Log, Power, Erf, Threshold (one activation.comp dispatch, the op a
specialization constant) and PReLU (prelu.comp, slopes in a weight buffer).

Like unaryop.comp they work on vec4s of the padded blob and read element i only to write
element i, so the output may take over the bytes of a dying input.
"""

from __future__ import annotations

import math

import numpy as np

from vkserve.devices.vulkan.layers.base import Dispatch, VulkanLayer, register
from vkserve.devices.vulkan.layers.shape import LOCAL, linear_grid

# activation.comp's op codes
(OP_TANH, OP_ABSVAL, OP_ELU, OP_SELU, OP_MISH, OP_SOFTPLUS, OP_GELU_ERF, OP_GELU_TANH, OP_EXP,
 OP_LOG, OP_POWER, OP_ERF, OP_THRESHOLD) = range(13)


def _vec4_count(n: int) -> int:
    return -(-n // 4)


class _Activation(VulkanLayer):
    """One activation.comp dispatch from input 0 to output 0."""

    inplace_inputs = (0,)

    def op(self) -> tuple[int, float, float, float]:
        """(op code, parameters a, b, c)."""
        raise NotImplementedError

    def dispatches(self) -> list[Dispatch]:
        op, a, b, c = self.op()
        n4 = _vec4_count(math.prod(self.in_shapes[0]))
        return [Dispatch("activation", (self.layer.inputs[0], self.layer.outputs[0]),
                         linear_grid(n4), push_constants=(n4, float(a), float(b), float(c)),
                         spec_constants=(op,), local_size=LOCAL)]


@register("TanH")
class TanH(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        return OP_TANH, 0.0, 0.0, 0.0


@register("AbsVal")
class AbsVal(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        return OP_ABSVAL, 0.0, 0.0, 0.0


@register("ELU")
class ELU(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        return OP_ELU, self.params.alpha, 0.0, 0.0


@register("SELU")
class SELU(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        p = self.params
        alpha_lambda = float(np.float32(p.alpha) * np.float32(p.lambda_))
        return OP_SELU, alpha_lambda, p.lambda_, 0.0


@register("Mish")
class Mish(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        return OP_MISH, 0.0, 0.0, 0.0


@register("Softplus")
class Softplus(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        return OP_SOFTPLUS, 0.0, 0.0, 0.0


@register("GELU")
class GELU(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        return (OP_GELU_TANH if self.params.fast_gelu else OP_GELU_ERF), 0.0, 0.0, 0.0


@register("Exp")
class Exp(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        p = self.params
        return OP_EXP, p.base, p.scale, p.shift


@register("Log")
class Log(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        p = self.params
        return OP_LOG, p.base, p.scale, p.shift


@register("Power")
class Power(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        p = self.params
        return OP_POWER, p.power, p.scale, p.shift


@register("Erf")
class Erf(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        return OP_ERF, 0.0, 0.0, 0.0


@register("Threshold")
class Threshold(_Activation):
    def op(self) -> tuple[int, float, float, float]:
        return OP_THRESHOLD, self.params.threshold, 0.0, 0.0


@register("PReLU")
class PReLU(VulkanLayer):
    """Per-channel (channel axis first) or single slope; see prelu.comp."""

    inplace_inputs = (0,)

    def weights(self) -> dict[str, np.ndarray]:
        return {"slope": np.asarray(self.layer.weights[0], dtype=np.float32).ravel()}

    def dispatches(self) -> list[Dispatch]:
        shape = self.in_shapes[0]
        n4 = _vec4_count(math.prod(shape))
        inner = math.prod(shape[1:])
        return [Dispatch("prelu", (self.layer.inputs[0], self.layer.outputs[0], "w:slope"),
                         linear_grid(n4), push_constants=(n4, inner, self.params.num_slope),
                         local_size=LOCAL)]
