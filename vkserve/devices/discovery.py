"""Find every device: each Vulkan physical device, then the CPU (always present).

Discovery never raises: a missing loader or ICD, or a driver that fails while
being queried, costs only the GPUs and is logged once with the reason.
"""

from __future__ import annotations

import logging
import os
import platform

from vkserve.devices.capabilities import DeviceCaps, DeviceKind, MemoryHeap

log = logging.getLogger(__name__)


def cpu_caps(index: int) -> DeviceCaps:
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 0
    return DeviceCaps(
        index=index,
        kind=DeviceKind.CPU,
        name=f"CPU ({platform.machine()}, {os.cpu_count()} threads)",
        type="cpu",
        heaps=(MemoryHeap(size=mem, device_local=True),),
    )


def discover_vulkan() -> list[DeviceCaps]:
    """Vulkan devices in the loader's order, or [] with one logged reason."""
    from vkserve.devices.vulkan.caps import read_caps  # noqa: PLC0415 (needs the loader)
    from vkserve.devices.vulkan.instance import get_instance  # noqa: PLC0415
    from vkserve.devices.vulkan.loader import VulkanUnavailable  # noqa: PLC0415

    try:
        instance = get_instance()
        if not instance.physical_devices:
            log.warning("no Vulkan GPU: the Vulkan loader found no physical device "
                        "(no ICD installed or none usable); serving on the CPU only")
            return []
        return [read_caps(instance, i) for i in range(len(instance.physical_devices))]
    except VulkanUnavailable as exc:
        log.warning("no Vulkan GPU: %s; serving on the CPU only", exc)
    except Exception as exc:  # a broken driver must not take discovery down
        log.warning("no Vulkan GPU: querying the Vulkan driver failed (%s: %s); "
                    "serving on the CPU only", type(exc).__name__, exc)
    return []


def discover_devices() -> list[DeviceCaps]:
    gpus = discover_vulkan()
    return [*gpus, cpu_caps(len(gpus))]
