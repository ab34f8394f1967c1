"""Deconvolution and DeconvolutionDepthWise on Vulkan: one ``deconv`` dispatch.

One invocation per output element gathers over the kernel taps (and the group's input
channels) that reach it, with float sums in every precision mode. Output shape and the pads cut
off the full output are the layer's (``vkserve.models.layers._DeconvolutionBase``: ``pads``,
ncnn's cut_padding); the shader only needs the top / left cut. Weights stay in ncnn's order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.layers.base import Dispatch, Shape, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import activation_constants, make_dispatch
from vkserve.models.graph import Layer


@register("Deconvolution", "DeconvolutionDepthWise")
class VulkanDeconvolution(VulkanLayer):
    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        self.activation = activation_constants(p.activation_type, p.activation_params)
        c, h, w = self.in_shapes[0]
        oc = self.out_shapes[0][0]
        groups = p.group_count()
        self.icg, self.ocg = c // groups, oc // groups
        self.cut_top, _, self.cut_left, _ = p.pads(h, w)

    def weights(self) -> dict[str, np.ndarray]:
        """Read when asked for, never kept (see VulkanInnerProduct.weights)."""
        p, ws = self.params, self.layer.weights
        bias = (np.asarray(ws[1], dtype=np.float32).ravel() if p.bias_term
                else np.zeros(self.out_shapes[0][0], np.float32))
        return {"weight": np.asarray(ws[0], dtype=np.float32).ravel(), "bias": bias}

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        _, h, w = self.in_shapes[0]
        oc, outh, outw = self.out_shapes[0]
        bindings = (self.layer.inputs[0], self.layer.outputs[0], "w:weight", "w:bias")
        psc = (w, h, outw, outh, self.icg, self.ocg, oc, p.kernel_w, p.kernel_h, p.dilation_w,
               p.dilation_h, p.stride_w, p.stride_h, self.cut_left, self.cut_top)
        return [make_dispatch("deconv", bindings, (outw, outh, oc), psc=psc, fixed=self.activation)]
