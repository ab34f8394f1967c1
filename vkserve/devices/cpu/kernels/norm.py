"""Normalisation and per-channel affine layers: BatchNorm, Scale, Bias, LayerNorm, RMSNorm,
GroupNorm, InstanceNorm.

The per-channel factors (and gamma / beta) are kept in fp32 (as ncnn's bf16 path keeps them): one value per
channel costs nothing, and rounding them would add an error to every output element.
Channels are contiguous runs along numpy axis 0 (``vkserve.models.layers.affine_channels`` /
``bias_channels``), so each kernel views its input as (channels, rest).
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.jit import elementwise as jit_elementwise
from vkserve.devices.cpu.jit import norm as jit_norm
from vkserve.devices.cpu.kernels.base import Kernel, register
from vkserve.devices.cpu.kernels.elementwise import ElementwiseJit
from vkserve.devices.cpu.kernels.jitted import JitCall
from vkserve.models.layers import Shape, affine_channels, batchnorm_affine, bias_channels


def _affine(x: np.ndarray, channels: int, scale: np.ndarray | None,
            shift: np.ndarray | None) -> np.ndarray:
    """x * scale[c] + shift[c] over (channels, rest), in place."""
    v = x.reshape(channels, -1)
    if scale is not None:
        v *= scale[:channels, None]
    if shift is not None:
        v += shift[:channels, None]
    return x


@register("BatchNorm")
class BatchNorm(ElementwiseJit):
    """``jit.elementwise.affine`` on the Plan's path, a following activation fused (densenet's
    pre-activation BatchNorm + ReLU pairs: 13 ms of its 70 on one core of the 2-core VM as
    numpy passes); ``forward`` stays numpy (fp32)."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        slope, mean, var, bias = (np.asarray(w, np.float32).ravel() for w in self.layer.weights[:4])
        self.scale, self.shift = batchnorm_affine(slope, mean, var, bias, self.p.eps)
        self.channels = affine_channels(out[0])
        return out

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        rows = self.channels
        return jit_elementwise.affine, (xs[0].reshape(rows, -1), self.scale, self.shift, ops, jit.task_count(rows),
                                        out.reshape(rows, -1))

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.array(xs[0], dtype=np.float32)
        return [_affine(x, affine_channels(x.shape), self.scale, self.shift)]


@register("Scale")
class Scale(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        self.scale = None if p.scale_input else self.fp32_bias(0)
        self.shift = self.fp32_bias(1) if (not p.scale_input and p.bias_term) else None
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.array(xs[0], dtype=np.float32)
        scale = np.asarray(xs[1], np.float32).ravel() if self.p.scale_input else self.scale
        return [_affine(x, affine_channels(x.shape), scale, self.shift)]


@register("Bias")
class Bias(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.shift = self.fp32_bias(0)
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.array(xs[0], dtype=np.float32)
        return [_affine(x, bias_channels(x.shape), None, self.shift)]


def _normalize(v: np.ndarray, eps: float, centered: bool) -> np.ndarray:
    """Each row of ``v`` (rows, run) normalised in place as ncnn does: (x - mean) / sqrt(var +
    eps) with the two-pass variance, or x / sqrt(mean(x^2) + eps) (``centered`` False)."""
    n = np.float32(v.shape[1])
    if centered:
        v -= v.sum(axis=1, keepdims=True, dtype=np.float32) / n
    ms = np.einsum("ij,ij->i", v, v)[:, None] / n
    v *= np.float32(1.0) / np.sqrt(ms + np.float32(eps))
    return v


class _LastDims(ElementwiseJit):
    """Each run of the last ``norm_dims`` dimensions normalised: ``jit.norm.last_dims`` on the
    Plan's path (fused activations included), numpy in ``forward`` (fp32)."""

    centered = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        shape = in_shapes[0]
        self.run = int(np.prod(shape[len(shape) - self.p.norm_dims(shape):]))
        self.gamma = self.fp32_bias(0) if self.p.affine else None
        self.beta = self.fp32_bias(1) if (self.p.affine and self.centered) else None
        return out

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        none = np.empty(0, np.float32)
        rows = out.size // self.run
        return jit_norm.last_dims, (xs[0].reshape(rows, self.run), none if self.gamma is None else self.gamma,
                                    none if self.beta is None else self.beta, np.float32(self.p.eps), self.centered,
                                    ops, jit.task_count(rows), out.reshape(rows, self.run))

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.array(xs[0], dtype=np.float32)
        v = _normalize(x.reshape(-1, self.run), self.p.eps, self.centered)
        if self.gamma is not None:
            v *= self.gamma
        if self.beta is not None:
            v += self.beta
        return [x]


@register("LayerNorm")
class LayerNorm(_LastDims):
    centered = True


@register("RMSNorm")
class RMSNorm(_LastDims):
    centered = False


class _ChannelGroups(Kernel):
    """Axis-0 channels in ``groups`` contiguous groups, each normalised; gamma / beta per
    channel."""

    def groups(self) -> int:
        raise NotImplementedError

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.gamma = self.fp32_bias(0) if self.p.affine else None
        self.beta = self.fp32_bias(1) if self.p.affine else None
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        x = np.array(xs[0], dtype=np.float32)
        _normalize(x.reshape(self.groups(), -1), self.p.eps, True)
        return [_affine(x, x.shape[0], self.gamma, self.beta)]


@register("GroupNorm")
class GroupNorm(_ChannelGroups):
    def groups(self) -> int:
        return self.p.group


@register("InstanceNorm")
class InstanceNorm(_ChannelGroups):
    def groups(self) -> int:
        return self.p.channels
