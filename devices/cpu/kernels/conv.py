"""Convolution, ConvolutionDepthWise and InnerProduct: im2col + GEMM (np.matmul / BLAS).

Weights are narrowed to bf16 once per plan and widened for each call. Padding follows
ncnn's ``make_padding``: positive pads with ``pad_value``; all four pads -233 mean
SAME_UPPER, -234 SAME_LOWER (the extra pixel goes bottom/right resp. top/left).
"""

from __future__ import annotations

import numpy as np

from devices.cpu.kernels.base import (
    Kernel,
    Shape,
    UnsupportedError,
    activate,
    check_activation,
    register,
    widen,
)


def cdiv(a: int, b: int) -> int:
    """C integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def border(x: np.ndarray, top: int, bottom: int, left: int, right: int, value: float) -> np.ndarray:
    """ncnn ``copy_make_border`` on the last two axes; negative amounts cut instead."""
    h, w = x.shape[-2:]
    x = x[..., max(0, -top) : h - max(0, -bottom), max(0, -left) : w - max(0, -right)]
    t, b, l, r = max(0, top), max(0, bottom), max(0, left), max(0, right)
    if t == b == l == r == 0:
        return x
    pad = [(0, 0)] * (x.ndim - 2) + [(t, b), (l, r)]
    return np.pad(x, pad, mode="constant", constant_values=np.float32(value))


def same_pads(size: int, kernel_extent: int, stride: int, lower: bool) -> tuple[int, int]:
    total = kernel_extent + cdiv(size - 1, stride) * stride - size
    small = cdiv(total, 2)
    return (total - small, small) if lower else (small, total - small)


def conv_pads(p: object, h: int, w: int, ext_h: int, ext_w: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) as ncnn's Convolution::make_padding resolves them."""
    pads = (p.pad_top, p.pad_bottom, p.pad_left, p.pad_right)  # type: ignore[attr-defined]
    if any(v > 0 for v in pads):
        return tuple(max(0, v) for v in pads)  # type: ignore[return-value]
    for code, lower in ((-233, False), (-234, True)):
        if all(v == code for v in pads):
            t, b = same_pads(h, ext_h, p.stride_h, lower)  # type: ignore[attr-defined]
            l, r = same_pads(w, ext_w, p.stride_w, lower)  # type: ignore[attr-defined]
            if t > 0 or b > 0 or l > 0 or r > 0:
                return t, b, l, r
            return 0, 0, 0, 0
    return 0, 0, 0, 0


def im2col(
    xp: np.ndarray, kh: int, kw: int, dh: int, dw: int, sh: int, sw: int, oh: int, ow: int
) -> np.ndarray:
    """(C, Hp, Wp) -> (C, kh*kw, oh, ow): one strided slice copy per kernel tap."""
    cols = np.empty((xp.shape[0], kh * kw, oh, ow), dtype=np.float32)
    for ky in range(kh):
        y0 = ky * dh
        for kx in range(kw):
            x0 = kx * dw
            cols[:, ky * kw + kx] = xp[:, y0 : y0 + sh * (oh - 1) + 1 : sh, x0 : x0 + sw * (ow - 1) + 1 : sw]
    return cols


@register("Convolution", "ConvolutionDepthWise")
class Convolution(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        if len(in_shapes[0]) != 3:
            raise UnsupportedError(f"input of {len(in_shapes[0])} dims (need c,h,w)")
        if p.int8_scale_term:
            raise UnsupportedError("int8 weights")
        check_activation(p.activation_type)
        c, h, w = in_shapes[0]
        self.group = p.group if self.layer.type == "ConvolutionDepthWise" else 1
        g = self.group
        if c % g or p.num_output % g:
            raise UnsupportedError(f"channels {c} / num_output {p.num_output} not divisible by group {g}")
        kh, kw = p.kernel_h, p.kernel_w
        self.ext_h = p.dilation_h * (kh - 1) + 1
        self.ext_w = p.dilation_w * (kw - 1) + 1
        self.pads = conv_pads(p, h, w, self.ext_h, self.ext_w)
        t, b, l, r = self.pads
        oh = (h + t + b - self.ext_h) // p.stride_h + 1
        ow = (w + l + r - self.ext_w) // p.stride_w + 1
        if oh <= 0 or ow <= 0:
            raise UnsupportedError(f"empty output for input {in_shapes[0]}")
        expected = p.num_output * (c // g) * kh * kw
        self.weight = self.bf16_weight(0)
        if self.weight.size != expected:
            raise UnsupportedError(f"weight has {self.weight.size} values, expected {expected}")
        self.bias = self.bf16_weight(1) if p.bias_term else None
        return [(p.num_output, oh, ow)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p, g = self.p, self.group
        x = xs[0]
        c = x.shape[0]
        oc, oh, ow = self.out_shapes[0]
        kh, kw = p.kernel_h, p.kernel_w
        t, b, l, r = self.pads
        xp = border(x, t, b, l, r, p.pad_value)
        taps = kh * kw
        weight = widen(self.weight)
        if c // g == 1:
            # depthwise (optionally with a channel multiplier): one multiply-add per tap
            mult = oc // g
            wt = weight.reshape(oc, taps)
            src = xp if mult == 1 else np.repeat(xp, mult, axis=0)
            y = np.zeros((oc, oh, ow), dtype=np.float32)
            for ky in range(kh):
                y0 = ky * p.dilation_h
                for kx in range(kw):
                    x0 = kx * p.dilation_w
                    win = src[:, y0 : y0 + p.stride_h * (oh - 1) + 1 : p.stride_h,
                              x0 : x0 + p.stride_w * (ow - 1) + 1 : p.stride_w]
                    y += wt[:, ky * kw + kx, None, None] * win
        else:
            if taps == 1 and p.stride_h == 1 and p.stride_w == 1:
                cols = xp.reshape(g, c // g, oh * ow)
            else:
                cols = im2col(xp, kh, kw, p.dilation_h, p.dilation_w, p.stride_h, p.stride_w, oh, ow)
                cols = cols.reshape(g, (c // g) * taps, oh * ow)
            y = np.matmul(weight.reshape(g, oc // g, (c // g) * taps), cols).reshape(oc, oh, ow)
        if self.bias is not None:
            y += widen(self.bias)[:, None, None]
        return [activate(y, p.activation_type, p.activation_params)]


@register("InnerProduct")
class InnerProduct(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        if p.int8_scale_term:
            raise UnsupportedError("int8 weights")
        check_activation(p.activation_type)
        shape = in_shapes[0]
        self.weight = self.bf16_weight(0)
        if self.weight.size % p.num_output:
            raise UnsupportedError(f"weight size {self.weight.size} vs num_output {p.num_output}")
        self.num_input = self.weight.size // p.num_output
        self.bias = self.bf16_weight(1) if p.bias_term else None
        # ncnn: a 2-D input whose rows are num_input wide is a batch of rows (gemm)
        self.rows = len(shape) == 2 and shape[1] == self.num_input and shape[0] > 1
        if self.rows:
            return [(shape[0], p.num_output)]
        if int(np.prod(shape)) != self.num_input:
            raise UnsupportedError(f"input {shape} has {int(np.prod(shape))} values, weights expect {self.num_input}")
        return [(p.num_output,)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        weight = widen(self.weight).reshape(p.num_output, self.num_input)
        if self.rows:
            y = xs[0] @ weight.T
        else:
            y = weight @ xs[0].reshape(-1)
        if self.bias is not None:
            y += widen(self.bias)
        return [activate(y, p.activation_type, p.activation_params)]
