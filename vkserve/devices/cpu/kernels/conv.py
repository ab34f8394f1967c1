"""Convolution, ConvolutionDepthWise and InnerProduct on the numba kernels of
``vkserve.devices.cpu.jit``.

Weights are narrowed to bf16 and packed once (in ``infer``) into the layout the kernel reads;
biases stay fp32. In a Plan the kernels read their bf16 input from the arena and store their
bf16 output (RNE) into it themselves (``forward_store``): the layer's activation and the
activation layers the executor fused in are applied to each fp32 tile right before its store,
so no fp32 copy of a whole blob is made. Padding is the layer's (``ConvolutionParams.pads``:
ncnn's make_padding; negative pads crop), read as ``pad_value``.
"""

from __future__ import annotations

import math

import numpy as np

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.kernels.base import register
from vkserve.devices.cpu.kernels.jitted import JitCall, JitKernel
from vkserve.models.layers import Shape


def border(x: np.ndarray, top: int, bottom: int, left: int, right: int, value: float) -> np.ndarray:
    """ncnn ``copy_make_border`` on the last two axes; negative amounts cut instead."""
    h, w = x.shape[-2:]
    x = x[..., max(0, -top) : h - max(0, -bottom), max(0, -left) : w - max(0, -right)]
    t, b, l, r = max(0, top), max(0, bottom), max(0, left), max(0, right)
    if t == b == l == r == 0:
        return x
    pad = [(0, 0)] * (x.ndim - 2) + [(t, b), (l, r)]
    return np.pad(x, pad, mode="constant", constant_values=np.float32(value))


def fill_border(xp: np.ndarray, t: int, b: int, l: int, r: int, value: float) -> None:
    """Set the (t, b, l, r) border of the last two axes of ``xp`` to ``value``."""
    h, w = xp.shape[-2:]
    v = np.float32(value)
    if t:
        xp[..., :t, :] = v
    if b:
        xp[..., h - b :, :] = v
    if l:
        xp[..., t : h - b, :l] = v
    if r:
        xp[..., t : h - b, w - r :] = v


