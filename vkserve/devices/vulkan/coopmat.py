"""When the engine's cooperative-matrix shaders (VK_KHR_cooperative_matrix) may run.

They multiply 16 x 16 x 16 float16_t tiles into float accumulators, one product per subgroup,
with work groups laid out for 32-wide subgroups (8 subgroups of 256 invocations), and read
their operands as float16_t, so only the fp16 storage modes qualify: in fp32 the inputs would
be rounded to fp16 and the fp32 mode would no longer mean fp32.

Where they run is measured, not assumed. conv_coopmat.comp orders K kernel tap first, input
channels padded to whole steps of 32 per tap, and splits K over work groups when the output
tiles are too few. On an H200 (benchmarks/coopmat_layers.py, 239 convolutions of 9 models, per
layer GPU time, fp16; RESULTS.md, issue 17) it took 0.26-0.8x of conv_gemm.comp's time on every
3x3 layer with 32 or more input channels, but small layers (a few million multiply-adds: the
mobile models' 1x1 layers) ran up to 1.8x slower, as did layers whose K is mostly padding
(3 input channels padded to 32: 1.6-2.4x). Of the rules tried on that table, "K >= 512 and
M x N x K >= 15 M" came within 1.5 % of the per-layer best sum (2.84 vs 2.80 ms; conv_gemm
everywhere 4.57, conv_coopmat everywhere 3.18). ``VKSERVE_COOPMAT``: unset or ``auto`` = that
rule, for convolutions whose padded channels are at least `AUTO_MIN_CHANNEL_USE` real, and
`coop_gemm_wanted`'s for products; ``1`` = every convolution and product they can run (for
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


AUTO_MIN_CHANNEL_USE = 0.75
AUTO_MIN_K = 512
AUTO_MIN_MACS = 15_000_000


#: gemm_coopmat (Gemm / MatMul / attention products), per layer on the H200
#: (benchmarks/coopmat_layers.py on convnext_tiny and vit_tiny; RESULTS.md, issue 17): without
#: split K, 0.83-0.93x of gemm.comp's time where K >= 192 and its tile gave >= 156 work groups,
#: about even at 75-96 groups, 1.9-2.3x slower with 21-42 groups and K of 768-3072 (a long K
#: loop on few compute units, which gemm.comp splits over slices), 1.1-1.3x slower with K = 96
#: (three steps: the prologue and epilogue dominate). A Gemm splits K over work groups (its
#: partials in scratch); then those long-K layers took 0.44-0.70x of gemm.comp's time. The rule:
#: K >= 128 and, split included, a work group for every compute unit.
AUTO_GEMM_MIN_K = 128
AUTO_GEMM_MIN_GROUPS = 132


def _mode() -> str:
    mode = os.environ.get("VKSERVE_COOPMAT", "auto")
    if mode not in ("auto", "0", "1"):
        log.warning("VKSERVE_COOPMAT=%r is not auto, 0 or 1: taken as auto", mode)
        return "auto"
    return mode


def coopmat_in_use(caps: DeviceCaps, precision: Precision) -> bool:
    """Whether this device and mode run the cooperative-matrix shaders at all: they can, and
    ``VKSERVE_COOPMAT`` is not 0 (the kernel other choices compete with, as in
    vulkan.winograd's rule)."""
    return fp16_coopmat(caps, precision) and _mode() != "0"


def coopmat_wanted(icg: int, cpad: int, m: int, n: int, k: int) -> bool:
    """Whether a convolution that conv_coopmat can run (`icg` input channels per group,
    padded to `cpad` per kernel tap; GEMM M x N x K per group) should, by
    ``VKSERVE_COOPMAT`` (see above)."""
    mode = _mode()
    if mode != "auto":
        return mode == "1"
    return icg >= AUTO_MIN_CHANNEL_USE * cpad and k >= AUTO_MIN_K and m * n * k >= AUTO_MIN_MACS


def coop_gemm_wanted(k: int, work_groups: int, by_size: bool = True) -> bool:
    """Whether a Gemm / MatMul / attention product with a K of `k` whose gemm_coopmat tile
    makes `work_groups` work groups should run as gemm_coopmat on a device that has it, by
    ``VKSERVE_COOPMAT``; without `by_size` (a product that saves a dispatch there: a folded
    LayerNorm) whatever its size unless the variable is 0."""
    mode = _mode()
    if mode != "auto":
        return mode == "1"
    return not by_size or (k >= AUTO_GEMM_MIN_K and work_groups >= AUTO_GEMM_MIN_GROUPS)
