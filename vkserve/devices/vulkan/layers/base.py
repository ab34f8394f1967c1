"""Per-device implementation of a layer on Vulkan (ncnn's split: a layer's parameters live
in `vkserve.models.layers`, what runs it on a device lives here).

A `VulkanLayer` is created once per Plan for fixed input shapes and a precision. It does no
Vulkan calls itself: it declares the weights to upload, any scratch blobs it needs, and the
dispatches to record. The executor turns those into buffers, pipelines (through the
device's PipelineCache), descriptor sets and one recorded command buffer.

Blob layout on the device: the ncnn shape in C order, densely packed ((c, h, w) ->
index (ci*h + y)*w + x), one `sfp` element each (fp32 or fp16 by precision). Each binding
is a whole blob (the executor binds it at its arena offset), so shaders index from 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.models.graph import Layer
from vkserve.models.layers import Shape

Scalar = int | float

# Work groups per dispatch dimension every Vulkan device supports (maxComputeWorkGroupCount).
MAX_GROUPS = 65535


@dataclasses.dataclass(frozen=True)
class Dispatch:
    shader: str  # built-in shader id: devices/vulkan/shaders/<shader>.comp
    # Binding i of the shader -> a name: an input/output blob of the layer, a weight
    # ("w:<key>" for keys of `weights()`), a scratch blob ("s:<key>" for keys of `scratch()`),
    # or an input blob as a 3D image ("img:<blob>": extent (w, h, c) of its shape, one channel
    # per texel; the shader is then compiled with NCNN_image_shader and reads it as a sampler).
    bindings: tuple[str, ...]
    global_size: tuple[int, int, int]  # invocations; workgroups = ceil(global / local)
    push_constants: tuple[Scalar, ...] = ()  # packed 4 bytes each (int32 / float32)
    spec_constants: tuple[Scalar, ...] = ()  # constant ids 0..n-1
    local_size: tuple[int, int, int] = (64, 1, 1)
    # The shader runs every item of a batch in this one dispatch: its work groups along x
    # repeat per item, and item i's blobs lie `VulkanLayer.item_stride` elements after item
    # i - 1's in bindings that span them all. Without it, one dispatch per item.
    batched: bool = False

    @property
    def images(self) -> bool:
        """Whether the shader reads image-backed blobs (compiled with the image_storage bit)."""
        return any(b.startswith("img:") for b in self.bindings)


class VulkanLayer:
    """Base class; subclasses register with `@register("<ncnn type>")`."""

    #: Storage elements from one item's blobs to the next's (a batch's items lie side by side
    #: in the arena), set by the Plan before `dispatches()`: what `batched` dispatches give
    #: their shaders.
    item_stride: int = 0

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        self.layer = layer
        self.params = layer.params
        self.in_shapes = list(in_shapes)
        self.out_shapes = list(out_shapes)
        self.precision = precision

    def specialize(self, caps: DeviceCaps) -> None:
        """Choices that depend on the device (not only on shapes and precision), made once by
        the Plan before it asks for weights and dispatches; most layers have none."""

    def weights(self) -> dict[str, np.ndarray]:
        """float32 arrays to upload once (the executor converts to the storage type)."""
        return {}

    def scratch(self) -> dict[str, int]:
        """Extra intermediate blobs, key -> element count (planned into the arena)."""
        return {}

    def zeroed_scratch(self) -> frozenset[str]:
        """Keys of ``scratch()`` whose bytes are zero when the layer's dispatches start: the
        Plan fills them with zeros at the start of every run (split K's tile counters)."""
        return frozenset()

    def dispatches(self) -> list[Dispatch]:
        raise NotImplementedError

    #: Inputs whose bytes the output may take over when this layer is their last reader
    #: (only inputs with the output's element count are taken). Safe only when every dispatch
    #: reads element i of such an input solely to write element i of the output, and no
    #: dispatch reads the input after another dispatch of the layer wrote the output.
    inplace_inputs: tuple[int, ...] = ()

    def take_residual(self, residual: str, activation: tuple[Scalar, ...], output: str) -> Layer | None:
        """Fold a following ``output = activation(this layer's output + residual)`` (an
        Eltwise sum or BinaryOp add with the blob `residual` of the output's shape, then an
        activation in `activation_constants` form) into this layer, which then reads
        `residual` as its second input and writes `output`: its new Layer, or None where the
        layer cannot (the default; it is then left unchanged)."""
        return None

    def take_permuted_output(self, order: np.ndarray, output: str, shape: Shape) -> Layer | None:
        """Write this layer's output permuted: element i of `output` (of `shape`) is element
        ``order[i]`` of what the layer writes now (a following Permute, through layers that
        only alias the output), so that the Permute records nothing: its new Layer, or None
        where the layer cannot write that order (the default; it is then left unchanged)."""
        return None

    def take_activation(self, activation: tuple[Scalar, ...], output: str) -> Layer | None:
        """Fold a following activation layer (`activation` in `activation_constants` form)
        into this layer, which then writes `output`: its new Layer, or None where it cannot
        (the default)."""
        return None

    def take_output_scale(self, scales: np.ndarray, output: str) -> Layer | None:
        """Fold a following multiply by a constant (`scales`: its value for each element of
        this layer's output, in the order the layer writes it) into this layer, which then
        writes `output`: its new Layer, or None where it cannot (the default)."""
        return None

    def input_windows(self) -> list[int] | None:
        """Where each input lies in the output (its first element), when the layer only
        gathers its inputs into the output unchanged and each is one contiguous run of it
        (Concat along its outermost axis): the executor may then have the inputs' producers
        write there and record nothing for the layer. None otherwise."""
        return None

    @property
    def aliases_input(self) -> bool:
        """True when the output is the input's bytes unchanged (Reshape, Flatten, Dropout,
        Noop, Split): the executor binds the output to the input's storage and records
        nothing."""
        return False


def is_transpose(order: np.ndarray, rows: int, cols: int) -> bool:
    """Whether a `take_permuted_output` order is the transpose of a rows x cols matrix."""
    return order.size == rows * cols and np.array_equal(order, np.arange(rows * cols).reshape(rows, cols).T.ravel())


VULKAN_LAYERS: dict[str, type[VulkanLayer]] = {}


def register(*types: str) -> Callable[[type[VulkanLayer]], type[VulkanLayer]]:
    def deco(cls: type[VulkanLayer]) -> type[VulkanLayer]:
        for t in types:
            VULKAN_LAYERS[t] = cls
        return cls

    return deco
