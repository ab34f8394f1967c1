"""Pooling on Vulkan: windowed and adaptive max / average (``pooling``), global
(``pooling_global``).

The padding is the layer's (``PoolingParams.pads``: ncnn's ``Pooling::make_padding``); the
shader needs only the left/top pad (the output size fixes the rest) and, for averages without
``avgpool_count_include_pad``, the region whose cells count towards the divisor
(``PoolingParams.count_region``).
"""

from __future__ import annotations

from vkserve.devices.vulkan.layers.base import Dispatch, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL, make_dispatch


@register("Pooling")
class VulkanPooling(VulkanLayer):
    """Max / average pooling of a 3-D blob (or a 2-D / 1-D one as one channel: the layer's
    ``image_view``), windowed (pad modes 0..3), adaptive or global."""

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        c, h, w = p.image_view(self.in_shapes[0])
        bindings = (self.layer.inputs[0], self.layer.outputs[0])
        if p.global_pooling:
            return [make_dispatch("pooling_global", bindings, (REDUCE_LOCAL * c, 1, 1), psc=(h * w, c),
                                  fixed=(p.pooling_type,), local_size=(REDUCE_LOCAL, 1, 1))]
        adaptive = int(bool(p.adaptive_pooling))
        if adaptive:
            outh, outw = p.adaptive_size(h, w)
            psc: tuple[int, ...] = (w, h, outw, outh, c) + (0,) * 10
        else:
            _, outh, outw = self.out_shapes[0]
            top, _, left, _ = p.pads(h, w)
            y0, y1, x0, x1 = p.count_region(h, w)
            psc = (w, h, outw, outh, c, p.kernel_w, p.kernel_h, p.stride_w, p.stride_h, left, top,
                   x0, x1, y0, y1)
        return [make_dispatch("pooling", bindings, (outw, outh, c), psc=psc,
                              fixed=(p.pooling_type, int(bool(p.avgpool_count_include_pad)), adaptive))]
