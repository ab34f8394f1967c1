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
    """ncnn Padding: constant (one value, or per-channel values of a 3-D blob), replicate or
    reflect; front/behind pad the channels of a 3-D blob and the depth of a 4-D one."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        shape = self.in_shapes[0]
        if p.type != 0 and (p.front or p.behind):
            raise UnsupportedError("front/behind padding with a non-constant type")
        if p.per_channel_pad_data_size and len(shape) != 3:
            raise UnsupportedError("per-channel pad data of a blob that is not 3-D")
        _, _, h, w = _view4(shape)
        if p.type == 2 and (max(p.left, p.right) >= w or (len(shape) > 1 and max(p.top, p.bottom) >= h)):
            raise UnsupportedError("reflect padding as wide as the blob")

    def weights(self) -> dict[str, np.ndarray]:
        p = self.params
        outd = _view4(self.out_shapes[0])[1]
        if p.per_channel_pad_data_size:
            values = np.asarray(self.layer.weights[0], dtype=np.float32).ravel()
            return {"pad": np.broadcast_to(values, (outd,)).copy()}
        return {"pad": np.full(outd, p.value, np.float32)}

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        befores = tuple(a for a, _ in p.pads(len(self.in_shapes[0])))
        offsets = (0,) * (4 - len(befores)) + befores  # (outer, d, h, w)
        return [_copy_dispatch(self.layer, self.in_shapes[0], self.out_shapes[0], offsets, p.type)]


@register("Crop")
class VulkanCrop(VulkanLayer):
    """Every Crop form: the window is the layer's (``CropParams.window``)."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        reference = self.in_shapes[1] if self.params.uses_reference() else None
        starts, _ = self.params.window(self.in_shapes[0], reference)
        self.offsets = (0,) * (4 - len(starts)) + starts  # (outer, d, h, w) offsets

    def weights(self) -> dict[str, np.ndarray]:
        return {"pad": np.zeros(1, np.float32)}  # bound, never read: a crop reads only inside

    def dispatches(self) -> list[Dispatch]:
        o, z, y, x = self.offsets
        return [_copy_dispatch(self.layer, self.in_shapes[0], self.out_shapes[0], (o, -z, -y, -x), 0)]


@register("Interp")
class VulkanInterp(VulkanLayer):
    """Nearest and bilinear resize of a 3-D blob; the source step per output pixel is the
    layer's (``InterpParams.source_steps``), in float32."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        if len(self.in_shapes[0]) != 3:
            raise UnsupportedError(f"Interp input of {len(self.in_shapes[0])} dims (need c,h,w)")
        if p.resize_type not in (1, 2):
            raise UnsupportedError(f"resize_type={p.resize_type} (nearest and bilinear only)")

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        c, h, w = self.in_shapes[0]
        _, oh, ow = self.out_shapes[0]
        scale_h, scale_w = (float(np.float32(s)) for s in p.source_steps((h, w), (oh, ow)))
        return [make_dispatch("interp", (self.layer.inputs[0], self.layer.outputs[0]), (ow, oh, c),
                              psc=(w, h, ow, oh, c, scale_w, scale_h),
                              fixed=(p.resize_type, int(bool(p.align_corner))))]


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
