"""Layers folded into the one before them (Vulkan plans): residual connections into the
convolution or Gemm, Permutes into the layer whose output they reorder, constant scales into
the Gemm's weights, activation layers (GELU after pnnx's Linear) into the Gemm's epilogue.

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

A Permute costs a dispatch and a pass over its blob; pnnx writes one after every Linear of a
channels-last block (convnext_tiny: 18 of its 50 copies). When the layer that produced the
Permute's input (through layers that only alias it: pnnx's Reshapes) can write the permuted
order itself (`VulkanLayer.take_permuted_output`: a Gemm transposes its output matrix by
swapping its output strides), it writes the Permute's output and the Permute records nothing.
Only when nothing else reads the blobs that disappear.

pnnx's convnext blocks end in ``x + scale * Linear(y)`` with a constant per-channel scale (a
MemoryData): the multiply folds into the Gemm's weights (B's column and C's value of each
output column, `VulkanLayer.take_output_scale`), after which the sum folds into the Gemm as a
residual. The Gemm's results differ from the unfolded layers' by rounding only.

An activation layer after a Gemm (pnnx's GELU after a block's first Linear) folds into the
Gemm's epilogue (`VulkanLayer.take_activation`; activate.h). A Permute to channels-last, a
LayerNorm over the channels and the Permute back (pnnx's convnext stem and downsampling) are
one LayerNorm over the channels of the channels-first blob (`VulkanLayerNorm.
take_channels_first`: strided runs). A Plan folds those LayerNorms, then the other Permutes,
then scales, then activations, then residual sums: a scale cannot move past an activation,
and a residual sum folded with the activation after it comes before that activation.

Last, a LayerNorm over the rows of a Gemm's A (pnnx's convnext blocks: the channels of each
pixel, then the first Linear) is applied by gemm_coopmat as it reads A
(`VulkanGemm.take_row_norm`): the LayerNorm becomes an alias of its input and records nothing
(convnext_tiny: 18 of its 23 LayerNorms). Only where nothing else reads the normalised values
(pnnx's Reshapes that take the blob only for its shape do not).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from vkserve.devices.vulkan.layers.base import Scalar, Shape, VulkanLayer
from vkserve.devices.vulkan.layers.compute_util import GELU_ERF, GELU_TANH, activation_constants
from vkserve.devices.vulkan.layers.matmul import VulkanGemm
from vkserve.devices.vulkan.layers.norm import VulkanLayerNorm
from vkserve.models.graph import Layer
from vkserve.models.layers import (
    BinaryOpParams,
    EltwiseParams,
    GELUParams,
    MemoryDataParams,
    PermuteParams,
    ReLUParams,
    ShapeError,
    SigmoidParams,
    binary_broadcast_shape,
)

Entry = tuple[Layer, VulkanLayer | None]

ELTWISE_SUM = 1
BINARY_ADD = 0
BINARY_MUL = 2


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


def _links(entries: Sequence[Entry]) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Each blob's producing entry and its reading entries, by index."""
    producer = {b: i for i, (layer, _) in enumerate(entries) for b in layer.outputs}
    readers: dict[str, list[int]] = {}
    for i, (layer, _) in enumerate(entries):
        for b in layer.inputs:
            readers.setdefault(b, []).append(i)
    return producer, readers


def _source(blob: str, reader: int, entries: Sequence[Entry], producer: Mapping[str, int],
            readers: Mapping[str, list[int]], keep: Collection[str]) -> tuple[int, list[int]] | None:
    """The layer whose output `blob` is (through layers that only alias it: pnnx's Reshapes)
    and those aliasing layers, when every blob on the way is read by the next layer alone
    (the last by `reader`) and none must exist; else None."""
    chain: list[int] = []
    while True:
        i = producer.get(blob)
        if i is None or blob in keep or readers.get(blob) != [reader]:
            return None
        layer, vl = entries[i]
        if vl is None:
            return None
        if not (vl.aliases_input and len(layer.outputs) == 1):
            return i, chain
        chain.append(i)
        blob, reader = layer.inputs[0], i


def _drop_aliases(chain: Sequence[int], entries: Sequence[Entry], readers: dict[str, list[int]]) -> None:
    """The aliasing layers of a fold are gone: their other inputs (pnnx's shape references)
    lose them as readers."""
    for c in chain:
        for b in entries[c][0].inputs:
            readers[b] = [r for r in readers[b] if r != c]


