"""Pooling (max / average; global; adaptive; pad_mode 0 full, 1 valid, 2 SAME_UPPER,
3 SAME_LOWER) of a 3-D blob, or of a 2-D / 1-D one as a single channel.

The padding and the divisor of averages are the layer's (``PoolingParams.pads`` and
``count_region``); with ``avgpool_count_include_pad`` an average divides by
kernel_w * kernel_h. Adaptive windows are ``PoolingParams.adaptive_windows``.

The windowed form runs as the numba kernel ``jit.pooling.pool2d`` (in a Plan straight from the
bf16 arena into it; the same bits as ``forward``'s numpy passes), on AVX-512 hosts max pooling
of 2x2 and 3x3 windows at stride 1 and 2 as ``jit.poolrows.max_pool_rows`` (the same bits), global
average pooling as ``jit.pooling.global_avg`` (in ``forward`` too), and so an average over one
window that is the whole unpadded plane; global max and adaptive pooling widen into a scratch
buffer and run numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.bf16 import BF16_LOWEST, narrow_exact_into, to_bf16, widen_into
from vkserve.devices.cpu.kernels.base import Kernel, StepCall, register
from vkserve.devices.cpu.kernels.conv import border, fill_border
from vkserve.models.layers import Shape


def pool_windows(
    xp: np.ndarray, kh: int, kw: int, sh: int, sw: int, oh: int, ow: int, is_max: bool,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Max or sum over each window; a loop over kernel taps, vectorised over channels/pixels."""
    acc: np.ndarray | None = None
    for ky in range(kh):
        for kx in range(kw):
            win = xp[..., ky : ky + sh * (oh - 1) + 1 : sh, kx : kx + sw * (ow - 1) + 1 : sw]
            if acc is None:
                if out is None:
                    acc = win.astype(np.float32, copy=True)
                else:
                    acc = out
                    np.copyto(acc, win)
            elif is_max:
                np.maximum(acc, win, out=acc)
            else:
                acc += win
    assert acc is not None
    return acc


