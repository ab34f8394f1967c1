"""Pooling (max / average; global; pad_mode 0 full, 1 valid, 2 SAME_UPPER, 3 SAME_LOWER).

Padding as ncnn's Pooling::make_padding: max pools pad with -FLT_MAX, average pools with 0.
pad_mode 0 adds a tail on the bottom/right so the last partial window is kept (ceil mode).
Average pooling without ``avgpool_count_include_pad`` divides by the number of window
elements inside the region bounded by the *declared* pads (and the full-mode tail), as ncnn
does; with it, by kernel_w * kernel_h.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.kernels.base import Kernel, Shape, UnsupportedError, register
from vkserve.devices.cpu.kernels.conv import border, cdiv, fill_border

FLT_MAX = float(np.finfo(np.float32).max)


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
        shape = in_shapes[0]
        if p.pooling_type not in (0, 1):
            raise UnsupportedError(f"pooling_type={p.pooling_type}")
        if len(shape) != 3:
            raise UnsupportedError(f"input of {len(shape)} dims (need c,h,w)")
        c, h, w = shape
        if p.global_pooling:
            self.exact_store = p.pooling_type == 0
            return [(c,)]
        if p.adaptive_pooling:
            raise UnsupportedError("adaptive_pooling (used by no shipped model)")
        kh, kw, sh, sw = p.kernel_h, p.kernel_w, p.stride_h, p.stride_w
        t, b, l, r = p.pad_top, p.pad_bottom, p.pad_left, p.pad_right
        self.tail_h = self.tail_w = 0
        if p.pad_mode == 0:
            wtail = (w + l + r - kw) % sw
            htail = (h + t + b - kh) % sh
            self.tail_w = sw - wtail if wtail else 0
            self.tail_h = sh - htail if htail else 0
            pads = (t, b + self.tail_h, l, r + self.tail_w)
        elif p.pad_mode == 1:
            pads = (t, b, l, r)
        elif p.pad_mode in (2, 3):
            hpad = kh + cdiv(h - 1, sh) * sh - h
            wpad = kw + cdiv(w - 1, sw) * sw - w
            if hpad > 0 or wpad > 0:
                hs, ws = cdiv(hpad, 2), cdiv(wpad, 2)
                if p.pad_mode == 2:
                    pads = (hs, hpad - hs, ws, wpad - ws)
                else:
                    pads = (hpad - hs, hs, wpad - ws, ws)
            else:
                pads = (0, 0, 0, 0)
        else:
            raise UnsupportedError(f"pad_mode={p.pad_mode}")
        self.pads = pads
        hp, wp = h + pads[0] + pads[1], w + pads[2] + pads[3]
        oh, ow = (hp - kh) // sh + 1, (wp - kw) // sw + 1
        if oh <= 0 or ow <= 0:
            raise UnsupportedError(f"empty output for input {shape}")
        # a maximum of bf16 values is one, unless a window lies wholly in the -FLT_MAX border
        # (never when every border is narrower than the window and windows do not skip rows)
        self.exact_store = (
            p.pooling_type == 0 and max(pads[0], pads[1]) < kh and max(pads[2], pads[3]) < kw
            and sh <= kh and sw <= kw
        )
        self.divisor: np.ndarray | None = None
        if p.pooling_type == 1 and not p.avgpool_count_include_pad:
            # count the window cells inside [declared pads, size - declared pads - tail)
            valid = np.zeros((hp, wp), dtype=np.float32)
            valid[t : hp - b - self.tail_h, l : wp - r - self.tail_w] = 1.0
            self.divisor = pool_windows(valid, kh, kw, sh, sw, oh, ow, is_max=False)
        return [(c, oh, ow)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        x = xs[0]
        is_max = p.pooling_type == 0
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