def _fold_into_producers(entries: Sequence[Entry], keep: Collection[str],
                         take: Callable[[Layer, VulkanLayer], Layer | None]) -> tuple[list[Entry], int]:
    """`entries` with every one-input layer folded into the layer that produced its input
    (through aliasing layers, `_source`) where ``take(layer, producer)`` returns the
    producer's new Layer (writing the folded layer's output), and how many were folded."""
    entries = list(entries)
    producer, readers = _links(entries)
    gone: set[int] = set()
    folded = 0
    for j, (layer, _) in enumerate(entries):
        found = _source(layer.inputs[0], j, entries, producer, readers, keep) if len(layer.inputs) == 1 else None
        if found is None:
            continue
        i, chain = found
        vl = entries[i][1]
        assert vl is not None
        new = take(layer, vl)
        if new is not None:
            entries[i] = (new, vl)
            producer[layer.outputs[0]] = i
            _drop_aliases(chain, entries, readers)
            gone.update(chain, [j])
            folded += 1
    return [e for i, e in enumerate(entries) if i not in gone], folded


def fold_channel_norms(entries: Sequence[Entry], shapes: Mapping[str, Shape],
                       keep: Collection[str]) -> tuple[list[Entry], int]:
    """`entries` with every Permute to channels-last + LayerNorm over the channels + Permute
    back as one LayerNorm over the channels, and how many Permutes were folded (two each)."""
    entries = list(entries)
    producer, readers = _links(entries)
    gone: set[int] = set()
    for j, (norm, vl) in enumerate(entries):
        if not isinstance(vl, VulkanLayerNorm) or len(norm.inputs) != 1:
            continue
        i, after = producer.get(norm.inputs[0]), readers.get(norm.outputs[0], [])
        if (i is None or len(after) != 1 or readers.get(norm.inputs[0]) != [j]
                or {norm.inputs[0], norm.outputs[0]} & set(keep)):
            continue
        first, back = entries[i][0], entries[after[0]][0]
        if not (isinstance(first.params, PermuteParams) and isinstance(back.params, PermuteParams)):
            continue
        blob = first.inputs[0]
        n = len(shapes[blob])
        if (n < 2 or first.params.numpy_axes(n) != (*range(1, n), 0)
                or back.params.numpy_axes(n) != (n - 1, *range(n - 1))):
            continue
        new = vl.take_channels_first(blob, shapes[blob], back.outputs[0])
        if new is not None:
            entries[j] = (new, vl)
            producer[back.outputs[0]] = j
            readers[blob] = [j if r == i else r for r in readers[blob]]
            gone.update((i, after[0]))
    return [e for i, e in enumerate(entries) if i not in gone], len(gone)


def fold_permutes(entries: Sequence[Entry], shapes: Mapping[str, Shape],
                  keep: Collection[str]) -> tuple[list[Entry], int]:
    """`entries` with every Permute that its producer can write itself folded into it, and
    how many were folded. `keep`: blobs that must exist (requested outputs)."""
    def take(permute: Layer, vl: VulkanLayer) -> Layer | None:
        if not isinstance(permute.params, PermuteParams):
            return None
        shape = shapes[permute.inputs[0]]
        order = np.arange(int(np.prod(shape))).reshape(shape).transpose(
            permute.params.numpy_axes(len(shape))).ravel()
        return vl.take_permuted_output(order, permute.outputs[0], shapes[permute.outputs[0]])

    return _fold_into_producers(entries, keep, take)


def _folded_activation(layer: Layer) -> tuple[Scalar, ...] | None:
    """An activation layer in the GEMM shaders' `activate()` form (activate.h), or None."""
    p = layer.params
    if isinstance(p, GELUParams):
        return (GELU_TANH if p.fast_gelu else GELU_ERF, 0.0, 0.0)
    if isinstance(p, SigmoidParams):
        return activation_constants(4, ())
    return _activation(layer)


def fold_activations(entries: Sequence[Entry], keep: Collection[str]) -> tuple[list[Entry], int]:
    """`entries` with every activation layer that the layer before it (through aliasing
    layers) can apply itself folded into it, and how many were folded."""
    def take(layer: Layer, vl: VulkanLayer) -> Layer | None:
        constants = _folded_activation(layer)
        return None if constants is None else vl.take_activation(constants, layer.outputs[0])

    return _fold_into_producers(entries, keep, take)


