"""Helpers shared by the compute-heavy Vulkan layers (conv, pooling, innerproduct, misc).

Shader parameter convention of these layers: the shape-like parameters come first in the
shader's constant ids and are read through ``psc()``, so they are passed twice, as
specialization constants (folded by the driver) and, in the same order, as push constants (the
fallback ``psc`` takes for a value of 0). Parameters that are not shapes (activation type and
its parameters, pooling type) follow as plain specialization constants.
"""

from __future__ import annotations

from collections.abc import Sequence

from vkserve.devices.vulkan.layers.base import Dispatch, Scalar
from vkserve.models.layers import activation_values

# Work-group size of the shaders that reduce across a work group (they declare it themselves).
REDUCE_LOCAL = 64

# The GPU that the GEMM shaders' tile and split choices aim at: a big discrete one (an H100
# has 132 SMs of up to 2048 resident invocations). Layers do not see the device's caps, so
# one figure is used everywhere; on a smaller GPU the choices only split K more than needed.
GEMM_UNITS = 132          # compute units (SMs)
GEMM_THREADS = 256        # the GEMM shaders' work-group size (they declare it)
COOP_TARGET_GROUPS = 2 * GEMM_UNITS  # work groups that keep every unit busy: K is split to reach it
COOP_MIN_SPLIT_STEPS = 4  # steps per split at least: partials cost a write and a read per split


def split_k(tiles: int, steps: int) -> tuple[int, int]:
    """(ksplit, split_steps) of the cooperative-matrix GEMMs: the fewest splits that give
    `COOP_TARGET_GROUPS` work groups with `tiles` output tiles, each split at least
    `COOP_MIN_SPLIT_STEPS` steps of `steps`."""
    want = min(-(-COOP_TARGET_GROUPS // tiles), max(1, steps // COOP_MIN_SPLIT_STEPS))
    per = -(-steps // max(1, want))
    return -(-steps // per), per


def activation_constants(activation_type: int, activation_params: Sequence[float]) -> tuple[Scalar, ...]:
    """(type, param 0, param 1) for the shaders' `activate()` (vkserve.models.layers'
    `activation_values`: ncnn's defaults filled in)."""
    return (int(activation_type), *activation_values(activation_type, tuple(activation_params)))


#: activate.h's types past ncnn's 0-6: a GELU layer folded into the layer before it
GELU_ERF = 7
GELU_TANH = 8
NO_ACTIVATION: tuple[Scalar, ...] = (0, 0.0, 0.0)


def _pow2ceil(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def local_size_3d(gx: int, gy: int, gz: int, total: int = 64, max_x: int = 8) -> tuple[int, int, int]:
    """A power-of-two work group of `total` invocations shaped to the dispatch: up to `max_x`
    along x (8 by default: image rows are short in these models, 7..56), then y, then z, so
    that small outputs do not leave most of a group idle."""
    lx = min(_pow2ceil(gx), max_x, total)
    ly = min(_pow2ceil(gy), total // lx)
    lz = min(_pow2ceil(gz), total // (lx * ly))
    return (lx, ly, lz)


def make_dispatch(
    shader: str,
    bindings: Sequence[str],
    global_size: tuple[int, int, int],
    psc: Sequence[Scalar],
    fixed: Sequence[Scalar] = (),
    local_size: tuple[int, int, int] | None = None,
    batched: bool = False,
) -> Dispatch:
    """A Dispatch whose `psc` values are both specialization constants 0..n-1 and the push
    constant block, followed by the `fixed` specialization constants."""
    return Dispatch(
        shader=shader,
        bindings=tuple(bindings),
        global_size=global_size,
        push_constants=tuple(psc),
        spec_constants=tuple(psc) + tuple(fixed),
        local_size=local_size if local_size is not None else local_size_3d(*global_size),
        batched=batched,
    )
