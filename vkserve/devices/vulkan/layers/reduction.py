"""Reduction, PixelShuffle, Reorg, Tile and GLU on Vulkan.

Reduction is one ``reduction`` dispatch, a work group of 64 per output element.

The input's axes split into kept and reduced ones (``ReductionParams.reduce_axes``); each set
goes to the shader as up to 4 sizes and element strides (padded in front with size 1), so any
axis combination of a 1-D..4-D blob is one gather pattern.

PixelShuffle and Reorg are ``copy_strided`` dispatches, one per row offset (each a 4-D region:
channel, row, column, column offset), exact in every mode. Tile is one ``tile`` gather (input
index = output index modulo the input's shape, per axis); GLU is one ``glu`` dispatch.
"""

from __future__ import annotations

import math

from vkserve.devices.errors import UnsupportedError
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, Dispatch, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL
from vkserve.devices.vulkan.layers.shape import LOCAL, linear_grid, strided_copy
from vkserve.models.layers import positive_axis


def _pad4(sizes: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    pad = 4 - len(sizes)
    return [1] * pad + sizes, [0] * pad + strides


@register("Reduction")
class VulkanReduction(VulkanLayer):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        shape = tuple(self.in_shapes[0])
        red = self.params.reduce_axes(shape)
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        kept = [i for i in range(len(shape)) if i not in red]
        self.ks, self.kt = _pad4([shape[i] for i in kept], [strides[i] for i in kept])
        self.rs, self.rt = _pad4([shape[i] for i in red], [strides[i] for i in red])
        self.count = math.prod(self.ks)
        self.rcount = math.prod(self.rs)
        self.gx = min(self.count, MAX_GROUPS)
        self.gy = -(-self.count // self.gx)
        if self.gy > MAX_GROUPS:
            raise UnsupportedError(f"Reduction over {shape}: too many outputs")

    def dispatches(self) -> list[Dispatch]:
        return [Dispatch("reduction", (self.layer.inputs[0], self.layer.outputs[0]),
                         (self.gx * REDUCE_LOCAL, self.gy, 1),
                         push_constants=(self.count, self.rcount, *self.ks, *self.kt, *self.rs,
                                         *self.rt, float(self.params.coeff)),
                         spec_constants=(int(self.params.operation),),
                         local_size=(REDUCE_LOCAL, 1, 1))]


@register("PixelShuffle")
class VulkanPixelShuffle(VulkanLayer):
    """out[p, i * r + sh, j * r + sw] = in[channel(p, sh, sw), i, j]; one copy per sh over
    (p, i, j, sw)."""

    def dispatches(self) -> list[Dispatch]:
        r, mode = self.params.upscale_factor, self.params.mode
        oc, oh, ow = self.out_shapes[0]
        h, w = oh // r, ow // r
        src, dst = self.layer.inputs[0], self.layer.outputs[0]
        out = []
        for sh in range(r):
            if mode == 0:  # channel p * r^2 + sh * r + sw
                s_strides, s_off = (r * r * h * w, w, 1, h * w), sh * r * h * w
            else:  # channel (sh * r + sw) * oc + p
                s_strides, s_off = (h * w, w, 1, oc * h * w), sh * r * oc * h * w
            out.append(strided_copy(src, dst, (oc, h, w, r), s_strides, (oh * ow, r * ow, r, 1),
                                    s_off, sh * ow))
        return out


@register("Reorg")
class VulkanReorg(VulkanLayer):
    """out[channel(q, sh, sw), i, j] = in[q, i * s + sh, j * s + sw]; one copy per sh over
    (q, i, j, sw)."""

    def dispatches(self) -> list[Dispatch]:
        s, mode = self.params.stride, self.params.mode
        _, hh, ww = self.in_shapes[0]
        oc, oh, ow = self.out_shapes[0]
        c = oc // (s * s)
        plane = oh * ow
        src, dst = self.layer.inputs[0], self.layer.outputs[0]
        out = []
        for sh in range(s):
            if mode == 0:  # channel q * s^2 + sh * s + sw
                d_strides, d_off = (s * s * plane, ow, 1, plane), sh * s * plane
            else:  # channel (sh * s + sw) * c + q
                d_strides, d_off = (plane, ow, 1, c * plane), sh * s * c * plane
            out.append(strided_copy(src, dst, (c, oh, ow, s), (hh * ww, s * ww, s, 1), d_strides,
                                    sh * ww, d_off))
        return out


@register("GLU")
class VulkanGLU(VulkanLayer):
    def dispatches(self) -> list[Dispatch]:
        shape = tuple(self.in_shapes[0])
        axis = positive_axis(self.params.axis, len(shape))
        block = (shape[axis] // 2) * math.prod(shape[axis + 1:])
        size = math.prod(self.out_shapes[0])
        return [Dispatch("glu", (self.layer.inputs[0], self.layer.outputs[0]), linear_grid(size),
                         push_constants=(size, block), local_size=LOCAL)]


@register("Tile")
class VulkanTile(VulkanLayer):
    def dispatches(self) -> list[Dispatch]:
        padded, _ = self.params.tile_plan(self.in_shapes[0])
        out = tuple(self.out_shapes[0])
        o = (1,) * (4 - len(out)) + out
        i = (1,) * (4 - len(padded)) + tuple(padded)
        size = math.prod(out)
        return [Dispatch("tile", (self.layer.inputs[0], self.layer.outputs[0]), linear_grid(size),
                         push_constants=(size, o[1], o[2], o[3], *i), local_size=LOCAL)]
