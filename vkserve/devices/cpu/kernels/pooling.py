"""Pooling (max / average; global; adaptive; pad_mode 0 full, 1 valid, 2 SAME_UPPER,
3 SAME_LOWER) of a 3-D blob, or of a 2-D / 1-D one as a single channel.

The padding and the divisor of averages are the layer's (``PoolingParams.pads`` and
``count_region``); with ``avgpool_count_include_pad`` an average divides by
kernel_w * kernel_h. Adaptive windows are ``PoolingParams.adaptive_windows``.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.kernels.base import Kernel, register
from vkserve.devices.cpu.kernels.conv import border, fill_border
from vkserve.models.layers import FLT_MAX, Shape


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
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        out = super().infer(in_shapes)
        self.view = p.image_view(in_shapes[0])
        _, h, w = self.view
        self.adaptive = bool(p.adaptive_pooling) and not p.global_pooling
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
        # a maximum of bf16 values is one, unless a window lies wholly in the -FLT_MAX border
        # (never when every border is narrower than the window and windows do not skip rows)
        self.exact_store = (
            p.pooling_type == 0 and max(pads[0], pads[1]) < kh and max(pads[2], pads[3]) < kw
            and sh <= kh and sw <= kw
        )
        self.divisor: np.ndarray | None = None
        if p.pooling_type == 1 and not p.avgpool_count_include_pad:
            y0, y1, x0, x1 = p.count_region(h, w)
            valid = np.zeros((hp, wp), dtype=np.float32)
            valid[y0:y1, x0:x1] = 1.0
            self.divisor = pool_windows(valid, kh, kw, sh, sw, oh, ow, is_max=False)
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        x = xs[0].reshape(self.view)
        is_max = p.pooling_type == 0
        if self.adaptive:
            return [self.adaptive_pool(x, is_max).reshape(self.out_shapes[0])]
        if p.global_pooling:
            flat = x.reshape(x.shape[0], -1)
            return [flat.max(axis=1) if is_max else flat.mean(axis=1, dtype=np.float32)]
        c, oh, ow = self.out_shapes[0]
        t, b, l, r = self.pads
        if min(t, b, l, r) < 0:
            xp = border(x, t, b, l, r, -FLT_MAX if is_max else 0.0)  # negative pads crop
        elif t or b or l or r:
            # the padded input in a reusable scratch buffer (no per-run allocation)
            h, w = x.shape[1:]
            xp = self.buf("pad", (c, h + t + b, w + l + r))
            np.copyto(xp[:, t : t + h, l : l + w], x)
            fill_border(xp, t, b, l, r, -FLT_MAX if is_max else 0.0)
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
