"""ArgMax, Cast, Normalize, MVN and Embed (their meaning: vkserve.models.layers)."""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.kernels.base import Kernel, register
from vkserve.devices.errors import UnsupportedError
from vkserve.models.layers import NormalizeParams, Shape, stat_channels

#: the largest n such that bf16 holds every integer 0..n exactly (8 significant bits)
BF16_EXACT_INT = 256


@register("ArgMax")
class ArgMax(Kernel):
    """``dynamic`` keeps the output out of the bf16 arena, in fp32: indices past 256 would
    not survive bf16 storage."""

    dynamic = True

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        flat = xs[0].ravel()
        index = np.arange(flat.size)
        # largest value first, a tie to the larger index (lexsort: last key primary)
        top = np.lexsort((-index, -flat))[: self.p.topk]
        rows = [flat[top], top] if self.p.out_max_val else [top]
        return [np.stack(rows).astype(np.float32)]


@register("Cast")
class Cast(Kernel):
    """Only a cast to float16 changes a bf16-stored value (its range and subnormals); every
    other form, bfloat16 rounding included, is a copy of the bf16 bytes."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        self.bf16_native = self.p.rounding() != "float16"
        return super().infer(in_shapes)

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        if self.bf16_native:
            return [xs[0].copy()]
        with np.errstate(over="ignore"):
            return [xs[0].astype(np.float16).astype(np.float32)]


def _normalize_scale(p: NormalizeParams, x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Normalize's factor for ``x`` viewed as (channels, spatial), broadcastable to it."""
    sq = x * x
    if p.across_spatial and p.across_channel:
        ssum = np.sum(sq, dtype=np.float32).reshape(1, 1)
    elif p.across_spatial:
        ssum = np.sum(sq, axis=1, keepdims=True, dtype=np.float32)
    else:
        ssum = np.sum(sq, axis=0, keepdims=True, dtype=np.float32)
    eps, mode = np.float32(p.eps), p.eps_mode
    if mode == 0:
        norm = np.sqrt(ssum + eps)
    elif mode == 1:
        norm = np.maximum(np.sqrt(ssum), eps)
    else:
        norm = np.sqrt(np.maximum(ssum, eps))
    return (np.float32(1.0) / norm) * scale


@register("Normalize")
class Normalize(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.channels = stat_channels(in_shapes[0])
        w = np.asarray(self.layer.weights[0], np.float32).ravel()
        self.scale = (w[:1] if self.p.channel_shared else w[: self.channels]).reshape(-1, 1)
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        if not (self.p.across_spatial or self.p.across_channel):
            return [x]
        v = x.reshape(self.channels, -1)
        return [(v * _normalize_scale(self.p, v, self.scale)).reshape(x.shape)]


@register("MVN")
class MVN(Kernel):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        groups = 1 if self.p.across_channels else stat_channels(x.shape)
        v = x.reshape(groups, -1)
        y = v - np.sum(v, axis=1, keepdims=True, dtype=np.float32) / np.float32(v.shape[1])
        if self.p.normalize_variance:
            sqmean = np.sum(y * y, axis=1, keepdims=True, dtype=np.float32) / np.float32(v.shape[1])
            y = y * (np.float32(1.0) / (np.sqrt(sqmean) + np.float32(self.p.eps)))
        return [y.reshape(self.out_shapes[0])]


@register("Embed")
class Embed(Kernel):
    """Rows of the bf16 table (ncnn's bf16 path stores weights so too) plus the fp32 bias."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        if self.p.input_dim > BF16_EXACT_INT + 1:
            raise UnsupportedError(
                f"Embed input_dim {self.p.input_dim}: token ids pass through bf16 storage here, "
                f"which holds integers exactly only up to {BF16_EXACT_INT}")
        out = super().infer(in_shapes)
        self.table = self.bf16_weight(0).reshape(self.p.input_dim, self.p.num_output)
        self.bias = self.fp32_bias(1) if self.p.bias_term else None
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        words = self.out_shapes[0][0]
        ids = np.nan_to_num(np.trunc(xs[0].ravel()[:words]))
        index = np.clip(ids, 0, self.p.input_dim - 1).astype(np.int64)
        y = from_bf16(self.table[index])
        return [y + self.bias if self.bias is not None else y]
