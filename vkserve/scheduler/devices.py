"""DeviceHandle: one device as the scheduler sees it, plus the fault-injection test hooks.

The hooks act inside the device worker thread, right before the executor runs, so a test
exercises the real failover path (the same exception type a lost Vulkan device raises, the
same worker, the same retry bookkeeping) without mocking Vulkan:

- ``inject_fault(n)``: the next n runs raise ``VulkanError(..., "VK_ERROR_DEVICE_LOST")``;
- ``inject_delay(s)``: every run takes s seconds longer (a slower device, for placement);
- ``pause()`` / ``resume()``: runs wait at the gate (a saturated device, deterministically).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vkserve.cache.pipeline_cache import CacheStats
from vkserve.devices.capabilities import DeviceCaps, DeviceKind
from vkserve.devices.discovery import GpuProblem, cpu_caps, discover
from vkserve.devices.names import device_name
from vkserve.devices.vulkan.errors import VulkanError
from vkserve.scheduler.reports import MemoryStats

log = logging.getLogger(__name__)

__all__ = ["DeviceHandle", "discover_handles"]

_GATE_POLL_S = 0.02


class DeviceHandle:
    """A device's identity and capabilities, the Vulkan device object (opened lazily in a
    worker thread by the engine adapter) and the test hooks. Health and load live in the
    scheduler, which may be restarted over the same handles."""

    def __init__(self, caps: DeviceCaps, cache_dir: Path | None = None) -> None:
        self.caps = caps
        self.cache_dir = cache_dir
        self._lock = threading.Lock()
        self._faults = 0
        self._fault_after = 0  # runs that pass before the injected faults start
        self._delay_s = 0.0
        self._gate = threading.Event()
        self._gate.set()
        self._vulkan: Any = None  # devices.vulkan.device.VulkanDevice, once opened

    @classmethod
    def cpu(cls, index: int = 0) -> DeviceHandle:
        """A CPU device; tests make two to exercise placement and failover without a GPU."""
        return cls(cpu_caps(index))

    @property
    def index(self) -> int:
        return self.caps.index

    @property
    def name(self) -> str:
        """The driver's name of the device."""
        return self.caps.name

    @property
    def id(self) -> str:
        """Its name in replies, metrics and logs: ``cpu`` or ``vulkan:N`` (devices.names)."""
        return device_name(self.caps.kind, self.caps.index)

    @property
    def kind(self) -> str:
        return self.caps.kind.value

    @property
    def is_cpu(self) -> bool:
        return self.caps.kind is DeviceKind.CPU

    @property
    def rank(self) -> int:
        """Tie-break between equally fast devices: real GPUs, then software Vulkan, then CPU."""
        if self.is_cpu:
            return 2
        return 1 if self.caps.is_software else 0

    def __repr__(self) -> str:
        return f"DeviceHandle({self.index}, {self.id}, {self.name!r})"

    # -- Vulkan device (used by the engine adapter, in worker threads) ----------------------

    def vulkan_device(self) -> Any:
        """The opened VulkanDevice (context + PipelineCache), created on first use."""
        with self._lock:
            if self._vulkan is None:
                from vkserve.devices.vulkan.device import VulkanDevice  # noqa: PLC0415 (needs Vulkan)

                self._vulkan = VulkanDevice(self.caps, self.cache_dir)
            return self._vulkan

    def opened_vulkan_device(self) -> Any:
        """The VulkanDevice if it was opened already (never opens one), else None."""
        with self._lock:
            return self._vulkan

    def cache_stats(self) -> CacheStats | None:
        """A copy of the pipeline cache's counters; None before the Vulkan device is opened
        and on the CPU."""
        device = self.opened_vulkan_device()
        return None if device is None else dataclasses.replace(device.pipelines.stats)

    def save_pipeline_cache(self) -> bool:
        """Persist the device's pipeline cache if it changed (after a model load; the file
        write is atomic and only the writer process writes). False on the CPU."""
        device = self.opened_vulkan_device()
        return False if device is None else bool(device.pipelines.save())

    def memory_stats(self) -> MemoryStats | None:
        """Bytes of the device's memory pool; None before the Vulkan device is opened and on
        the CPU."""
        device = self.opened_vulkan_device()
        if device is None:
            return None
        pool = device.pool
        stats = pool.stats()
        idle = pool.idle_bytes
        return MemoryStats(in_use_bytes=max(0, stats["held_bytes"] - idle), pooled_bytes=idle,
                           budget_bytes=stats["budget_bytes"])

    def glsl_compiles(self) -> int:
        """GLSL -> SPIR-V compiles so far on this device (0 when none was opened)."""
        stats = self.cache_stats()
        return 0 if stats is None else stats.glsl_compiles

    def close(self) -> None:
        """Save the pipeline cache and destroy the Vulkan device (blocking)."""
        with self._lock:
            device, self._vulkan = self._vulkan, None
        if device is not None:
            device.close()

    # -- test hooks ---------------------------------------------------------------------

    def inject_fault(self, n_jobs: int = 1, after: int = 0) -> None:
        """Make ``n_jobs`` runs on this device raise a device-lost VulkanError: the next ones,
        or those after ``after`` more runs (a fault in the middle of a load)."""
        with self._lock:
            self._faults += n_jobs
            self._fault_after = after

    def inject_delay(self, seconds: float) -> None:
        """Add ``seconds`` to every run on this device (0 removes it)."""
        with self._lock:
            self._delay_s = max(0.0, seconds)

    def pause(self) -> None:
        """Hold every run at the gate until ``resume()``: the device looks saturated."""
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def hooked(self) -> bool:
        """Is a hook set (paused, a delay or faults to come)? Runs then stay off the event
        loop's thread (a paused run there would hold the loop that resumes it)."""
        with self._lock:
            return not self._gate.is_set() or self._delay_s > 0 or self._faults > 0

    def wait_gate(self, between_waits: Callable[[], None]) -> None:
        """Worker thread, before a run: block while paused.

        Calls ``between_waits`` between slices (it raises once the scheduler stops), so
        shutting the scheduler down never hangs on a paused device (the same pattern as
        Vulkan fence waits).
        """
        while not self._gate.wait(_GATE_POLL_S):
            between_waits()

    def apply_hooks(self, between_waits: Callable[[], None]) -> None:
        """Worker thread, inside the timed run: the injected delay (slept in slices with
        ``between_waits`` between them, like a real wait), then an injected fault."""
        with self._lock:
            fault = self._faults > 0 and self._fault_after == 0
            if fault:
                self._faults -= 1
            elif self._faults:
                self._fault_after -= 1
            delay = self._delay_s
        end = time.monotonic() + delay
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, _GATE_POLL_S))
            between_waits()
        if fault:
            raise VulkanError(f"vkQueueSubmit on device {self.index} (injected fault)",
                              "VK_ERROR_DEVICE_LOST")


def discover_handles(*, use_vulkan: bool, cache_dir: str | None = None
                     ) -> tuple[list[DeviceHandle], GpuProblem | None]:
    """Every usable device: Vulkan GPUs when ``use_vulkan`` (the caller checks that an engine
    exists), then the CPU; and discovery's GPU problem (GPU device nodes, but no Vulkan GPU).
    Blocking (driver queries): call it in a worker thread."""
    handles = []
    cache = Path(cache_dir) if cache_dir else None
    found = discover()
    for caps in found.devices:
        if caps.kind is DeviceKind.VULKAN and not use_vulkan:
            continue
        handles.append(DeviceHandle(caps, cache))
    if not any(h.is_cpu for h in handles):  # discovery always lists it; be safe anyway
        handles.append(DeviceHandle(cpu_caps(len(handles))))
    return handles, found.gpu_problem
