"""Normalisation and per-channel affine layers on Vulkan: BatchNorm, Scale, Bias, LayerNorm,
RMSNorm, GroupNorm, InstanceNorm.

BatchNorm, Scale and Bias are one ``channel_affine`` dispatch, top = bottom * scale[c] + shift[c], over a blob
viewed as (channels, inner): channels are contiguous runs along the first axis for every rank
(``vkserve.models.layers.affine_channels`` / ``bias_channels``). BatchNorm's scale and shift
come from ``batchnorm_affine`` (ncnn's load_model arithmetic, in float32).

The normalisations are one ``norm`` dispatch (a work group per normalised run, float sums):
LayerNorm / RMSNorm over the trailing axes ``norm_dims`` picks, GroupNorm / InstanceNorm over
groups of axis-0 channels.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vkserve.devices.errors import UnsupportedError
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, Dispatch, Shape, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL
from vkserve.devices.vulkan.layers.shape import LOCAL, linear_grid
from vkserve.models.graph import Layer
from vkserve.models.layers import affine_channels, batchnorm_affine, bias_channels

_DUMMY = np.zeros(2, np.float32)


class _ChannelAffine(VulkanLayer):
    """Subclasses fill ``channels`` and the ``scale`` / ``shift`` vectors (None: absent)."""

    inplace_inputs = (0,)
    channels: int
    scale: np.ndarray | None = None
    shift: np.ndarray | None = None
    #: the scale is the layer's input 1 instead of a weight (Scale with scale_data_size -233)
    scale_blob: bool = False

    def weights(self) -> dict[str, np.ndarray]:
        out = {"shift": _DUMMY if self.shift is None else self.shift}
        if not self.scale_blob:
            out["scale"] = _DUMMY if self.scale is None else self.scale
        return out

    def dispatches(self) -> list[Dispatch]:
        size = math.prod(self.in_shapes[0])
        inner = size // self.channels
        scale = self.layer.inputs[1] if self.scale_blob else "w:scale"
        has_scale = self.scale_blob or self.scale is not None
        return [Dispatch("channel_affine",
                         (self.layer.inputs[0], self.layer.outputs[0], scale, "w:shift"),
                         linear_grid(size), push_constants=(size, inner),
                         spec_constants=(int(has_scale), int(self.shift is not None)),
                         local_size=LOCAL)]


def _weight(layer: object, index: int, count: int) -> np.ndarray:
    return np.asarray(layer.weights[index], np.float32).ravel()[:count].copy()  # type: ignore[attr-defined]


@register("BatchNorm")
class VulkanBatchNorm(_ChannelAffine):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.channels = affine_channels(self.in_shapes[0])
        slope, mean, var, bias = (_weight(self.layer, i, self.channels) for i in range(4))
        self.scale, self.shift = batchnorm_affine(slope, mean, var, bias, self.params.eps)


@register("Scale")
class VulkanScale(_ChannelAffine):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        p = self.params
        self.channels = affine_channels(self.in_shapes[0])
        self.scale_blob = p.scale_input
        if not p.scale_input:
            self.scale = _weight(self.layer, 0, self.channels)
            if p.bias_term:
                self.shift = _weight(self.layer, 1, self.channels)


@register("Bias")
class VulkanBias(_ChannelAffine):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.channels = bias_channels(self.in_shapes[0])
        self.shift = _weight(self.layer, 0, self.channels)


def strided_runs(runs: int) -> int:
    """Runs a work group normalises where runs are strided (channels-first LayerNorms: the
    pixels' values of a channel are neighbours in memory): 4 where that still leaves 512 work
    groups, else 1. H200, convnext_tiny's LayerNorms at 1 / 4 / 8 / 16 runs a group: 3136
    pixels 15.6 / 8.4 / 9.1 / 12.0 us, 784 pixels 9.8 / 9.9 / 12.8 / 18.6, 196 pixels 9.2 /
    15.2 / 21.2 / 33.0 (RESULTS.md, issue 17, seventeenth session)."""
    return 4 if runs >= 4 * 512 else 1


class _Norm(VulkanLayer):
    """One ``norm`` dispatch: ``groups`` runs of ``run`` elements, ``runs_per_group`` runs a
    work group of 64; gamma / beta index (i / aff_div) % aff_mod of the blob index i."""

    centered = True
    has_beta = True
    run: int
    aff_div: int
    aff_mod: int

    def weights(self) -> dict[str, np.ndarray]:
        p = self.params
        ws = self.layer.weights
        gamma = np.asarray(ws[0], np.float32).ravel() if p.affine else _DUMMY
        beta = np.asarray(ws[1], np.float32).ravel() if (p.affine and self.has_beta) else _DUMMY
        return {"gamma": gamma, "beta": beta}

    #: element k of run g is at g * group_step + k * step (contiguous runs: run, 1)
    group_step = 0
    step = 1
    runs_per_group = 1

    def _set_run(self, run: int, aff_div: int, aff_mod: int) -> None:
        self.run, self.aff_div, self.aff_mod = run, aff_div, aff_mod
        self.group_step = run
        self.groups_total = math.prod(self.in_shapes[0]) // run
        if self.groups_total > MAX_GROUPS * MAX_GROUPS:
            raise UnsupportedError(f"{self.layer.type} over {self.in_shapes[0]}: too many groups")

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        groups = -(-self.groups_total // self.runs_per_group)
        gx = min(groups, MAX_GROUPS)
        return [Dispatch("norm", (self.layer.inputs[0], self.layer.outputs[0], "w:gamma", "w:beta"),
                         (gx * REDUCE_LOCAL, -(-groups // gx), 1),
                         push_constants=(self.run, self.groups_total, self.aff_div, self.aff_mod,
                                         float(p.eps), self.group_step, self.step),
                         spec_constants=(int(self.centered), int(bool(p.affine)),
                                         int(bool(p.affine) and self.has_beta), self.runs_per_group),
                         local_size=(REDUCE_LOCAL, 1, 1))]


class _LastDimsNorm(_Norm):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        shape = self.in_shapes[0]
        run = math.prod(shape[len(shape) - self.params.norm_dims(shape):])
        self._set_run(run, 1, run)


@register("LayerNorm")
class VulkanLayerNorm(_LastDimsNorm):
    #: the product that reads the output normalises its rows itself (engine.fusion's
    #: fold_row_norms): this layer is then an alias of its input and records nothing
    read_normalised = False

    @property
    def aliases_input(self) -> bool:
        return self.read_normalised

    def weights(self) -> dict[str, np.ndarray]:
        return {} if self.read_normalised else super().weights()

    def dispatches(self) -> list[Dispatch]:
        return [] if self.read_normalised else super().dispatches()

    def row_norm(self) -> tuple[np.ndarray, np.ndarray, float] | None:
        """(gamma, beta, eps) where the layer normalises contiguous runs with both affine
        vectors (what a product may apply to the rows it reads instead), else None."""
        p = self.params
        if not p.affine or (self.group_step, self.step, self.aff_div, self.aff_mod) != (self.run, 1, 1, self.run):
            return None
        gamma, beta = (np.asarray(w, np.float32).ravel()[:self.run] for w in self.layer.weights[:2])
        return gamma, beta, float(p.eps)

    def take_channels_first(self, blob: str, shape: Shape, output: str) -> Layer | None:
        """Normalise over the channels of the channels-first `blob` (`shape`) and write
        `output` in that order: this LayerNorm over the last axis of the blob permuted
        channels-last, between that Permute and the one back (pnnx's convnext stem and
        downsampling layers). Only where the run is exactly the moved channel axis."""
        channels, pixels = shape[0], math.prod(shape[1:])
        if self.run != channels or tuple(self.in_shapes[0]) != (*shape[1:], channels):
            return None
        self.layer = dataclasses.replace(self.layer, inputs=[blob], outputs=[output])
        self.in_shapes = self.out_shapes = [tuple(shape)]
        self.aff_div, self.aff_mod = pixels, channels  # blob index i: channel i // pixels
        self.group_step, self.step = 1, pixels
        self.runs_per_group = strided_runs(pixels)
        return self.layer


@register("RMSNorm")
class VulkanRMSNorm(_LastDimsNorm):
    centered = False
    has_beta = False


class _ChannelGroupsNorm(_Norm):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        shape = self.in_shapes[0]
        size = math.prod(shape)
        self._set_run(size // self.groups(), size // shape[0], shape[0])

    def groups(self) -> int:
        raise NotImplementedError


@register("GroupNorm")
class VulkanGroupNorm(_ChannelGroupsNorm):
    def groups(self) -> int:
        return int(self.params.group)


@register("InstanceNorm")
class VulkanInstanceNorm(_ChannelGroupsNorm):
    def groups(self) -> int:
        return int(self.params.channels)
