"""Vulkan layers for activations, Dropout, UnaryOp, BinaryOp and Eltwise.

Elementwise shaders work on vec4s: the executor pads every blob to a whole number of vec4
elements, so a blob of n elements takes ceil(n / 4) invocations and the padding lanes compute
garbage that nothing reads. They are written out of place but read element i only to write
element i, so they declare `inplace_inputs` and the executor lets the output take over the
bytes of an input that dies here.
"""

from __future__ import annotations

import math

from vkserve.devices.vulkan.layers.base import Dispatch, Shape, VulkanLayer, register
from vkserve.devices.vulkan.layers.shape import LOCAL, contiguous_strides, linear_grid, pad4
from vkserve.models.layers import binary_broadcast_shape

# unaryop.comp's op codes; UnaryOp's op_type t is UNARY_BASE + t
RELU, CLIP, SIGMOID, SWISH, HARDSIGMOID, HARDSWISH, SCALE, UNARY_BASE = range(8)


def vec4_count(shape: Shape) -> int:
    return -(-math.prod(shape) // 4)


def unary_dispatch(src: str, dst: str, shape: Shape, op: int, a: float = 0.0,
                   b: float = 0.0) -> Dispatch:
    """One unaryop.comp dispatch; op is a specialization constant (folded by the driver), the
    size and parameters are push constants so layers of any shape share the pipeline."""
    n4 = vec4_count(shape)
    return Dispatch("unaryop", (src, dst), linear_grid(n4),
                    push_constants=(n4, float(a), float(b)), spec_constants=(op,),
                    local_size=LOCAL)


class _Unary(VulkanLayer):
    """One unaryop.comp dispatch from input 0 to output 0."""

    inplace_inputs = (0,)

    def op(self) -> tuple[int, float, float]:
        """(op code, parameter a, parameter b)."""
        raise NotImplementedError

    def dispatches(self) -> list[Dispatch]:
        op, a, b = self.op()
        return [unary_dispatch(self.layer.inputs[0], self.layer.outputs[0], self.in_shapes[0],
                               op, a, b)]


@register("ReLU")
class ReLU(_Unary):
    def op(self) -> tuple[int, float, float]:
        return RELU, self.params.slope, 0.0


@register("Clip")
class Clip(_Unary):
    def op(self) -> tuple[int, float, float]:
        return CLIP, self.params.min, self.params.max


@register("Sigmoid")
class Sigmoid(_Unary):
    def op(self) -> tuple[int, float, float]:
        return SIGMOID, 0.0, 0.0


@register("Swish")
class Swish(_Unary):
    def op(self) -> tuple[int, float, float]:
        return SWISH, 0.0, 0.0


@register("HardSigmoid")
class HardSigmoid(_Unary):
    def op(self) -> tuple[int, float, float]:
        return HARDSIGMOID, self.params.alpha, self.params.beta


@register("HardSwish")
class HardSwish(_Unary):
    def op(self) -> tuple[int, float, float]:
        return HARDSWISH, self.params.alpha, self.params.beta


@register("Dropout")
class Dropout(_Unary):
    """Inference-time Dropout: the identity (an alias) unless it scales."""

    @property
    def aliases_input(self) -> bool:
        return self.params.scale == 1.0

    def op(self) -> tuple[int, float, float]:
        return SCALE, self.params.scale, 0.0


@register("UnaryOp")
class UnaryOp(_Unary):
    def op(self) -> tuple[int, float, float]:
        return UNARY_BASE + self.params.op_type, 0.0, 0.0


# binaryop.comp's modes
ELEMENTWISE, SCALAR, BROADCAST = range(3)


@register("BinaryOp")
class BinaryOp(VulkanLayer):
    """One binaryop.comp dispatch of a vec4 per invocation: elementwise when both operands
    have the output's element count, with a scalar, or through strides for ncnn broadcasting."""

    inplace_inputs = (0, 1)  # the executor takes only an input with the output's size

    def dispatches(self) -> list[Dispatch]:
        p, layer = self.params, self.layer
        out = self.out_shapes[0]
        n4, n = vec4_count(out), math.prod(out)
        a = layer.inputs[0]
        b = a if p.with_scalar else layer.inputs[1]
        dims: list[int] = [1, 1, 1]
        strides = [0] * 8
        if p.with_scalar:
            mode = SCALAR
        elif math.prod(self.in_shapes[0]) == math.prod(self.in_shapes[1]) == n:
            mode = ELEMENTWISE
        else:
            mode = BROADCAST
            a2, b2, out2 = binary_broadcast_shape(self.in_shapes[0], self.in_shapes[1])
            dims = list(pad4(out2, contiguous_strides(out2))[0][1:])
            strides = []
            for operand in (a2, b2):
                full = [0 if k == 1 else s for k, s in zip(operand, contiguous_strides(operand))]
                strides += pad4(operand, full)[1]
        return [Dispatch("binaryop", (a, b, layer.outputs[0]), linear_grid(n4),
                         push_constants=(n4, n, *dims, *strides, float(p.b)),
                         spec_constants=(p.op_type, mode), local_size=LOCAL)]


@register("Eltwise")
class Eltwise(VulkanLayer):
    """A chain of two-operand eltwise.comp dispatches: out = in0 (op) in1, then
    out = out (op) in_k; sums apply coefficient k to input k (1 without coefficients)."""

    inplace_inputs = (0,)  # input 0 is read only by the first dispatch

    def dispatches(self) -> list[Dispatch]:
        p, ins, out = self.params, self.layer.inputs, self.layer.outputs[0]
        coeffs = [float(c) for c in p.coeffs] if p.op_type == 1 and p.coeffs else [1.0] * len(ins)
        shape = self.out_shapes[0]
        if len(ins) == 1:
            return [unary_dispatch(ins[0], out, shape, SCALE, coeffs[0])]
        n4 = vec4_count(shape)
        result = []
        for k in range(1, len(ins)):
            a, ca = (ins[0], coeffs[0]) if k == 1 else (out, 1.0)
            result.append(Dispatch("eltwise", (a, ins[k], out), linear_grid(n4),
                                   push_constants=(n4, ca, coeffs[k]),
                                   spec_constants=(p.op_type,), local_size=LOCAL))
        return result
