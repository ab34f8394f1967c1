"""Data-movement layers: Input, Split, Noop, Reshape, Flatten, Concat, Slice, Permute, Crop,
ShuffleChannel, Padding, Interp.

Shapes are ncnn Mat shapes in numpy order: (w,), (h, w), (c, h, w), (c, d, h, w); an ncnn
axis number is the numpy axis of the same-rank array.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.kernels.base import Kernel, Shape, UnsupportedError, register, widen

UNSET = -233


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


@register("Split")
class Split(Alias):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        return [in_shapes[0]] * len(self.layer.outputs)


@register("Noop")
class Noop(Alias):
    """ncnn's Noop forwards in place: output i is input i."""

    def source(self, out_index: int) -> int:
        return out_index

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        if len(self.layer.outputs) > len(in_shapes):
            raise UnsupportedError("more outputs than inputs")
        return [in_shapes[i] for i in range(len(self.layer.outputs))]


def mat_dims(shape: Shape) -> dict[str, int]:
    """ncnn's (w, h, d, c) of a numpy-ordered shape."""
    n = len(shape)
    return {
        "w": shape[-1],
        "h": shape[-2] if n >= 2 else 1,
        "d": shape[1] if n == 4 else 1,
        "c": shape[0] if n >= 3 else 1,
    }


@register("Reshape")
class Reshape(Alias):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        src = in_shapes[0]
        total = int(np.prod(src))
        dims = mat_dims(src)
        names = {1: "w", 2: "hw", 3: "chw", 4: "cdhw"}
        target = list(self.p.target())
        if not target:
            raise UnsupportedError("w unset")
        out = [dims[n] if v == 0 else v for n, v in zip(names[len(target)], target)]
        if -1 in out:
            known = int(np.prod([v for v in out if v != -1]))
            out[out.index(-1)] = total // known if known else 0
        if int(np.prod(out)) != total:
            raise UnsupportedError(f"cannot reshape {src} to {tuple(out)}")
        return [tuple(out)]


@register("Flatten")
class Flatten(Alias):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        return [(int(np.prod(in_shapes[0])),)]


@register("Concat")
class Concat(Kernel):
    bf16_native = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        ndim = len(in_shapes[0])
        axis = self.p.axis + ndim if self.p.axis < 0 else self.p.axis
        if not 0 <= axis < ndim or any(len(s) != ndim for s in in_shapes):
            raise UnsupportedError(f"axis={self.p.axis} for shapes {in_shapes}")
        self.axis = axis
        out = list(in_shapes[0])
        for s in in_shapes[1:]:
            if s[:axis] + s[axis + 1 :] != in_shapes[0][:axis] + in_shapes[0][axis + 1 :]:
                raise UnsupportedError(f"shapes {in_shapes} differ off axis {axis}")
            out[axis] += s[axis]
        return [tuple(out)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate(xs, axis=self.axis)]

    def forward_into(self, xs: list[np.ndarray], outs: list[np.ndarray]) -> None:
        np.concatenate(xs, axis=self.axis, out=outs[0])


@register("Slice")
class Slice(Kernel):
    bf16_native = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        shape = in_shapes[0]
        axis = p.axis + len(shape) if p.axis < 0 else p.axis
        if not 0 <= axis < len(shape):
            raise UnsupportedError(f"axis={p.axis} for shape {shape}")
        self.axis = axis
        total = shape[axis]
        n = len(self.layer.outputs)
        indices = [int(v) for v in p.indices]
        if indices:
            points = [0] + [v + total if v < 0 else v for v in indices[: n - 1]] + [total]
            sizes = [points[i + 1] - points[i] for i in range(n)]
        else:
            slices = [int(v) for v in (p.slices or [])]
            if len(slices) != n:
                raise UnsupportedError(f"{len(slices)} slices for {n} outputs")
            sizes, q = [], 0
            for i, s in enumerate(slices):
                if s == UNSET:
                    s = (total - q) // (n - i)
                sizes.append(s)
                q += s
        if any(s <= 0 for s in sizes) or sum(sizes) > total:
            raise UnsupportedError(f"slices {sizes} of an axis of {total}")
        self.bounds = np.cumsum([0] + sizes).tolist()
        return [shape[:axis] + (s,) + shape[axis + 1 :] for s in sizes]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.moveaxis(xs[0], self.axis, 0)
        return [
            np.moveaxis(x[self.bounds[i] : self.bounds[i + 1]], 0, self.axis)
            for i in range(len(self.out_shapes))
        ]


_PERMUTE = {
    2: {0: (0, 1), 1: (1, 0)},
    # ncnn names the output (w, h, c) by the input axes they come from
    3: {0: (0, 1, 2), 1: (0, 2, 1), 2: (1, 0, 2), 3: (1, 2, 0), 4: (2, 0, 1), 5: (2, 1, 0)},
}


