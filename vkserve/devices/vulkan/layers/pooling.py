"""Pooling on Vulkan: windowed and adaptive max / average (``pooling``), global
(``pooling_global``).

With ``VKSERVE_IMAGES=1`` windowed and adaptive pooling read the input as a 3D image
(``pooling.comp`` compiled with NCNN_image_shader: the engine's layer implemented with images;
`vulkan.image.images_wanted`).

The padding is the layer's (``PoolingParams.pads``: ncnn's ``Pooling::make_padding``); the
shader needs only the left/top pad (the output size fixes the rest) and, for averages without
``avgpool_count_include_pad``, the region whose cells count towards the divisor
(``PoolingParams.count_region``).
"""

from __future__ import annotations

from vkserve.devices.capabilities import DeviceCaps
from vkserve.devices.vulkan.image import images_wanted
from vkserve.devices.vulkan.layers.base import Dispatch, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL, make_dispatch


@register("Pooling")
class VulkanPooling(VulkanLayer):
    """Max / average pooling of a 3-D blob (or a 2-D / 1-D one as one channel: the layer's
    ``image_view``), windowed (pad modes 0..3), adaptive or global."""

    use_image = False  # the input read as a 3D image (specialize)

    def specialize(self, caps: DeviceCaps) -> None:
        c, h, w = self.params.image_view(self.in_shapes[0])
        self.use_image = (not self.params.global_pooling and len(self.in_shapes[0]) <= 3
                          and images_wanted(caps, self.precision, (w, h, c)))

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
        if self.use_image:
            bindings = ("img:" + self.layer.inputs[0], self.layer.outputs[0])
        return [make_dispatch("pooling", bindings, (outw, outh, c), psc=psc,
                              fixed=(p.pooling_type, int(bool(p.avgpool_count_include_pad)), adaptive))]
