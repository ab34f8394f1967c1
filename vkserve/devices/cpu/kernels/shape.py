"""Data-movement layers: Input, Split, Noop, Reshape, Flatten, Squeeze, ExpandDims, MemoryData,
Concat, Slice, Permute, Crop, ShuffleChannel, Padding, Interp.

Shapes are ncnn Mat shapes in numpy order: (w,), (h, w), (c, h, w), (c, d, h, w); an ncnn
axis number is the numpy axis of the same-rank array. Output shapes, windows, pads and
resize steps are the layers' (``vkserve.models.layers``).
"""

from __future__ import annotations

import math

import numpy as np

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.jit import interp as jit_interp
from vkserve.devices.cpu.kernels.base import Kernel, register, widen
from vkserve.devices.cpu.kernels.jitted import JitCall, JitKernel
from vkserve.models.layers import Shape, positive_axis


class Alias(Kernel):
    """Outputs are the bytes of an input under another shape: nothing runs."""

    alias = True

    def source(self, out_index: int) -> int:
        """Which input output ``out_index`` aliases."""
        return 0

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[self.source(i)].reshape(s) for i, s in enumerate(self.out_shapes)]


@register("Input")
class Input(Alias):
    """The executor writes the caller's array into the input blob."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        return [in_shapes[0]]


register("Split", "Reshape", "Flatten", "Squeeze", "ExpandDims")(Alias)


@register("MemoryData")
class MemoryData(Kernel):
    """The layer's constant (its one weight) under its shape; the executor stores it."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.data = np.asarray(self.layer.weights[0], dtype=np.float32).reshape(out[0])
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [self.data.copy()]


@register("Noop")
class Noop(Alias):
    """ncnn's Noop forwards in place: output i is input i."""

    def source(self, out_index: int) -> int:
        return out_index


@register("Concat")
class Concat(Kernel):
    bf16_native = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        self.axis = positive_axis(self.p.axis, len(in_shapes[0]))
        return super().infer(in_shapes)

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate(xs, axis=self.axis)]

    def forward_into(self, xs: list[np.ndarray], outs: list[np.ndarray]) -> None:
        np.concatenate(xs, axis=self.axis, out=outs[0])


@register("Slice")
class Slice(Kernel):
    bf16_native = True
    forward_views = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        axis = positive_axis(self.p.axis, len(in_shapes[0]))
        bounds = np.cumsum([0] + [s[axis] for s in out]).tolist()
        # each output's index into the input, made once (np.moveaxis per run cost ~10 us a
        # step: shufflenet_v2 runs 13 Slices)
        self.parts = [(slice(None),) * axis + (slice(lo, hi),) for lo, hi in zip(bounds, bounds[1:])]
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[0][part] for part in self.parts]


@register("Permute")
class Permute(Kernel):
    bf16_native = True
    forward_views = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        self.axes = self.p.numpy_axes(len(in_shapes[0]))
        return super().infer(in_shapes)

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.transpose(xs[0], self.axes)]