@register("Permute")
class Permute(Kernel):
    bf16_native = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        shape = in_shapes[0]
        if len(shape) == 1:
            self.axes: tuple[int, ...] = (0,)
        else:
            table = _PERMUTE.get(len(shape), {})
            if self.p.order_type not in table:
                raise UnsupportedError(f"order_type={self.p.order_type} for a {len(shape)}-D input")
            self.axes = table[self.p.order_type]
        return [tuple(shape[a] for a in self.axes)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [np.transpose(xs[0], self.axes)]


@register("ShuffleChannel")
class ShuffleChannel(Kernel):
    bf16_native = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        shape = in_shapes[0]
        if len(shape) != 3 or shape[0] % self.p.group:
            raise UnsupportedError(f"group={self.p.group} for shape {shape}")
        c = shape[0]
        self.groups = c // self.p.group if self.p.reverse else self.p.group
        return [shape]

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
    """Three forms: numpy-style starts/ends/axes; offsets + out sizes; a reference blob."""

    bf16_native = True


    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        shape = in_shapes[0]
        n = len(shape)
        starts = [int(v) for v in (p.starts or [])]
        ends = [int(v) for v in (p.ends or [])]
        offsets = [0] * n
        sizes = list(shape)
        if starts and ends:
            axes = [int(v) for v in (p.axes or [])] or list(range(min(len(starts), n)))
            for axis, start, end in zip(axes, starts, ends):
                axis = axis + n if axis < 0 else axis
                size = shape[axis]
                start = 0 if start == UNSET else start
                end = size if end == UNSET else end
                offsets[axis] = start if start >= 0 else size + start
                sizes[axis] = min(size, end if end > 0 else size + end) - offsets[axis]
        else:
            names = {1: "w", 2: "hw", 3: "chw", 4: "cdhw"}[n]
            ref = in_shapes[1] if len(in_shapes) > 1 else None
            for axis, name in enumerate(names):
                off = getattr(p, f"{name}offset")
                if ref is not None:
                    # reference form: take the reference blob's extent where it has one
                    rdims = mat_dims(ref)
                    want = rdims[name] if (name != "c" or len(ref) == n) else shape[axis]
                    offsets[axis] = (shape[axis] - want) // 2 if off == UNSET else off
                    sizes[axis] = want
                    continue
                out = getattr(p, f"out{name}")
                off2 = getattr(p, f"{name}offset2")
                offsets[axis] = off
                sizes[axis] = shape[axis] - off - off2
                if out not in (UNSET, 0):
                    sizes[axis] = min(out, sizes[axis])
        for axis in range(n):
            if sizes[axis] <= 0 or offsets[axis] < 0 or offsets[axis] + sizes[axis] > shape[axis]:
                raise UnsupportedError(f"crop {offsets}+{sizes} out of input {shape}")
        self.window = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
        return [tuple(sizes)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [xs[0][self.window]]


@register("Padding")
class Padding(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        shape = in_shapes[0]
        if p.type not in (0, 1, 2):
            raise UnsupportedError(f"type={p.type}")
        if p.type != 0 and (p.front or p.behind):
            raise UnsupportedError("front/behind padding with a non-constant type")
        n = len(shape)
        pads = {1: [(p.left, p.right)], 2: [(p.top, p.bottom), (p.left, p.right)]}.get(
            n, [(p.front, p.behind)] + [(0, 0)] * (n - 3) + [(p.top, p.bottom), (p.left, p.right)]
        )
        self.pads = pads
        self.per_channel = self.bf16_weight(0) if p.per_channel_pad_data_size else None
        return [tuple(s + a + b for s, (a, b) in zip(shape, pads))]

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


def linear_taps(
    size: int, out: int, align_corner: bool, scale: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """Source index and weight of the first of two taps, as ncnn's linear_coeffs.

    ``scale`` is the source step per output pixel: 1 / scale_factor when the output size came
    from a scale factor (what ncnn does), else None for size / out.
    """
    if align_corner:
        step = (size - 1) / (out - 1) if out > 1 else 0.0
        f = (np.arange(out, dtype=np.float64) * step).astype(np.float32)
    else:
        step = size / out if scale is None else scale
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
        shape = in_shapes[0]
        if len(shape) != 3:
            raise UnsupportedError(f"input of {len(shape)} dims (need c,h,w)")
        if p.resize_type not in (1, 2):
            raise UnsupportedError(f"resize_type={p.resize_type} (nearest and bilinear only)")
        c, h, w = shape
        if p.dynamic_target_size:
            oh, ow = in_shapes[1][-2], in_shapes[1][-1]
        else:
            oh, ow = p.output_height, p.output_width
            if oh == 0 or ow == 0:
                oh = int(np.float32(h) * np.float32(p.height_scale))
                ow = int(np.float32(w) * np.float32(p.width_scale))
        if oh <= 0 or ow <= 0:
            raise UnsupportedError(f"empty output for input {shape}")
        if p.resize_type == 1:
            self.bf16_native = True  # nearest: a gather, any dtype
            explicit = p.dynamic_target_size or p.output_height
            hs = np.float32(h) / np.float32(oh) if explicit else np.float32(1.0) / np.float32(p.height_scale)
            ws = np.float32(w) / np.float32(ow) if explicit else np.float32(1.0) / np.float32(p.width_scale)
            self.ys = np.minimum((np.arange(oh, dtype=np.float32) * hs).astype(np.int64), h - 1)
            self.xs = np.minimum((np.arange(ow, dtype=np.float32) * ws).astype(np.int64), w - 1)
        else:
            explicit = p.dynamic_target_size or p.output_height or p.output_width
            hs = None if explicit else 1.0 / float(np.float32(p.height_scale))
            ws = None if explicit else 1.0 / float(np.float32(p.width_scale))
            self.ys, self.fy = linear_taps(h, oh, bool(p.align_corner), hs)
            self.xs, self.fx = linear_taps(w, ow, bool(p.align_corner), ws)
        return [(c, oh, ow)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = xs[0]
        if self.p.resize_type == 1:
            return [x[:, self.ys[:, None], self.xs[None, :]]]
        fx, fy = self.fx, self.fy[:, None]
        rows = x[:, :, self.xs] * (1.0 - fx) + x[:, :, self.xs + 1] * fx
        return [rows[:, self.ys, :] * (1.0 - fy) + rows[:, self.ys + 1, :] * fy]