@register("Convolution", "ConvolutionDepthWise")
class Convolution(JitKernel):
    """Depthwise (one input channel per group) on AVX-512 hosts by ``jit.dwrows`` (bf16 runs of
    16 outputs in registers; 3x3 and 5x5, stride 1 and 2), else by ``jit.depthwise``, on small
    maps by ``jit.dwblocks`` (16 channels a vector; weights repacked at load); dense with few input
    channels (``jit.direct.worthwhile``: a first layer on an image) by ``jit.direct`` from the
    input's planes (fp32 weights: twice the bf16 bytes, a few KiB there); dense 3x3 stride 1
    where ``jit.winograd.worthwhile`` by Winograd F(4, 3) (fp32 transformed weights: 8x the
    layer's bf16 weight bytes); on AMX hosts the other dense layers of 16 input channels or
    more by ``jit.implicit`` from the input's padded planes (AMX tiles packed at load); on
    ``DOT`` hosts the other dense layers of kernels larger than 1x1 by ``jit.implicit_pairs``
    (bf16 pair products from the input's padded planes, or on narrow maps its column planes);
    the rest (dense and grouped) by ``jit.conv_gemm`` over weight panels packed at load (a
    strided unpadded 1x1 layer on ``DOT`` hosts on its input's decimation,
    ``jit.conv.conv_gemm_decimated``)."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        c, h, w = in_shapes[0]
        oc, oh, ow = out[0]
        g = p.group_count()
        cg, og = c // g, oc // g
        t, _, l, _ = p.pads(h, w)
        self.geo = jit.geometry(g, cg, og, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w,
                                p.dilation_h, p.dilation_w, t, l, oh, ow)
        self.work = oc * oh * ow * cg * p.kernel_h * p.kernel_w
        self.pad_value = np.float32(p.pad_value)
        self.bias = self.fp32_bias(1) if p.bias_term else np.zeros(oc, dtype=np.float32)
        w16 = self.bf16_weight(0)
        self.depthwise = cg == 1
        self.rows = self.depthwise and jit.dwrows.worthwhile(p.kernel_h, p.kernel_w, p.stride_h, p.stride_w,
                                                             p.dilation_h, p.dilation_w, ow)
        self.blocks = self.depthwise and not self.rows and jit.dwblocks.worthwhile(
            p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.dilation_h, p.dilation_w, og, p.pads(h, w), ow)
        self.direct = not self.depthwise and jit.direct.worthwhile(g, cg)
        #: (threads, reads rows directly) -> ``_split``'s answer
        self._splits: dict[tuple[int, bool], tuple[int, int, tuple[int, ...]]] = {}
        self.winograd = (
            not self.direct and g == 1 and (p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.dilation_h, p.dilation_w) == (3, 3, 1, 1, 1, 1)
            and jit.winograd.worthwhile(cg, og, oh, ow))
        self.implicit = (not (self.depthwise or self.direct or self.winograd)
                         and jit.implicit.worthwhile(g, cg))
        self.pairs = (not (self.depthwise or self.direct or self.winograd)
                      and jit.implicit_pairs.worthwhile(g, p.kernel_h * p.kernel_w))
        #: the pairs read column planes (``jit.implicit_pairs.column_planes``)
        self.columns = self.pairs and jit.implicit_pairs.column_planes(self.geo)
        # a per-channel multiply of the input folded in (``Plan._fuse_channel_scales``): by the
        # AMX convolution's fill, or by the GEMM's panels where the layer reads them flat
        flat = ((p.kernel_h, p.kernel_w, p.stride_h, p.stride_w) == (1, 1, 1, 1)
                and tuple(p.pads(h, w)) == (0, 0, 0, 0))
        gemm = not (self.depthwise or self.direct or self.winograd or self.implicit or self.pairs)
        self.channel_scale = self.implicit or self.pairs or (gemm and g == 1 and flat)
        #: a strided 1x1 layer's GEMM on its input's decimation (``jit.conv.conv_gemm_decimated``),
        #: with this stride-1 geometry
        self.decimated_geo = (jit.geometry(1, cg, og, 1, 1, 1, 1, 1, 1, 0, 0, oh, ow)
                              if gemm and jit.conv.decimates(self.geo, g) else None)
        if self.blocks:
            self.weight = jit.dwblocks.pack_weights(w16, oc, p.kernel_h * p.kernel_w)
            self.block_bias = jit.dwblocks.pack_bias(self.bias)
        elif self.depthwise:
            self.weight = w16.reshape(oc, p.kernel_h * p.kernel_w)
        elif self.direct:
            self.weight = jit.direct.pack_weights(from_bf16(w16), oc, cg * p.kernel_h * p.kernel_w)
        elif self.winograd:
            self.weight = jit.winograd.transform_weights(w16, og, cg)
        elif self.implicit:
            self.weight = jit.implicit.pack_weights(w16, og, cg, p.kernel_h * p.kernel_w)
        elif self.pairs:
            self.weight = jit.implicit_pairs.pack_weights(w16, og, cg, p.kernel_h * p.kernel_w)
        else:
            self.weight = jit.pack_gemm_weights(w16, g, og, cg * p.kernel_h * p.kernel_w)
        return out

    def _split(self, n_threads: int, direct: bool = False) -> tuple[int, int, tuple[int, ...]]:
        """How the work is split on ``n_threads`` threads, worked out once per thread count:
        Winograd (tile blocks a task, row blocks a task, its work space's shape); from the
        input's planes (0, row blocks a task, the planes' shape); GEMM (pixels a task, row
        blocks a task, the shared input panels' shape; none where it reads its input rows
        ``direct``ly, ``jit.conv.reads_rows``)."""
        got = self._splits.get((n_threads, direct))
        if got is None:
            oc, oh, ow = self.out_shapes[0]
            if self.winograd:  # (the tile blocks a task multiplies: its pixels, to the row split)
                blocks = jit.winograd.blocks_per_task(self.weight)
                rows = jit.gemm_row_chunks(1, oc, -(-oh // 4) * -(-ow // 4), n_threads, blocks * jit.winograd.TB,
                                           jit.winograd.MIN_TASK_ROWS)
                got = blocks, rows, jit.winograd.transformed_shape(self.geo, self.in_shapes[0][0], rows,
                                                                    self.weight.shape[1])
            elif self.implicit:
                got = 0, jit.implicit.split(oc, self.geo, n_threads), jit.implicit.planes_shape(self.geo,
                                                                                                  self.in_shapes[0][0])
            elif self.pairs:
                got = (0, jit.implicit_pairs.split(oc, self.geo, n_threads, self.columns),
                       jit.implicit_pairs.pairs_planes_shape(self.geo, self.in_shapes[0][0], self.columns))
            else:
                g = self.p.group_count()
                pixels, rows = jit.gemm_split(g, oc // g, oh * ow, n_threads)
                k = self.in_shapes[0][0] // g * self.p.kernel_h * self.p.kernel_w
                got = pixels, rows, jit.conv.shared_panels_shape(g, oc // g, oh * ow, k, pixels, rows, direct)
            self._splits[n_threads, direct] = got
        return got

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        x = xs[0]
        oc, oh, ow = self.out_shapes[0]
        flat_out = out.reshape(oc, oh * ow)
        if self.blocks:
            return jit.dwblocks.depthwise_blocks, (x, x.reshape(x.shape[0], -1), self.weight, self.block_bias, ops,
                                                   self.pad_value, self.geo, jit.task_count(self.weight.shape[0]),
                                                   flat_out)
        # (the row runs read x flat: the Plan's arena views are contiguous, a strided view is not)
        if self.rows and x.dtype == np.uint16 and out.dtype == np.uint16 and x.flags.c_contiguous:
            return jit.dwrows.depthwise_rows, (x, self.weight, self.bias, ops, self.pad_value, self.geo,
                                               jit.task_count(oc), flat_out)
        if self.depthwise:
            xrows = x.reshape(x.shape[0], -1)  # (a copy only if x were not contiguous)
            return jit.depthwise, (x, xrows, self.weight, self.bias, ops, self.pad_value, self.geo,
                                   jit.task_count(oc), flat_out)
        if self.direct:
            work = self.buf("direct_planes", (jit.direct.planes_size(self.geo, x.shape[0]),))
            return jit.direct.conv_direct, (x, self.weight, self.bias, ops, self.pad_value, self.geo, work,
                                            jit.task_count(oc * oh * ow), flat_out)
        scale = xs[1].reshape(-1) if len(xs) > 1 else x[:0, 0, 0]  # a fused channel scale, or none
        decimated = self.decimated_geo is not None and x.dtype == np.uint16
        # (the GEMM's input: the decimation, if any, which it may read by rows as a stride-1 layer's)
        geo, in_shape = (self.decimated_geo, (x.shape[0], oh, ow)) if decimated else (self.geo, x.shape)
        pixels, rows, shape = self._split(jit.kernel_threads(), jit.conv.reads_rows(
            geo, in_shape, x.dtype == np.uint16, scale.size > 0))
        if self.implicit or self.pairs:
            planes = self.buf("implicit_planes", shape, np.uint16)
            head = (x, x.reshape(x.shape[0], -1), scale, self.channel_scale_act, self.weight, self.bias, ops,
                    self.pad_value, self.geo)
            tail = (rows, planes, jit.task_count(oc * oh * ow), flat_out)
            if self.implicit:
                return jit.implicit.conv_planes, (*head, *tail)
            return jit.implicit_pairs.conv_pairs, (*head, self.columns, *tail)
        if self.winograd:  # (its split's first value: tile blocks a task)
            return jit.winograd.winograd43, (x, self.weight, self.bias, ops, self.pad_value, self.geo, rows, pixels,
                                             self.buf("winograd", shape), flat_out)
        shared = self.buf("gemm_panels", shape, jit.conv.PANEL) if shape[0] else np.empty(shape, jit.conv.PANEL)
        if decimated:
            dec = self.buf("decimated", in_shape, np.uint16)
            return jit.conv.conv_gemm_decimated, (x, self.p.stride_h, self.p.stride_w, dec, scale,
                                                  self.channel_scale_act, self.weight, self.bias, ops, self.pad_value,
                                                  geo, pixels, rows, shared, jit.task_count(oc * oh * ow), flat_out)
        return jit.conv_gemm, (x, scale, self.channel_scale_act, self.weight, self.bias, ops, self.pad_value, self.geo,
                               pixels, rows, shared, jit.task_count(oc * oh * ow), flat_out)


@register("InnerProduct")
class InnerProduct(JitKernel):
    """y = W x (+ bias) by ``jit.inner_product``: a flat input is one row; ncnn's gemm form (a
    2-D input of num_input-wide rows) gives one output row per input row. A batch's items are
    more rows of the same product (each block of weights read once for all of them)."""

    batched = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        self.num_input = p.num_input()
        self.work = math.prod(in_shapes[0]) * p.num_output  # rows x num_input x num_output
        self.bias = self.fp32_bias(1) if p.bias_term else np.zeros(p.num_output, dtype=np.float32)
        self.weight = jit.pack_rows(self.layer.weights[0], p.num_output, self.num_input)
        return out

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        n_out = self.p.num_output
        return jit.inner_product, (xs[0].reshape(-1, self.num_input), self.weight, self.bias, ops,
                                   out.reshape(-1, n_out))
