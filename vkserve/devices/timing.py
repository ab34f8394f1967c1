"""Where one execution's time goes, as every engine reports it (replies carry it to clients)."""

from __future__ import annotations

import dataclasses

__all__ = ["StageTimes"]


@dataclasses.dataclass(frozen=True)
class StageTimes:
    """Seconds of one execution (of a batch: all its items together)."""

    copy_in: float  # the inputs into the engine's memory (staging buffer; the CPU's bf16 arena)
    run: float  # the execution: submit to fence on a GPU, the kernels on the CPU
    copy_out: float  # the outputs out as fp32 arrays, host-side tail layers included
    #: inputs that lay in a client's shared memory (``vkserve.devices.host_regions``): read by
    #: the GPU where they lay, and copied into staging instead (the device cannot import them)
    in_place: int = 0
    shared_copied: int = 0
