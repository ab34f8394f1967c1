"""When the engine's cooperative-matrix shaders (VK_KHR_cooperative_matrix) may run.

They multiply 16 x 16 x 16 float16_t tiles into float accumulators, one product per subgroup,
with work groups laid out for 32-wide subgroups (8 subgroups of 256 invocations), and read
their operands as float16_t, so only the fp16 storage modes qualify: in fp32 the inputs would
be rounded to fp16 and the fp32 mode would no longer mean fp32.

Where they run is measured, not assumed. conv_coopmat.comp orders K kernel tap first, input
channels padded to whole steps of 32 per tap, and splits K over work groups when the output
tiles are too few. On an H200 (benchmarks/coopmat_layers.py, per layer, fp16; RESULTS.md, issue
17) it beat conv_gemm.comp on every 3x3 layer of vgg16, resnet18 and resnet50 (0.27-0.8x of its
GPU time) and on most 1x1 layers (0.5-1.1x), and lost where the padding is most of K
(3 input channels padded to 32: resnet's 7x7 conv1 2.4x slower). ``VKSERVE_COOPMAT``: unset or
``auto`` = every convolution whose padded channels are at least `AUTO_MIN_CHANNEL_USE` real;
``1`` = every convolution it can run (for measuring); ``0`` = never.
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


AUTO_MIN_CHANNEL_USE = 0.75


def coopmat_wanted(icg: int, cpad: int) -> bool:
    """Whether a convolution that conv_coopmat can run (`icg` input channels per group,
    padded to `cpad` per kernel tap) should, by ``VKSERVE_COOPMAT`` (see above)."""
    mode = os.environ.get("VKSERVE_COOPMAT", "auto")
    if mode not in ("auto", "0", "1"):
        log.warning("VKSERVE_COOPMAT=%r is not auto, 0 or 1: taken as auto", mode)
        mode = "auto"
    if mode != "auto":
        return mode == "1"
    return icg >= AUTO_MIN_CHANNEL_USE * cpad
