"""When the engine's cooperative-matrix shaders (VK_KHR_cooperative_matrix) may run.

They multiply 16 x 16 x 16 float16_t tiles into float accumulators, one product per subgroup,
with work groups laid out for 32-wide subgroups (8 subgroups of 256 invocations), and read
their operands as float16_t, so only the fp16 storage modes qualify: in fp32 the inputs would
be rounded to fp16 and the fp32 mode would no longer mean fp32.

They are opt-in (``VKSERVE_COOPMAT=1``): on an H100 conv_coopmat.comp is correct but slower
than conv_gemm.comp on every benchmark model (benchmarks/RESULTS.md, issue 17), so the default
stays on the FMA kernel until the tuner can choose per layer.
"""

from __future__ import annotations

import logging
import os

from vkserve.devices.capabilities import DeviceCaps, Precision

log = logging.getLogger(__name__)

SUBGROUP = 32
FP16_MODES = (Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC)


def fp16_coopmat(caps: DeviceCaps, precision: Precision) -> bool:
    """Whether conv_coopmat.comp can be built and run for this device and mode."""
    return (precision in FP16_MODES and caps.subgroup_size == SUBGROUP
            and caps.has_coop_matrix(16, 16, 16, "float16_t", "float"))


def coopmat_requested() -> bool:
    """Whether layers should use the cooperative-matrix shaders where `fp16_coopmat` allows."""
    on = os.environ.get("VKSERVE_COOPMAT", "") not in ("", "0")
    if on:
        log.info("VKSERVE_COOPMAT is set: fp16 convolutions use cooperative matrices where the device has them")
    return on
