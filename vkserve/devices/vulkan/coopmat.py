"""When the engine's cooperative-matrix shaders (VK_KHR_cooperative_matrix) may run.

They multiply 16 x 16 x 16 float16_t tiles into float accumulators, one product per subgroup,
with work groups laid out for 32-wide subgroups (8 subgroups of 256 invocations), and read
their operands as float16_t, so only the fp16 storage modes qualify: in fp32 the inputs would
be rounded to fp16 and the fp32 mode would no longer mean fp32.

Where they run is measured, not assumed: on an H100 (benchmarks/coopmat_layers.py, per layer,
fp16) conv_coopmat.comp beat conv_gemm.comp only on 1x1 convolutions with a short K (<= 256
input channels per group) and many outputs (M x N >= 110,000: 0.62-0.97x of its GPU time) and
lost on most others (up to 4x on deep 3x3 layers, whose long K loop it does not split).
``VKSERVE_COOPMAT``: unset or ``auto`` = that rule; ``1`` = every convolution it can run (for
measuring); ``0`` = never.
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


AUTO_MAX_K = 256
AUTO_MIN_OUTPUTS = 110_000


def coopmat_wanted(kernel_taps: int, m: int, n: int, k: int) -> bool:
    """Whether a convolution (`kernel_taps` = kernel_h x kernel_w; GEMM M x N x K per group)
    that conv_coopmat can run should, by ``VKSERVE_COOPMAT`` (see above)."""
    mode = os.environ.get("VKSERVE_COOPMAT", "auto")
    if mode not in ("auto", "0", "1"):
        log.warning("VKSERVE_COOPMAT=%r is not auto, 0 or 1: taken as auto", mode)
        mode = "auto"
    if mode != "auto":
        return mode == "1"
    return kernel_taps == 1 and k <= AUTO_MAX_K and m * n >= AUTO_MIN_OUTPUTS