@register("ShuffleChannel")
class ShuffleChannel(Kernel):
    bf16_native = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.groups = self.p.groups(in_shapes[0][0])
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        c, h, w = xs[0].shape
        x = xs[0].reshape(self.groups, c // self.groups, h, w)
        return [np.ascontiguousarray(x.transpose(1, 0, 2, 3)).reshape(c, h, w)]

    def view_copies(self, xs: list[np.ndarray], outs: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The output as (C / g, g, H, W) from the input's (g, C / g, H, W) swapped."""
        c, h, w = xs[0].shape
        x = xs[0].reshape(self.groups, c // self.groups, h, w)
        return [(outs[0].reshape(c // self.groups, self.groups, h, w), x.transpose(1, 0, 2, 3))]

    def forward_into(self, xs: list[np.ndarray], outs: list[np.ndarray]) -> None:
        for dst, src in self.view_copies(xs, outs):
            np.copyto(dst, src)


@register("Crop")
class Crop(Kernel):
    """A copy of the layer's window (``CropParams.window_of``: every form of it)."""

    bf16_native = True
    forward_views = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        offsets, sizes = self.p.window_of(in_shapes)
        self.window = tuple(slice(o, o + n) for o, n in zip(offsets, sizes))
        return [sizes]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[0][self.window]]


@register("Padding")
class Padding(Kernel):
    """Constant (one value, or one per output channel of a 3-D / 4-D blob: ncnn pads 1-D and
    2-D blobs with the value), replicate (numpy's edge) or reflect; front/behind pad a 3-D
    blob's channels and a 4-D blob's depth in every type."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        self.pads = p.pads(len(in_shapes[0]))
        per_channel = p.per_channel_pad_data_size and len(in_shapes[0]) >= 3
        self.per_channel = self.bf16_weight(0) if per_channel else None
        return super().infer(in_shapes)

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        x = xs[0]
        if p.type == 1:
            return [np.pad(x, self.pads, mode="edge")]
        if p.type == 2:
            return [np.pad(x, self.pads, mode="reflect")]
        if self.per_channel is None:
            return [np.pad(x, self.pads, mode="constant", constant_values=np.float32(p.value))]
        values = widen(self.per_channel)
        y = np.empty(self.out_shapes[0], dtype=np.float32)
        y[...] = values[: y.shape[0]].reshape((-1,) + (1,) * (x.ndim - 1))  # one per channel
        inner = tuple(slice(a, a + s) for (a, _), s in zip(self.pads, x.shape))
        y[inner] = x
        return [y]


def source_coords(out: int, align_corner: bool, step: float) -> np.ndarray:
    """ncnn's float32 source coordinate of each output pixel: o * step with align_corner, else
    (o + 0.5) * step - 0.5; ``step`` is ``InterpParams.source_steps``'."""
    o = np.arange(out, dtype=np.float64)
    return (o * step if align_corner else (o + 0.5) * step - 0.5).astype(np.float32)


def linear_taps(size: int, out: int, align_corner: bool, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Source index and weight of the first of two taps, as ncnn's linear_coeffs."""
    f = source_coords(out, align_corner, step)
    idx = np.floor(f).astype(np.int64)
    frac = f - idx
    low = idx < 0
    idx[low], frac[low] = 0, 0.0
    high = idx >= size - 1
    idx[high], frac[high] = size - 2, 1.0
    return idx, frac.astype(np.float32)


def cubic_weights(f: np.ndarray) -> np.ndarray:
    """ncnn's four bicubic weights (A = -0.75) of fractions ``f``, float32, shape (n, 4)."""
    a = np.float32(-0.75)
    one = np.float32(1.0)
    f0, f1, f2 = f + one, f, one - f
    c0 = a * f0 * f0 * f0 - np.float32(5) * a * f0 * f0 + np.float32(8) * a * f0 - np.float32(4) * a
    c1 = (a + 2) * f1 * f1 * f1 - (a + 3) * f1 * f1 + one
    c2 = (a + 2) * f2 * f2 * f2 - (a + 3) * f2 * f2 + one
    return np.stack([c0, c1, c2, one - c0 - c1 - c2], axis=1).astype(np.float32)


def cubic_taps(size: int, out: int, align_corner: bool, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices (n, 4) and weights (n, 4) of the bicubic taps, as ncnn's cubic_coeffs: taps
    sx - 1 .. sx + 2, with the weights folded inwards at the borders by ncnn's four checks
    applied in turn; indices are clamped into the input (their weights are 0 there)."""
    f = source_coords(out, align_corner, step)
    sx = np.floor(f).astype(np.int64)
    weights = cubic_weights((f - sx).astype(np.float32))
    for i in range(out):
        c, s = weights[i], int(sx[i])
        if s <= -1:
            s, c[:] = 1, (1 - c[3], c[3], 0, 0)
        if s == 0:
            s, c[:] = 1, (c[0] + c[1], c[2], c[3], 0)
        if s == size - 2:
            s, c[:] = size - 3, (0, c[0], c[1], c[2] + c[3])
        if s >= size - 1:
            s, c[:] = size - 3, (0, 0, c[0], 1 - c[0])
        sx[i] = s
    idx = np.clip(sx[:, None] + np.arange(-1, 3), 0, size - 1)
    return idx, weights


def resize_taps(resize_type: int, size: int, out: int, align_corner: bool,
                step: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices (out, k) and float32 weights (out, k) that make each output pixel of one axis:
    k = 1 (nearest: min(int(o * step), size - 1)), 2 (bilinear) or 4 (bicubic)."""
    if resize_type == 1:
        o = np.arange(out, dtype=np.float32) * np.float32(step)
        return np.minimum(o.astype(np.int64), size - 1)[:, None], np.ones((out, 1), np.float32)
    if resize_type == 2:
        idx, frac = linear_taps(size, out, align_corner, step)
        first = np.maximum(idx, 0)  # one pixel: both taps are pixel 0
        taps = np.stack([first, np.minimum(idx + 1, size - 1)], axis=1)
        return taps, np.stack([1.0 - frac, frac], axis=1).astype(np.float32)
    return cubic_taps(size, out, align_corner, step)


@register("Interp")
class Interp(JitKernel):
    """Resize along w and h (``InterpParams``): each axis is a weighted sum of taps
    (``resize_taps``), along w first, as ncnn; a 2-D blob is resized along w only, a 1-D blob
    spread over its output channels. Bilinear and bicubic run as ``jit.interp.resize`` on the
    bf16 arena, fused activations included; nearest is a gather of the stored values, and
    ``forward`` (fp32) stays numpy."""

    @property
    def raw_inputs(self) -> bool:  # type: ignore[override]
        return len(self.in_shapes[0]) > 1 and self.p.resize_type != 1

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        out = super().infer(in_shapes)
        shape = in_shapes[0]
        if len(shape) == 1:
            self.bf16_native = True  # a broadcast, any dtype
            return out
        _, h, w = (1, *shape) if len(shape) == 2 else shape
        oh, ow = (h, out[0][1]) if len(shape) == 2 else out[0][1:]
        hs, ws = p.source_steps((h, w), (oh, ow))
        align = bool(p.align_corner)
        self.tx, self.wx = resize_taps(p.resize_type, w, ow, align, ws)
        if len(shape) == 2:
            self.ty, self.wy = np.arange(h)[:, None], np.ones((h, 1), np.float32)
        else:
            self.ty, self.wy = resize_taps(p.resize_type, h, oh, align, hs)
        self.bf16_native = p.resize_type == 1  # nearest: a gather, any dtype
        self.work = math.prod(out[0]) * (self.tx.shape[1] + self.ty.shape[1])
        return out

    def _activation(self) -> tuple[int, tuple[float, ...]]:
        return 0, ()

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        x = xs[0].reshape((1, *xs[0].shape)) if xs[0].ndim == 2 else xs[0]
        rows = x.shape[0] * self.ty.shape[0]
        return jit_interp.resize, (x, self.tx, self.wx, self.ty, self.wy, ops, jit.task_count(rows),
                                   out.reshape(rows, self.tx.shape[0]))

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        if x.ndim == 1:
            return [np.broadcast_to(x[:, None, None], self.out_shapes[0]).copy()]
        img = x.reshape((1, *x.shape)) if x.ndim == 2 else x
        if self.p.resize_type == 1:
            y = img[:, self.ty[:, 0][:, None], self.tx[None, :, 0]]
            return [y.reshape(self.out_shapes[0])]
        rows = sum(img[:, :, self.tx[:, k]] * self.wx[:, k] for k in range(self.tx.shape[1]))
        y = sum(rows[:, self.ty[:, k], :] * self.wy[:, k, None] for k in range(self.ty.shape[1]))
        return [np.asarray(y, np.float32).reshape(self.out_shapes[0])]