def _constant(blob: str, entries: Sequence[Entry], producer: Mapping[str, int]) -> np.ndarray | None:
    """The values of `blob` when a MemoryData layer holds them (through aliasing layers)."""
    while (i := producer.get(blob)) is not None:
        layer, vl = entries[i]
        if isinstance(layer.params, MemoryDataParams) and layer.weights:
            return np.asarray(layer.weights[0], np.float32).ravel()
        if vl is None or not vl.aliases_input:
            return None
        blob = layer.inputs[0]
    return None


def fold_scales(entries: Sequence[Entry], shapes: Mapping[str, Shape],
                keep: Collection[str]) -> tuple[list[Entry], int]:
    """`entries` with every multiply of a layer's output by a constant that the layer can
    take into its weights folded into it, and how many were folded. `keep`: blobs that must
    exist (requested outputs)."""
    entries = list(entries)
    producer, readers = _links(entries)
    gone: set[int] = set()
    for j, (mul, _) in enumerate(entries):
        p = mul.params
        if (not isinstance(p, BinaryOpParams) or p.op_type != BINARY_MUL or p.with_scalar
                or len(mul.inputs) != 2 or mul.inputs[0] == mul.inputs[1]):
            continue
        try:
            first, second, out = binary_broadcast_shape(shapes[mul.inputs[0]], shapes[mul.inputs[1]])
        except ShapeError:
            continue
        for operand, other, other_shape in ((mul.inputs[0], mul.inputs[1], second),
                                            (mul.inputs[1], mul.inputs[0], first)):
            i = producer.get(operand)
            vl = entries[i][1] if i is not None else None
            values = _constant(other, entries, producer)
            if (vl is None or readers.get(operand) != [j] or operand in keep or values is None
                    or tuple(out) != tuple(shapes[operand]) or values.size != int(np.prod(other_shape))):
                continue
            new = vl.take_output_scale(np.broadcast_to(values.reshape(other_shape), out).ravel(),
                                       mul.outputs[0])
            if new is not None:
                entries[i] = (new, vl)
                producer[mul.outputs[0]] = i
                readers[other] = [r for r in readers[other] if r != j]
                gone.add(j)
                break
    return [e for i, e in enumerate(entries) if i not in gone], len(gone)


def fold_residuals(entries: Sequence[Entry], shapes: Mapping[str, Shape],
                   keep: Collection[str]) -> tuple[list[Entry], int]:
    """`entries` (a Plan's layers in order, None for Input) with every foldable
    convolution + sum [+ activation] as one layer, and how many were folded. `keep`: blobs
    that must exist (requested outputs)."""
    entries = list(entries)
    producer, readers = _links(entries)
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


def _data_readers(blob: str, entries: Sequence[Entry], readers: Mapping[str, list[int]]) -> list[int]:
    """The layers that read `blob`'s values: all its readers but aliasing layers that take it
    as a later input, only for its shape (pnnx's Reshape to the shape of another blob)."""
    out = []
    for r in readers.get(blob, []):
        layer, vl = entries[r]
        if not (vl is not None and vl.aliases_input and layer.inputs[0] != blob):
            out.append(r)
    return out


def _aliased_producer(blob: str, reader: int, entries: Sequence[Entry], producer: Mapping[str, int],
                      readers: Mapping[str, list[int]], keep: Collection[str]) -> int | None:
    """The layer whose output `blob` is, through aliasing layers (pnnx's Split and Reshapes),
    when `reader` alone reads the values on the way: no blob kept, the aliasing layers' other
    outputs read by none but shape references."""
    while True:
        i = producer.get(blob)
        if i is None or blob in keep or _data_readers(blob, entries, readers) != [reader]:
            return None
        layer, vl = entries[i]
        if vl is None or not vl.aliases_input:
            return i
        if any(o in keep or _data_readers(o, entries, readers) for o in layer.outputs if o != blob):
            return None
        blob, reader = layer.inputs[0], i


def fold_row_norms(entries: Sequence[Entry], keep: Collection[str]) -> int:
    """Every LayerNorm over the rows of a Gemm's A that the Gemm applies as it reads them
    (`VulkanGemm.take_row_norm`) turned into an alias of its input; how many."""
    producer, readers = _links(entries)
    folded = 0
    for j, (_, vl) in enumerate(entries):
        if not isinstance(vl, VulkanGemm) or vl.a.startswith("w:"):
            continue
        i = _aliased_producer(vl.a, j, entries, producer, readers, keep)
        norm = entries[i][1] if i is not None else None
        if not isinstance(norm, VulkanLayerNorm) or norm.read_normalised:
            continue
        found = norm.row_norm()
        if found is not None and vl.take_row_norm(*found):
            norm.read_normalised = True
            folded += 1
    return folded
