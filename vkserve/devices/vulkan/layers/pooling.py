"""Pooling on Vulkan: windowed max / average (``pooling``), global (``pooling_global``).

The padding rules are ncnn's ``Pooling::make_padding``, as the CPU engine implements them:
pad_mode 0 (full: a bottom/right tail keeps the last partial window), 1 (valid: declared pads),
2 / 3 (SAME upper / lower). The shader needs only the left/top pad (the output size fixes the
rest) and, for averages without ``avgpool_count_include_pad``, the region whose cells count
towards the divisor: the padded input less the declared pads and the tail.
"""

from __future__ import annotations

from collections.abc import Sequence

from vkserve.devices.capabilities import Precision
from vkserve.devices.cpu.kernels.base import UnsupportedError
from vkserve.devices.cpu.kernels.conv import cdiv
from vkserve.devices.vulkan.layers.base import Dispatch, Shape, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL, make_dispatch
from vkserve.models.graph import Layer


@register("Pooling")
class VulkanPooling(VulkanLayer):
    """Max / average pooling of a 3-D blob, windowed (pad modes 0..3) or global."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        if p.pooling_type not in (0, 1):
            raise UnsupportedError(f"pooling_type={p.pooling_type}")
        if len(self.in_shapes[0]) != 3:
            raise UnsupportedError(f"Pooling input of {len(self.in_shapes[0])} dims (need c,h,w)")
        if p.adaptive_pooling and not p.global_pooling:
            raise UnsupportedError("adaptive_pooling")
        if p.pad_mode not in (0, 1, 2, 3):
            raise UnsupportedError(f"pad_mode={p.pad_mode}")

    def _pads(self) -> tuple[int, int, int, int, int, int]:
        """(top, left, padded h, padded w, tail h, tail w) for pad_mode 0..3."""
        p = self.params
        _, h, w = self.in_shapes[0]
        kh, kw, sh, sw = p.kernel_h, p.kernel_w, p.stride_h, p.stride_w
        t, b, l, r = p.pad_top, p.pad_bottom, p.pad_left, p.pad_right
        if p.pad_mode in (0, 1):
            tail_h = tail_w = 0
            if p.pad_mode == 0:
                htail, wtail = (h + t + b - kh) % sh, (w + l + r - kw) % sw
                tail_h, tail_w = (sh - htail if htail else 0), (sw - wtail if wtail else 0)
            return t, l, h + t + b + tail_h, w + l + r + tail_w, tail_h, tail_w
        hpad = kh + cdiv(h - 1, sh) * sh - h
        wpad = kw + cdiv(w - 1, sw) * sw - w
        if hpad <= 0 and wpad <= 0:
            return 0, 0, h, w, 0, 0
        hs, ws = cdiv(hpad, 2), cdiv(wpad, 2)
        if p.pad_mode == 2:
            return hs, ws, h + hpad, w + wpad, 0, 0
        return hpad - hs, wpad - ws, h + hpad, w + wpad, 0, 0

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        c, h, w = self.in_shapes[0]
        bindings = (self.layer.inputs[0], self.layer.outputs[0])
        if p.global_pooling:
            return [make_dispatch("pooling_global", bindings, (REDUCE_LOCAL * c, 1, 1), psc=(h * w, c),
                                  fixed=(p.pooling_type,), local_size=(REDUCE_LOCAL, 1, 1))]
        _, outh, outw = self.out_shapes[0]
        top, left, hp, wp, tail_h, tail_w = self._pads()
        # count region: the padded input less the declared pads and the full-mode tail
        count = (p.pad_left, wp - p.pad_right - tail_w, p.pad_top, hp - p.pad_bottom - tail_h)
        psc = (w, h, outw, outh, c, p.kernel_w, p.kernel_h, p.stride_w, p.stride_h, left, top) + count
        return [make_dispatch("pooling", bindings, (outw, outh, c), psc=psc,
                              fixed=(p.pooling_type, int(bool(p.avgpool_count_include_pad))))]
