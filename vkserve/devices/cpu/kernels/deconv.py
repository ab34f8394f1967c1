"""Deconvolution and DeconvolutionDepthWise: one GEMM per group, then a scatter-add per tap.

Output shape and the pads cut off the full output are the layer's
(``vkserve.models.layers._DeconvolutionBase``: ``full_size`` and ``pads``, ncnn's
cut_padding). Weights are narrowed to bf16 once per plan and widened for each call; the bias
stays fp32; the sums are fp32.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.kernels.base import Kernel, activate, register
from vkserve.models.layers import Shape


@register("Deconvolution", "DeconvolutionDepthWise")
class Deconvolution(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        _, h, w = in_shapes[0]
        self.groups = p.group_count()
        self.full = p.full_size(h, w)
        self.cut = p.pads(h, w)
        self.weight = self.bf16_weight(0)
        self.bias = self.fp32_bias(1) if p.bias_term else None
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        x = np.asarray(xs[0], dtype=np.float32)
        c, h, w = x.shape
        g, oc = self.groups, p.num_output
        icg, ocg = c // g, oc // g
        kh, kw = p.kernel_h, p.kernel_w
        maxk = kh * kw
        # [g][ocg][icg][k] -> [g][k * ocg][icg]
        wt = from_bf16(self.weight).reshape(g, ocg, icg, maxk).transpose(0, 3, 1, 2)
        wt = wt.reshape(g, maxk * ocg, icg)
        cols = np.matmul(wt, x.reshape(g, icg, h * w))  # (g, k * ocg, h * w)
        cols = cols.reshape(g, kh, kw, ocg, h, w).transpose(1, 2, 0, 3, 4, 5).reshape(kh, kw, oc, h, w)
        fh, fw = self.full
        full = np.zeros((oc, fh, fw), np.float32)
        sh, sw, dh, dw = p.stride_h, p.stride_w, p.dilation_h, p.dilation_w
        for ky in range(kh):
            y0 = ky * dh
            for kx in range(kw):
                x0 = kx * dw
                full[:, y0 : y0 + (h - 1) * sh + 1 : sh, x0 : x0 + (w - 1) * sw + 1 : sw] += cols[ky, kx]
        if self.bias is not None:
            full += self.bias[:, None, None]
        t, b, l, r = self.cut
        y = np.ascontiguousarray(full[:, t : fh - b, l : fw - r])
        return [activate(y, p.activation_type, p.activation_params)]
