"""Reduction (sum, asum, sumsq, mean, max, min, prod, l1, l2, logsum, logsumexp over the axes
``ReductionParams.reduce_axes`` picks, then times coeff; fp32 accumulation, as ncnn) and the
small rearranging layers PixelShuffle, Reorg, Tile (pure moves, bf16-native) and GLU."""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.kernels.base import Kernel, register, sigmoid
from vkserve.models.layers import REDUCTION_OPS, positive_axis


def reduce_ncnn(x: np.ndarray, op: str, axes: tuple[int, ...], coeff: float) -> np.ndarray:
    """ncnn's Reduction of the fp32 array ``x`` over ``axes`` (kept as 1s), times coeff."""
    kw = {"axis": axes, "keepdims": True, "dtype": np.float32}
    if op in ("sum", "mean"):
        y = np.sum(x, **kw)
        if op == "mean":
            n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
            y = y / np.float32(n)
    elif op in ("asum", "l1"):
        y = np.sum(np.abs(x), **kw)
    elif op in ("sumsq", "l2"):
        y = np.sum(x * x, **kw)
        if op == "l2":
            y = np.sqrt(y)
    elif op == "max":
        y = np.max(x, axis=axes, keepdims=True)
    elif op == "min":
        y = np.min(x, axis=axes, keepdims=True)
    elif op == "prod":
        y = np.prod(x, **kw)
    elif op == "logsum":
        y = np.log(np.sum(x, **kw))
    else:  # logsumexp
        y = np.log(np.sum(np.exp(x), **kw))
    return (y * np.float32(coeff)).astype(np.float32)


@register("Reduction")
class Reduction(Kernel):
    def infer(self, in_shapes):
        out = super().infer(in_shapes)
        self.axes = self.p.reduce_axes(in_shapes[0])
        self.op = REDUCTION_OPS[self.p.operation]
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.asarray(xs[0], dtype=np.float32)
        with np.errstate(all="ignore"):
            y = reduce_ncnn(x, self.op, self.axes, self.p.coeff)
        return [np.ascontiguousarray(y.reshape(self.out_shapes[0]))]


@register("PixelShuffle")
class PixelShuffle(Kernel):
    bf16_native = True

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        r = self.p.upscale_factor
        oc, oh, ow = self.out_shapes[0]
        h, w = oh // r, ow // r
        x = xs[0][: oc * r * r]
        if self.p.mode == 0:
            y = x.reshape(oc, r, r, h, w).transpose(0, 3, 1, 4, 2)
        else:
            y = x.reshape(r, r, oc, h, w).transpose(2, 3, 0, 4, 1)
        return [np.ascontiguousarray(y).reshape(oc, oh, ow)]


@register("Reorg")
class Reorg(Kernel):
    bf16_native = True

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        s = self.p.stride
        oc, oh, ow = self.out_shapes[0]
        c = oc // (s * s)
        y = xs[0][:, : oh * s, : ow * s].reshape(c, oh, s, ow, s)
        y = y.transpose(0, 2, 4, 1, 3) if self.p.mode == 0 else y.transpose(2, 4, 0, 1, 3)
        return [np.ascontiguousarray(y).reshape(oc, oh, ow)]


@register("GLU")
class GLU(Kernel):
    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.asarray(xs[0], dtype=np.float32)
        a, b = np.split(x, 2, axis=positive_axis(self.p.axis, x.ndim))
        return [np.ascontiguousarray(a * sigmoid(b), dtype=np.float32)]


@register("Tile")
class Tile(Kernel):
    bf16_native = True

    def infer(self, in_shapes):
        out = super().infer(in_shapes)
        self.padded, self.reps = self.p.tile_plan(in_shapes[0])
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.ascontiguousarray(np.tile(xs[0].reshape(self.padded), self.reps))]
