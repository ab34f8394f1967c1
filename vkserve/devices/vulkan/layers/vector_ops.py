"""ArgMax, Cast, Normalize, MVN and Embed on Vulkan (their meaning: vkserve.models.layers).

ArgMax is one ``argmax`` work group (topk passes over the blob). Cast is one ``cast``
dispatch where it rounds, an alias otherwise. MVN and Normalize are one ``normalize``
dispatch, a work group of 64 per normalised run (a channel, the whole blob, or for Normalize
across channels only one spatial position's channel vector, read with a stride). Embed is one
``embed`` gather.

ArgMax's indices and Embed's token ids are held as blob values: exact in fp32 up to 2^24, in
the fp16 modes only up to 2048, so larger blobs / vocabularies are refused there.
"""

from __future__ import annotations

import math

import numpy as np

from vkserve.devices.capabilities import Precision
from vkserve.devices.errors import UnsupportedError
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, Dispatch, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL
from vkserve.devices.vulkan.layers.shape import LOCAL, linear_grid
from vkserve.models.layers import stat_channels

_DUMMY = np.zeros(2, np.float32)


def exact_int_limit(precision: Precision) -> int:
    """The largest n such that the storage type holds every integer 0..n exactly."""
    return 1 << 24 if precision is Precision.FP32 else 1 << 11


def _check_integers(layer: VulkanLayer, what: str, largest: int) -> None:
    limit = exact_int_limit(layer.precision)
    if largest > limit:
        raise UnsupportedError(f"{what} reach {largest}; {layer.precision.value} blobs hold "
                               f"integers exactly only up to {limit}")


def _vec4_count(shape: tuple[int, ...]) -> int:
    return -(-math.prod(shape) // 4)


@register("ArgMax")
class VulkanArgMax(VulkanLayer):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.size = math.prod(self.in_shapes[0])
        _check_integers(self, "ArgMax indices", self.size - 1)

    def dispatches(self) -> list[Dispatch]:
        return [Dispatch("argmax", (self.layer.inputs[0], self.layer.outputs[0]),
                         (REDUCE_LOCAL, 1, 1), push_constants=(self.size, self.params.topk),
                         spec_constants=(int(self.params.out_max_val),),
                         local_size=(REDUCE_LOCAL, 1, 1))]


@register("Cast")
class VulkanCast(VulkanLayer):
    """A rounding to the storage type (float16 in the fp16 modes) changes nothing: an alias."""

    inplace_inputs = (0,)

    def to_type(self) -> int | None:
        """cast.comp's to_type (2 float16, 4 bfloat16), or None when values pass unchanged."""
        rounding = self.params.rounding()
        if rounding == "float16" and self.precision is not Precision.FP32:
            return None
        return {"float16": 2, "bfloat16": 4}.get(rounding or "")

    @property
    def aliases_input(self) -> bool:
        return self.to_type() is None

    def dispatches(self) -> list[Dispatch]:
        n4 = _vec4_count(self.in_shapes[0])
        return [Dispatch("cast", (self.layer.inputs[0], self.layer.outputs[0]), linear_grid(n4),
                         push_constants=(n4,), spec_constants=(self.to_type() or 0,),
                         local_size=LOCAL)]


class _GroupNormalize(VulkanLayer):
    """One normalize.comp dispatch; subclasses set the runs and the constants."""

    run: int
    groups: int
    gstride: int
    estride: int
    cstep: int = 1
    spec: tuple[int, int, int]

    def _grid(self) -> tuple[int, int, int]:
        gx = min(self.groups, MAX_GROUPS)
        gy = -(-self.groups // gx)
        if gy > MAX_GROUPS:
            raise UnsupportedError(f"{self.layer.type} over {self.in_shapes[0]}: too many groups")
        return (gx * REDUCE_LOCAL, gy, 1)

    def scale(self) -> np.ndarray:
        return _DUMMY

    def weights(self) -> dict[str, np.ndarray]:
        return {"scale": self.scale()}

    def dispatches(self) -> list[Dispatch]:
        return [Dispatch("normalize", (self.layer.inputs[0], self.layer.outputs[0], "w:scale"),
                         self._grid(),
                         push_constants=(self.run, self.groups, self.gstride, self.estride,
                                         self.cstep, float(self.params.eps)),
                         spec_constants=self.spec, local_size=(REDUCE_LOCAL, 1, 1))]


@register("MVN")
class VulkanMVN(_GroupNormalize):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        shape = self.in_shapes[0]
        self.groups = 1 if self.params.across_channels else stat_channels(shape)
        self.run = self.gstride = math.prod(shape) // self.groups
        self.estride = 1
        self.spec = (0, int(self.params.normalize_variance), 0)


@register("Normalize")
class VulkanNormalize(_GroupNormalize):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        p, shape = self.params, self.in_shapes[0]
        channels = stat_channels(shape)
        self.cstep = math.prod(shape) // channels
        if p.across_spatial:  # a run per channel, or the whole blob
            self.groups = 1 if p.across_channel else channels
            self.run = math.prod(shape) // self.groups
            self.gstride, self.estride = self.run, 1
        else:  # a run per spatial position, across the channels
            self.groups, self.run, self.gstride, self.estride = self.cstep, channels, 1, self.cstep
        self.spec = (1, int(p.eps_mode), int(bool(p.channel_shared)))

    @property
    def aliases_input(self) -> bool:
        return not (self.params.across_spatial or self.params.across_channel)

    def scale(self) -> np.ndarray:
        return np.asarray(self.layer.weights[0], np.float32).ravel().copy()


@register("Embed")
class VulkanEmbed(VulkanLayer):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        _check_integers(self, f"Embed token ids (input_dim {self.params.input_dim})",
                        self.params.input_dim - 1)

    def weights(self) -> dict[str, np.ndarray]:
        ws = self.layer.weights
        bias = np.asarray(ws[1], np.float32).ravel().copy() if self.params.bias_term else _DUMMY
        return {"weight": np.asarray(ws[0], np.float32).ravel().copy(), "bias": bias}

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        size = math.prod(self.out_shapes[0])
        return [Dispatch("embed", (self.layer.inputs[0], self.layer.outputs[0], "w:weight",
                                   "w:bias"), linear_grid(size),
                         push_constants=(size, p.num_output, p.input_dim),
                         spec_constants=(int(bool(p.bias_term)),), local_size=LOCAL)]
