"""Convolution and ConvolutionDepthWise on Vulkan: three shaders chosen per layer.

- ``convdw``: depthwise (one input and one output channel per group), one output per
  invocation, weights in ncnn's order;
- ``conv1x1``: 1x1 / stride 1 / unpadded / one group, a GEMM; 4 output channels x 4 pixels per
  invocation;
- ``conv``: everything else (groups, stride, dilation, pads and pad_value), 4 output channels
  of one group per invocation.

Padding is resolved on the host exactly as the CPU engine does (ncnn's ``make_padding``,
including the -233 / -234 SAME modes); the shaders only need the left/top pad because the
output size fixes the rest. Weights of the two 4-channel shaders are re-laid out so that the
4 output channels of a tile are one vec4 and consecutive in the inner loop, padded with zeros
to a multiple of 4 channels per group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from devices.capabilities import Precision
from devices.cpu.kernels.base import UnsupportedError
from devices.cpu.kernels.conv import conv_pads
from devices.vulkan.layers.base import Dispatch, Shape, VulkanLayer, register
from devices.vulkan.layers.compute_util import activation_constants, local_size_3d, make_dispatch
from models.graph import Layer


def _tiles(n: int) -> int:
    return (n + 3) // 4


@register("Convolution", "ConvolutionDepthWise")
class VulkanConvolution(VulkanLayer):
    """Picks the shader (``kind``) and lays the weights out for it once, at construction."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        if len(self.in_shapes[0]) != 3:
            raise UnsupportedError(f"{layer.type} input of {len(self.in_shapes[0])} dims (need c,h,w)")
        if p.int8_scale_term:
            raise UnsupportedError("int8 weights")
        self.activation = activation_constants(p.activation_type, p.activation_params)
        c, h, w = self.in_shapes[0]
        oc, self.outh, self.outw = self.out_shapes[0]
        self.groups = p.group_count()
        if c % self.groups or oc % self.groups:
            raise UnsupportedError(f"channels {c} / num_output {oc} not divisible by group {self.groups}")
        self.icg, self.ocg = c // self.groups, oc // self.groups
        ext_h = p.dilation_h * (p.kernel_h - 1) + 1
        ext_w = p.dilation_w * (p.kernel_w - 1) + 1
        self.pad_top, _, self.pad_left, _ = conv_pads(p, h, w, ext_h, ext_w)
        unpadded = (self.outh, self.outw) == (h, w) and self.pad_top == self.pad_left == 0
        if self.icg == 1 and self.ocg == 1:
            self.kind = "convdw"
        elif (p.kernel_w == p.kernel_h == 1 and p.stride_w == p.stride_h == 1 and unpadded
              and self.groups == 1):
            self.kind = "conv1x1"
        else:
            self.kind = "conv"
        maxk = p.kernel_h * p.kernel_w
        weight = np.asarray(layer.weights[0], dtype=np.float32).ravel()
        if weight.size != oc * self.icg * maxk:
            raise UnsupportedError(f"weight has {weight.size} values, expected {oc * self.icg * maxk}")
        bias = (np.asarray(layer.weights[1], dtype=np.float32).ravel() if p.bias_term
                else np.zeros(oc, np.float32))
        self._weights = self._layout(weight, bias, maxk)

    def _layout(self, weight: np.ndarray, bias: np.ndarray, maxk: int) -> dict[str, np.ndarray]:
        if self.kind == "convdw":
            return {"weight": weight, "bias": bias}
        g, icg, ocg = self.groups, self.icg, self.ocg
        tiles = _tiles(ocg)
        wt = np.zeros((g, tiles * 4, icg, maxk), np.float32)
        wt[:, :ocg] = weight.reshape(g, ocg, icg, maxk)
        # [g][tile][4][icg][k] -> [g][tile][icg][k][4]
        wt = wt.reshape(g, tiles, 4, icg, maxk).transpose(0, 1, 3, 4, 2)
        bt = np.zeros((g, tiles * 4), np.float32)
        bt[:, :ocg] = bias.reshape(g, ocg)
        return {"weight": np.ascontiguousarray(wt).ravel(), "bias": bt.ravel()}

    def weights(self) -> dict[str, np.ndarray]:
        return dict(self._weights)

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        c, h, w = self.in_shapes[0]
        oc, outh, outw = self.out_shapes[0]
        bindings = (self.layer.inputs[0], self.layer.outputs[0], "w:weight", "w:bias")
        if self.kind == "conv1x1":
            size = h * w
            quarter = (size + 3) // 4
            # 32 pixels along x: a subgroup reads 32 consecutive input values per load and
            # shares one weight vec4 (one tile)
            gsize = (quarter, _tiles(oc), 1)
            return [make_dispatch("conv1x1", bindings, gsize, psc=(size, quarter, c, oc),
                                  fixed=self.activation, local_size=local_size_3d(*gsize, max_x=32))]
        if self.kind == "convdw":
            psc = (w, h, outw, outh, c, p.kernel_w, p.kernel_h, p.dilation_w, p.dilation_h,
                   p.stride_w, p.stride_h, self.pad_left, self.pad_top, float(p.pad_value))
            return [make_dispatch("convdw", bindings, (outw, outh, c), psc=psc, fixed=self.activation)]
        tiles = _tiles(self.ocg)
        psc = (w, h, outw, outh, self.icg, self.ocg, tiles, self.groups, p.kernel_w, p.kernel_h,
               p.dilation_w, p.dilation_h, p.stride_w, p.stride_h, self.pad_left, self.pad_top,
               float(p.pad_value))
        return [make_dispatch("conv", bindings, (outw, outh, tiles * self.groups), psc=psc,
                              fixed=self.activation)]
