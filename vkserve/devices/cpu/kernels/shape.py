"""Data-movement layers: Input, Split, Noop, Reshape, Flatten, Squeeze, ExpandDims, MemoryData,
Concat, Slice, Permute, Crop, ShuffleChannel, Padding, Interp.

Shapes are ncnn Mat shapes in numpy order: (w,), (h, w), (c, h, w), (c, d, h, w); an ncnn
axis number is the numpy axis of the same-rank array. Output shapes, windows, pads and
resize steps are the layers' (``vkserve.models.layers``).
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.kernels.base import Kernel, register, widen
from vkserve.devices.errors import UnsupportedError
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

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.axis = positive_axis(self.p.axis, len(in_shapes[0]))
        self.bounds = np.cumsum([0] + [s[self.axis] for s in out]).tolist()
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.moveaxis(xs[0], self.axis, 0)
        return [
            np.moveaxis(x[self.bounds[i] : self.bounds[i + 1]], 0, self.axis)
            for i in range(len(self.out_shapes))
        ]


@register("Permute")
class Permute(Kernel):
    bf16_native = True

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

    def forward_into(self, xs: list[np.ndarray], outs: list[np.ndarray]) -> None:
        c, h, w = xs[0].shape
        x = xs[0].reshape(self.groups, c // self.groups, h, w)
        np.copyto(outs[0].reshape(c // self.groups, self.groups, h, w), x.transpose(1, 0, 2, 3))


@register("Crop")
class Crop(Kernel):
    """A copy of the layer's window (``CropParams.window``: every form of it)."""

    bf16_native = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        reference = in_shapes[1] if self.p.uses_reference() else None
        offsets, sizes = self.p.window(in_shapes[0], reference)
        self.window = tuple(slice(o, o + n) for o, n in zip(offsets, sizes))
        return [sizes]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[0][self.window]]


@register("Padding")
class Padding(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        if p.type != 0 and (p.front or p.behind):
            raise UnsupportedError("front/behind padding with a non-constant type")
        self.pads = p.pads(len(in_shapes[0]))
        self.per_channel = self.bf16_weight(0) if p.per_channel_pad_data_size else None
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
        y[...] = values.reshape((-1,) + (1,) * (x.ndim - 1))
        inner = tuple(slice(a, a + s) for (a, _), s in zip(self.pads, x.shape))
        y[inner] = x
        return [y]


def linear_taps(size: int, out: int, align_corner: bool, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Source index and weight of the first of two taps, as ncnn's linear_coeffs; ``step`` is
    the source step per output pixel (``InterpParams.source_steps``)."""
    if align_corner:
        f = (np.arange(out, dtype=np.float64) * step).astype(np.float32)
    else:
        f = ((np.arange(out, dtype=np.float64) + 0.5) * step - 0.5).astype(np.float32)
    idx = np.floor(f).astype(np.int64)
    frac = f - idx
    low = idx < 0
    idx[low], frac[low] = 0, 0.0
    high = idx >= size - 1
    idx[high], frac[high] = size - 2, 1.0
    return idx, frac.astype(np.float32)


@register("Interp")
class Interp(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        if len(in_shapes[0]) != 3:
            raise UnsupportedError(f"input of {len(in_shapes[0])} dims (need c,h,w)")
        if p.resize_type not in (1, 2):
            raise UnsupportedError(f"resize_type={p.resize_type} (nearest and bilinear only)")
        out = super().infer(in_shapes)
        _, h, w = in_shapes[0]
        _, oh, ow = out[0]
        hs, ws = p.source_steps((h, w), (oh, ow))
        if p.resize_type == 1:
            self.bf16_native = True  # nearest: a gather, any dtype
            self.ys = np.minimum((np.arange(oh, dtype=np.float32) * np.float32(hs)).astype(np.int64), h - 1)
            self.xs = np.minimum((np.arange(ow, dtype=np.float32) * np.float32(ws)).astype(np.int64), w - 1)
        else:
            self.ys, self.fy = linear_taps(h, oh, bool(p.align_corner), hs)
            self.xs, self.fx = linear_taps(w, ow, bool(p.align_corner), ws)
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        if self.p.resize_type == 1:
            return [x[:, self.ys[:, None], self.xs[None, :]]]
        fx, fy = self.fx, self.fy[:, None]
        rows = x[:, :, self.xs] * (1.0 - fx) + x[:, :, self.xs + 1] * fx
        return [rows[:, self.ys, :] * (1.0 - fy) + rows[:, self.ys + 1, :] * fy]
