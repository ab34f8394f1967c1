"""Padding, Crop, Interp, Softmax and LRN on Vulkan.

Padding and Crop share the ``padding`` shader (a crop is a copy with negative pads); both view
a blob as (outer, d, h, w) so that one shader covers 1-D to 4-D blobs: a 3-D blob is
(1, c, h, w), whose "d" axis carries the channel pads (front/behind) and channel offsets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vkserve.devices.capabilities import Precision
from vkserve.devices.errors import UnsupportedError
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, Dispatch, Shape, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL, make_dispatch
from vkserve.models.graph import Layer
from vkserve.models.layers import positive_axis


def _view4(shape: Shape) -> tuple[int, int, int, int]:
    """(outer, d, h, w) of a 1-D..4-D blob, for the padding shader."""
    if len(shape) == 4:
        return (shape[0], shape[1], shape[2], shape[3])
    return (1,) * (4 - len(shape)) + tuple(shape)  # type: ignore[return-value]


def _copy_dispatch(layer: Layer, in_shape: Shape, out_shape: Shape, offsets: tuple[int, int, int, int],
                   pad_type: int) -> Dispatch:
    """The padding shader over `out_shape`: out[o][z][y][x] = in[o + offsets[0]][z - offsets[1]]
    [y - offsets[2]][x - offsets[3]] where inside, else padding of `pad_type`."""
    _, d, h, w = _view4(in_shape)
    outer, outd, outh, outw = _view4(out_shape)
    offset_o, front, top, left = offsets
    return make_dispatch("padding", (layer.inputs[0], layer.outputs[0], "w:pad"),
                         (outw, outh, outer * outd),
                         psc=(w, h, d, outw, outh, outd, outer, left, top, front, offset_o),
                         fixed=(pad_type,))


@register("Padding")
class VulkanPadding(VulkanLayer):
    """ncnn Padding: constant (one value, or per-channel values: one per output channel of a
    3-D / 4-D blob; ncnn pads 1-D and 2-D blobs with the value), replicate or reflect;
    front/behind pad the channels of a 3-D blob and the depth of a 4-D one, in every type."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        shape = self.in_shapes[0]
        for (before, after), n in zip(p.pads(len(shape)), shape):
            if p.type == 2 and max(before, after) >= n:
                raise UnsupportedError("reflect padding as wide as the blob")

    def weights(self) -> dict[str, np.ndarray]:
        """The pad value of each (outer, d) plane of the output view (the shader's ``pad``)."""
        p = self.params
        outer, outd, _, _ = _view4(self.out_shapes[0])
        if not p.per_channel_pad_data_size or len(self.out_shapes[0]) < 3:
            return {"pad": np.full(outer * outd, p.value, np.float32)}
        values = np.asarray(self.layer.weights[0], dtype=np.float32).ravel()
        channels = self.out_shapes[0][0]  # 3-D: the "d" axis of the view; 4-D: "outer"
        per_channel = values[:channels]  # the layer checked there are enough
        plane = per_channel[:, None] if len(self.out_shapes[0]) == 4 else per_channel[None, :]
        return {"pad": np.broadcast_to(plane, (outer, outd)).ravel().copy()}

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        befores = tuple(a for a, _ in p.pads(len(self.in_shapes[0])))
        offsets = (0,) * (4 - len(befores)) + befores  # (outer, d, h, w)
        return [_copy_dispatch(self.layer, self.in_shapes[0], self.out_shapes[0], offsets, p.type)]


@register("Crop")
class VulkanCrop(VulkanLayer):
    """Every Crop form: the window is the layer's (``CropParams.window_of``)."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        starts, _ = self.params.window_of(self.in_shapes)
        self.offsets = (0,) * (4 - len(starts)) + starts  # (outer, d, h, w) offsets

    def weights(self) -> dict[str, np.ndarray]:
        return {"pad": np.zeros(1, np.float32)}  # bound, never read: a crop reads only inside

    def dispatches(self) -> list[Dispatch]:
        o, z, y, x = self.offsets
        return [_copy_dispatch(self.layer, self.in_shapes[0], self.out_shapes[0], (o, -z, -y, -x), 0)]


@register("Interp")
class VulkanInterp(VulkanLayer):
    """Nearest, bilinear and bicubic resize; the source step per output pixel is the layer's
    (``InterpParams.source_steps``), in float32. The shader sees (c, h, w): a 2-D blob is one
    channel resized along w only, a 1-D blob of w elements is w channels of one pixel, which
    nearest spreads over each output channel."""

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        shape, out = self.in_shapes[0], self.out_shapes[0]
        resize_type, resize_h = p.resize_type, 1
        if len(shape) == 1:
            (c, h, w), (oh, ow) = (shape[0], 1, 1), out[1:]
            resize_type, steps = 1, (0.0, 0.0)
        else:
            if len(shape) == 2:
                (c, h, w), (oh, ow), resize_h = (1, *shape), (shape[0], out[1]), 0
            else:
                (c, h, w), (oh, ow) = shape, out[1:]
            steps = p.source_steps((h, w), (oh, ow))
        scale_h, scale_w = (float(np.float32(s)) for s in steps)
        return [make_dispatch("interp", (self.layer.inputs[0], self.layer.outputs[0]), (ow, oh, c),
                              psc=(w, h, ow, oh, c, scale_w, scale_h),
                              fixed=(resize_type, int(bool(p.align_corner)), resize_h))]


@register("Softmax")
class VulkanSoftmax(VulkanLayer):
    """Softmax along any axis: the blob is viewed as (outer, n, inner). Lines of 32 or more
    elements get a work group each, shorter ones an invocation each."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        shape = self.in_shapes[0]
        axis = positive_axis(p.axis, len(shape))
        self.outer, self.n, self.inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        self.cooperative = self.n >= 32 and self.inner <= MAX_GROUPS
        groups_x = self.inner if self.cooperative else -(-self.inner // REDUCE_LOCAL)
        if groups_x > MAX_GROUPS or self.outer > MAX_GROUPS:
            raise UnsupportedError(f"Softmax over {shape} axis {p.axis}: too many lines")

    def dispatches(self) -> list[Dispatch]:
        x = self.inner * REDUCE_LOCAL if self.cooperative else self.inner
        return [make_dispatch("softmax", (self.layer.inputs[0], self.layer.outputs[0]), (x, self.outer, 1),
                              psc=(self.n, self.inner, self.outer), fixed=(int(self.cooperative),),
                              local_size=(REDUCE_LOCAL, 1, 1))]


@register("LRN")
class VulkanLRN(VulkanLayer):
    """LRN across channels (region_type 0) or within a channel (1) of a 3-D blob."""

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        c, h, w = self.in_shapes[0]
        return [make_dispatch("lrn", (self.layer.inputs[0], self.layer.outputs[0]), (w, h, c),
                              psc=(w, h, c, p.local_size),
                              fixed=(p.region_type, float(p.alpha), float(p.beta), float(p.bias)))]