@register("Pooling")
class Pooling(Kernel):
    raw_inputs = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        out = super().infer(in_shapes)
        self.view = p.image_view(in_shapes[0])
        _, h, w = self.view
        # values read: each output's window (or the whole plane once, for global pooling)
        self.work = math.prod(self.view) if p.global_pooling else (
            math.prod(out[0]) * p.kernel_h * p.kernel_w)
        self.adaptive = bool(p.adaptive_pooling) and not p.global_pooling
        self.whole_plane = False
        if p.global_pooling or self.adaptive:
            self.exact_store = p.pooling_type == 0
            if self.adaptive:
                oh, ow = p.adaptive_size(h, w)
                self.rows, self.cols = p.adaptive_windows(h, oh), p.adaptive_windows(w, ow)
            return out
        _, oh, ow = out[0]
        kh, kw, sh, sw = p.kernel_h, p.kernel_w, p.stride_h, p.stride_w
        self.pads = pads = p.pads(h, w)
        hp, wp = h + pads[0] + pads[1], w + pads[2] + pads[3]
        # a maximum of bf16 values is one (the border too: BF16_LOWEST)
        self.exact_store = p.pooling_type == 0
        self.divisor: np.ndarray | None = None
        if p.pooling_type == 1 and not p.avgpool_count_include_pad:
            y0, y1, x0, x1 = p.count_region(h, w)
            valid = np.zeros((hp, wp), dtype=np.float32)
            valid[y0:y1, x0:x1] = 1.0
            self.divisor = pool_windows(valid, kh, kw, sh, sw, oh, ow, is_max=False)
        c = self.view[0]
        self.geo = jit.geometry(c, 1, 1, kh, kw, sh, sw, 1, 1, pads[0], pads[2], oh, ow)
        self.row_runs = jit.poolrows.worthwhile(kh, kw, sh, sw, p.pooling_type == 0)
        #: a windowed average over one window that is the whole unpadded plane (resnet's 7x7
        #: ``pool5``) is a global average: ``pool2d`` took a pass per tap for its one output a
        #: channel (resnet50's 2048 x 7 x 7: 0.47 ms on one thread of the 2-core VM)
        self.whole_plane = (p.pooling_type == 1 and (kh, kw, oh, ow) == (h, w, 1, 1)
                            and tuple(pads) == (0, 0, 0, 0))
        return out

    def _global_avg(self, x: np.ndarray, out: np.ndarray) -> jit.KernelCall:
        """``jit.pooling.global_avg`` of ``x`` (the image view) into ``out`` (C values)."""
        c = self.view[0]
        return jit.KernelCall(jit.pooling.global_avg, (x.reshape(c, -1), jit.task_count(c), out.reshape(1, c)),
                              self.work)

    @property
    def global_avg(self) -> bool:
        return (bool(self.p.global_pooling) and self.p.pooling_type == 1) or self.whole_plane

    @property
    def windowed(self) -> bool:
        return not (self.p.global_pooling or self.adaptive)

    def _pool(self, x: np.ndarray, out: np.ndarray) -> jit.KernelCall:
        """``jit.pooling.pool2d`` of ``x`` (bf16 or fp32) into ``out`` (same dtype rules), or
        ``jit.poolrows``' row runs where they apply."""
        p = self.p
        c, oh, ow = self.out_shapes[0]
        is_max = p.pooling_type == 0
        if self.row_runs and x.dtype == np.uint16 and out.dtype == np.uint16 and x.flags.c_contiguous:
            return jit.KernelCall(jit.poolrows.max_pool_rows, (
                x.reshape(self.view), self.geo, np.float32(BF16_LOWEST), out.reshape(c, oh * ow), jit.task_count(c)),
                self.work)
        divisor = self.divisor if self.divisor is not None else np.zeros((0, 0), dtype=np.float32)
        return jit.KernelCall(jit.pooling.pool2d, (
            x.reshape(self.view), self.geo, is_max, np.float32(BF16_LOWEST if is_max else 0.0), divisor,
            np.float32(1.0 / (p.kernel_h * p.kernel_w)), out.reshape(c, oh * ow), jit.task_count(c)), self.work)

    def store_call(self, us: list[np.ndarray], outs: list[np.ndarray], post: Sequence[Kernel]) -> StepCall | None:
        if self.global_avg:
            return self._global_avg(us[0], outs[0])
        if self.windowed:
            return self._pool(us[0], outs[0])
        return None

    def forward_store(self, us: list[np.ndarray], outs: list[np.ndarray], post: list[Kernel]) -> None:
        """bf16 arena in and out (the Plan's path; no activation is ever fused into Pooling)."""
        call = self.store_call(us, outs, post)
        if call is not None:
            call()
            return
        y = self.forward([widen_into(us[0], self.buf("in", us[0].shape))])[0]
        if self.exact_store:
            narrow_exact_into(y, outs[0])
        else:
            to_bf16(y, out=outs[0], scratch=self.buf("narrow", y.size, np.uint32))

    def forward_bf16(self, us: list[np.ndarray]) -> list[np.ndarray]:
        if self.global_avg:
            out = self.buf("out", self.out_shapes[0])
            self._global_avg(np.ascontiguousarray(us[0]), out)()
            return [out]
        if self.windowed:
            out = self.buf("out", self.out_shapes[0])
            self._pool(np.ascontiguousarray(us[0]), out)()
            return [out]
        x = us[0]  # bf16 from the arena, or fp32 (a data-dependent blob)
        return self.forward([widen_into(x, self.buf("in", x.shape)) if x.dtype == np.uint16 else x])

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        x = xs[0].reshape(self.view)
        is_max = p.pooling_type == 0
        if self.adaptive:
            return [self.adaptive_pool(x, is_max).reshape(self.out_shapes[0])]
        if self.global_avg:
            out = self.buf("out", self.out_shapes[0])
            self._global_avg(np.ascontiguousarray(x), out)()
            return [out]
        if p.global_pooling:
            return [x.reshape(x.shape[0], -1).max(axis=1)]
        c, oh, ow = self.out_shapes[0]
        t, b, l, r = self.pads
        if min(t, b, l, r) < 0:
            xp = border(x, t, b, l, r, BF16_LOWEST if is_max else 0.0)  # negative pads crop
        elif t or b or l or r:
            # the padded input in a reusable scratch buffer (no per-run allocation)
            h, w = x.shape[1:]
            xp = self.buf("pad", (c, h + t + b, w + l + r))
            np.copyto(xp[:, t : t + h, l : l + w], x)
            fill_border(xp, t, b, l, r, BF16_LOWEST if is_max else 0.0)
        else:
            xp = x
        y = pool_windows(xp, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, oh, ow, is_max,
                         out=self.buf("out", (c, oh, ow)))
        if not is_max:
            if self.divisor is not None:
                y /= self.divisor
            else:
                y *= np.float32(1.0 / (p.kernel_h * p.kernel_w))
        return [y]

    def adaptive_pool(self, x: np.ndarray, is_max: bool) -> np.ndarray:
        """Max, or sum / rows / columns (ncnn's order), over each adaptive window."""
        y = np.empty((x.shape[0], len(self.rows), len(self.cols)), np.float32)
        for i, (y0, y1) in enumerate(self.rows):
            for j, (x0, x1) in enumerate(self.cols):
                win = x[:, y0:y1, x0:x1].reshape(x.shape[0], -1)
                if is_max:
                    y[:, i, j] = win.max(axis=1)
                else:
                    y[:, i, j] = win.sum(axis=1, dtype=np.float32) / np.float32(y1 - y0) / np.float32(x1 - x0)
        return y
