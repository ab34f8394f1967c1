"""Residual connections folded into the convolution before them (Vulkan plans).

``y = ReLU(conv(x) + r)`` in ncnn's form is three layers: a Convolution without an
activation, an Eltwise sum (or a BinaryOp add) of its output and the shortcut r, and an
activation. On a GPU each is a dispatch and a barrier, and the two small ones cost as much
as many convolutions (resnet18 on an H200: 16 of its 59 dispatches, 16 % of its GPU time). The
GEMM convolution shaders add r in their epilogue instead, before the activation
(`VulkanLayer.take_residual`); the sum and the activation then record nothing and their
intermediate blobs are never stored. The layers' meaning is unchanged: the CPU engine runs
them as written.

Folded only when nothing else needs what disappears: the convolution's output and the sum
read by no other layer and not requested, the shortcut produced before the convolution runs
(the folded layer takes the convolution's place), shapes equal (no broadcast), the sum's
coefficients all 1.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from vkserve.devices.vulkan.layers.base import Scalar, Shape, VulkanLayer
from vkserve.devices.vulkan.layers.compute_util import activation_constants
from vkserve.models.graph import Layer
from vkserve.models.layers import BinaryOpParams, EltwiseParams, ReLUParams

Entry = tuple[Layer, VulkanLayer | None]

ELTWISE_SUM = 1
BINARY_ADD = 0


def _is_sum(layer: Layer, shapes: Mapping[str, Shape]) -> bool:
    """An elementwise a + b of two blobs of one shape."""
    p = layer.params
    if len(layer.inputs) != 2 or len(set(layer.inputs)) != 2:
        return False
    if tuple(shapes[layer.inputs[0]]) != tuple(shapes[layer.inputs[1]]):
        return False
    if isinstance(p, EltwiseParams):
        return p.op_type == ELTWISE_SUM and all(c == 1.0 for c in p.coeffs)
    if isinstance(p, BinaryOpParams):
        return p.op_type == BINARY_ADD and not p.with_scalar
    return False


def _activation(layer: Layer) -> tuple[Scalar, ...] | None:
    """A following activation layer in the shaders' `activate()` form (ReLU and leaky ReLU)."""
    p = layer.params
    if isinstance(p, ReLUParams):
        return activation_constants(1, ()) if p.slope == 0 else activation_constants(2, (p.slope,))
    return None


def fold_residuals(entries: Sequence[Entry], shapes: Mapping[str, Shape],
                   keep: Collection[str]) -> tuple[list[Entry], int]:
    """`entries` (a Plan's layers in order, None for Input) with every foldable
    convolution + sum [+ activation] as one layer, and how many were folded. `keep`: blobs
    that must exist (requested outputs)."""
    entries = list(entries)
    producer = {b: i for i, (layer, _) in enumerate(entries) for b in layer.outputs}
    readers: dict[str, list[int]] = {}
    for i, (layer, _) in enumerate(entries):
        for b in layer.inputs:
            readers.setdefault(b, []).append(i)
    gone: set[int] = set()
    folded = 0
    for j, (add, _) in enumerate(entries):
        if j in gone or not _is_sum(add, shapes):
            continue
        total = add.outputs[0]
        # the operand whose producer runs last is the convolution to fold into
        pairs = [(add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])]
        for operand, shortcut in sorted(pairs, key=lambda pair: -producer.get(pair[0], -1)):
            p = producer.get(operand)
            vl = entries[p][1] if p is not None else None
            if (p is None or vl is None or readers.get(operand) != [j] or operand in keep
                    or producer.get(shortcut, -1) >= p):
                continue
            output, activation, also = total, activation_constants(0, ()), None
            after = readers.get(total, [])
            if len(after) == 1 and total not in keep:
                act = _activation(entries[after[0]][0])
                if act is not None:
                    output, activation, also = entries[after[0]][0].outputs[0], act, after[0]
            layer = vl.take_residual(shortcut, activation, output)
            if layer is None:
                continue
            entries[p] = (layer, vl)
            gone.add(j)
            readers[shortcut] = [p if r == j else r for r in readers[shortcut]]  # p reads it now
            producer[output] = p
            if also is not None:
                gone.add(also)
            folded += 1
            break
    return [e for i, e in enumerate(entries) if i not in gone], folded
