"""Vulkan layers that move data: the aliases (Split, Reshape, Flatten, Noop, Squeeze,
ExpandDims) and the strided copies (Concat, Slice, Permute, ShuffleChannel, MemoryData).

Blobs are dense C-order arrays (see base.py), so reshaping layers are free: the executor
binds their outputs to the input's bytes. Every other layer here is one or more dispatches of
copy_strided.comp, which walks a 4-D region and reads and writes through arbitrary strides;
other data-movement layers (Crop, Padding-like windows) can use `strided_copy` too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vkserve.devices.vulkan.layers.base import MAX_GROUPS, Dispatch, Shape, VulkanLayer, register
from vkserve.models.layers import positive_axis

LOCAL = (64, 1, 1)


def linear_grid(n: int) -> tuple[int, int, int]:
    """Global size for `n` invocations of the 1-D shaders of this package, which index
    y * (groups along x * local size) + x: along x while that fits, then rows along y."""
    row = MAX_GROUPS * LOCAL[0]
    return (n, 1, 1) if n <= row else (row, -(-n // row), 1)


def contiguous_strides(shape: Shape) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return strides[::-1]


def pad4(shape: Shape, strides: Sequence[int]) -> tuple[Shape, list[int]]:
    """A shape and its strides as 4-D: leading axes of size 1 and stride 0."""
    k = 4 - len(shape)
    return (1,) * k + tuple(shape), [0] * k + list(strides)


def strided_copy(src: str, dst: str, region: Shape, src_strides: Sequence[int],
                 dst_strides: Sequence[int], src_offset: int = 0, dst_offset: int = 0) -> Dispatch:
    """Copy the elements of `region` (up to 4-D): element x goes from
    src[src_offset + x . src_strides] to dst[dst_offset + x . dst_strides] (element units).
    Everything is a push constant, so one pipeline serves every copy."""
    shape4, s = pad4(region, src_strides)
    _, t = pad4(region, dst_strides)
    n = math.prod(region)
    return Dispatch("copy_strided", (src, dst), linear_grid(n),
                    push_constants=(n, shape4[1], shape4[2], shape4[3], src_offset, *s,
                                    dst_offset, *t),
                    local_size=LOCAL)


class _Alias(VulkanLayer):
    @property
    def aliases_input(self) -> bool:
        return True

    def dispatches(self) -> list[Dispatch]:
        return []


register("Split", "Reshape", "Flatten", "Noop", "Squeeze", "ExpandDims")(_Alias)


@register("MemoryData")
class MemoryData(VulkanLayer):
    """The layer's constant, uploaded once as a weight and copied into its blob each run (the
    blob is planned like any other, so later layers may take its bytes over in place)."""

    def weights(self) -> dict[str, np.ndarray]:
        return {"data": np.asarray(self.layer.weights[0], dtype=np.float32).ravel()}

    def dispatches(self) -> list[Dispatch]:
        shape = self.out_shapes[0]
        strides = contiguous_strides(shape)
        return [strided_copy("w:data", self.layer.outputs[0], shape, strides, strides)]


@register("Concat")
class Concat(VulkanLayer):
    """One copy per input into its window of the output."""

    def _starts(self) -> list[int]:
        """Each input's first element in the output."""
        out = self.out_shapes[0]
        axis = positive_axis(self.params.axis, len(out))
        step = contiguous_strides(out)[axis]
        starts, start = [], 0
        for shape in self.in_shapes:
            starts.append(start * step)
            start += shape[axis]
        return starts

    def dispatches(self) -> list[Dispatch]:
        out_strides = contiguous_strides(self.out_shapes[0])
        return [strided_copy(blob, self.layer.outputs[0], shape, contiguous_strides(shape), out_strides,
                             dst_offset=start)
                for blob, shape, start in zip(self.layer.inputs, self.in_shapes, self._starts())]

    def input_windows(self) -> list[int] | None:
        out = self.out_shapes[0]
        # each input is one run of the output when the axes before the concat axis are all 1
        return self._starts() if math.prod(out[:positive_axis(self.params.axis, len(out))]) == 1 else None


@register("Slice")
class Slice(VulkanLayer):
    """One copy per output from its window of the input (outputs are consecutive along the
    axis from 0, as both ncnn's slices and indices forms lay them out)."""

    def dispatches(self) -> list[Dispatch]:
        shape = self.in_shapes[0]
        axis = positive_axis(self.params.axis, len(shape))
        in_strides = contiguous_strides(shape)
        result, start = [], 0
        for blob, out in zip(self.layer.outputs, self.out_shapes):
            result.append(strided_copy(self.layer.inputs[0], blob, out, in_strides,
                                       contiguous_strides(out),
                                       src_offset=start * in_strides[axis]))
            start += out[axis]
        return result


@register("Permute")
class Permute(VulkanLayer):
    def dispatches(self) -> list[Dispatch]:
        shape, out = self.in_shapes[0], self.out_shapes[0]
        axes = self.params.numpy_axes(len(shape))
        in_strides = contiguous_strides(shape)
        return [strided_copy(self.layer.inputs[0], self.layer.outputs[0], out,
                             [in_strides[a] for a in axes], contiguous_strides(out))]


@register("ShuffleChannel")
class ShuffleChannel(VulkanLayer):
    """(groups, c / groups, h * w) -> (c / groups, groups, h * w), the layer's groups."""

    def dispatches(self) -> list[Dispatch]:
        c, h, w = self.in_shapes[0]
        groups = self.params.groups(c)
        per, hw = c // groups, h * w
        return [strided_copy(self.layer.inputs[0], self.layer.outputs[0], (per, groups, hw),
                             (hw, per * hw, 1), (groups * hw, hw, 1))]
