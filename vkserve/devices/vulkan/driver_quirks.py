"""Drivers whose own pipeline cache (VkPipelineCache) is known to be broken.

On a matching device vkserve creates pipelines without a driver cache and neither loads
nor saves the driver's blob (the SPIR-V tier and the live pipelines still work); the
backend logs one WARNING naming the entry and the device counts it as the pipeline
cache error op `driver_bypass`.
"""

from __future__ import annotations

import dataclasses

from vkserve.devices.capabilities import DeviceCaps


def vk_version(major: int, minor: int, patch: int) -> int:
    return (major << 22) | (minor << 12) | patch


@dataclasses.dataclass(frozen=True)
class BrokenPipelineCache:
    """Devices of `vendor_id` whose reported apiVersion is below `below_api_version`
    (0: every version) and, when given, whose driver name contains `driver_name`."""

    vendor_id: int
    reason: str
    below_api_version: int = 0
    driver_name: str = ""

    def matches(self, caps: DeviceCaps) -> bool:
        return (caps.vendor_id == self.vendor_id
                and (not self.below_api_version or caps.api_version < self.below_api_version)
                and self.driver_name.lower() in caps.driver_name.lower())


BROKEN_PIPELINE_CACHES: tuple[BrokenPipelineCache, ...] = (
    BrokenPipelineCache(
        vendor_id=0x5143,  # Qualcomm
        below_api_version=vk_version(1, 0, 66),
        reason="Qualcomm Adreno drivers before Vulkan 1.0.66 corrupt pipelines shared "
               "through an online pipeline cache"),
)


def broken_pipeline_cache(caps: DeviceCaps) -> BrokenPipelineCache | None:
    """The entry of the list that matches `caps`, if any."""
    return next((entry for entry in BROKEN_PIPELINE_CACHES if entry.matches(caps)), None)
