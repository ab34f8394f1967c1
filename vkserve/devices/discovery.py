"""Find every device: each Vulkan physical device, then the CPU (always present).

Discovery never raises: a missing loader or ICD, a ``vulkan`` binding that fails to import,
or a driver that fails while being queried, costs only the GPUs and is logged once with the
reason. When that happens on a machine that has GPU device nodes (``/dev/dri/renderD*``,
``/dev/nvidia[0-9]*``), a GPU is there but unusable: the line is an ERROR naming the nodes,
and ``Discovery.gpu_problem`` carries it on (the daemon shows it in its status, on ``/readyz``
and in the ``vkserve_gpu_unusable`` metric).
"""

from __future__ import annotations

import dataclasses
import enum
import glob
import logging
import os
import platform

from vkserve.devices.capabilities import DeviceCaps, DeviceKind, MemoryHeap

log = logging.getLogger(__name__)

__all__ = ["GPU_NODES_VAR", "GPU_NODE_PATTERNS", "Discovery", "GpuFailure", "GpuProblem",
           "cpu_caps", "discover", "discover_devices", "gpu_device_nodes"]

#: Device nodes that mean "this machine has a GPU" (DRM render nodes, NVIDIA's own nodes).
GPU_NODE_PATTERNS = ("/dev/dri/renderD*", "/dev/nvidia[0-9]*")
#: Test hook: glob patterns (``os.pathsep``-separated) that replace GPU_NODE_PATTERNS, so a
#: test can point discovery at a folder holding a fake ``renderD128``.
GPU_NODES_VAR = "VKSERVE_TEST_GPU_NODES"


class GpuFailure(enum.StrEnum):
    """Why Vulkan discovery found no GPU (the ``reason`` label of ``vkserve_gpu_unusable``)."""

    NO_LOADER = "no_loader"  # libvulkan.so.1 or the ``vulkan`` binding cannot be loaded
    NO_DRIVER = "no_driver"  # vkCreateInstance failed: no usable driver (ICD)
    NO_DEVICE = "no_device"  # the loader enumerated no physical device
    DRIVER_ERROR = "driver_error"  # the driver failed while being queried


@dataclasses.dataclass(frozen=True)
class GpuProblem:
    """GPU device nodes exist, but Vulkan found no GPU: only the CPU serves."""

    nodes: tuple[str, ...]
    reason: GpuFailure
    detail: str  # the loader's or driver's own words

    def describe(self) -> str:
        return (f"no Vulkan GPU although GPU device node(s) {', '.join(self.nodes)} exist "
                f"({self.reason}): {self.detail}; serving on the CPU only")


@dataclasses.dataclass(frozen=True)
class Discovery:
    devices: list[DeviceCaps]  # the Vulkan GPUs, then the CPU
    gpu_problem: GpuProblem | None = None


class _NoGpu(Exception):
    def __init__(self, reason: GpuFailure, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


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


def gpu_device_nodes() -> list[str]:
    """The GPU device nodes present (``$VKSERVE_TEST_GPU_NODES`` or GPU_NODE_PATTERNS)."""
    hook = os.environ.get(GPU_NODES_VAR)
    patterns = hook.split(os.pathsep) if hook else GPU_NODE_PATTERNS
    return sorted({path for pattern in patterns if pattern for path in glob.glob(pattern)})


def _vulkan_gpus() -> list[DeviceCaps]:
    """Vulkan devices in the loader's order; raises _NoGpu with the reason when there is none."""
    from vkserve.devices.vulkan.loader import VulkanUnavailable, vulkan_module  # noqa: PLC0415

    try:
        vulkan_module()
    except (VulkanUnavailable, ImportError, OSError) as exc:
        raise _NoGpu(GpuFailure.NO_LOADER, str(exc) or type(exc).__name__) from None
    try:
        from vkserve.devices.vulkan.caps import read_caps  # noqa: PLC0415 (needs the loader)
        from vkserve.devices.vulkan.instance import get_instance  # noqa: PLC0415

        instance = get_instance()
        gpus = [read_caps(instance, i) for i in range(len(instance.physical_devices))]
    except VulkanUnavailable as exc:
        raise _NoGpu(GpuFailure.NO_DRIVER, str(exc)) from None
    except Exception as exc:  # a broken driver must not take discovery down
        raise _NoGpu(GpuFailure.DRIVER_ERROR, f"querying the Vulkan driver failed "
                                              f"({type(exc).__name__}: {exc})") from None
    if not gpus:
        raise _NoGpu(GpuFailure.NO_DEVICE, "the Vulkan loader found no physical device "
                                           "(no ICD installed or none usable)")
    return gpus


def discover() -> Discovery:
    """Every device, and the GPU problem when GPU device nodes exist but Vulkan found none."""
    try:
        gpus = _vulkan_gpus()
    except _NoGpu as why:
        nodes = gpu_device_nodes()
        if not nodes:
            log.warning("no Vulkan GPU: %s; serving on the CPU only", why.detail)
            return Discovery([cpu_caps(0)])
        problem = GpuProblem(tuple(nodes), why.reason, why.detail)
        log.error("%s", problem.describe())
        return Discovery([cpu_caps(0)], problem)
    return Discovery([*gpus, cpu_caps(len(gpus))])


def discover_devices() -> list[DeviceCaps]:
    return discover().devices
