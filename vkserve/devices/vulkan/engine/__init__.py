"""The Vulkan executor (plan.py), its memory pool (pool.py) and the entry point the CLI uses.

`load_plan` opens one Vulkan device with its persistent PipelineCache and compiles a graph
into a Plan, timing the whole model load (device + cache file + pipelines + weights): with a
warm cache it compiles no GLSL. Imports are deferred because devices.vulkan.device itself
imports engine.pool, and because Vulkan must stay optional for CPU-only use.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vkserve.devices.names import device_name

if TYPE_CHECKING:
    from vkserve.devices.capabilities import DeviceCaps
    from vkserve.devices.progress import ProgressFn
    from vkserve.devices.vulkan.device import VulkanDevice
    from vkserve.devices.vulkan.engine.plan import Plan
    from vkserve.models.graph import Graph


class DeviceNotFound(LookupError):
    """No Vulkan device of the requested index."""


@dataclasses.dataclass
class LoadedPlan:
    """A Plan and the device it lives on; closing it closes both and saves the cache."""

    device: VulkanDevice
    plan: Plan
    load_seconds: float
    glsl_compiles: int

    def info(self) -> dict[str, Any]:
        caps = self.device.caps
        return {"device": device_name(caps.kind, caps.index), "device_name": caps.name,
                "precision": self.plan.precision.value,
                "load_seconds": round(self.load_seconds, 4), "glsl_compiles": self.glsl_compiles,
                "pipeline_cache": str(self.device.pipelines.path) if self.device.pipelines.path
                else None, **self.plan.summary()}

    def close(self) -> None:
        try:
            self.plan.close()
        finally:
            self.device.close(save=True)

    def __enter__(self) -> LoadedPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def find_vulkan_device(index: int) -> DeviceCaps:
    """The capabilities of Vulkan device ``index``; DeviceNotFound names the ones there are."""
    from vkserve.devices.capabilities import DeviceKind  # noqa: PLC0415 (see module docstring)
    from vkserve.devices.discovery import discover_devices  # noqa: PLC0415

    gpus = [d for d in discover_devices() if d.kind is DeviceKind.VULKAN]
    caps = next((d for d in gpus if d.index == index), None)
    if caps is None:
        there = ", ".join(device_name(d.kind, d.index) for d in gpus) or "none"
        raise DeviceNotFound(f"no Vulkan device {index} (Vulkan devices: {there})")
    return caps


def load_plan(graph: Graph, device_index: int, precision: str,
              input_shapes: Mapping[str, Sequence[int]] | None = None,
              outputs: Sequence[str] | None = None, cache_dir: Path | None = None,
              progress: ProgressFn | None = None) -> LoadedPlan:
    """Open Vulkan device `device_index` (its cache under `cache_dir`, default
    cache.persist.default_cache_dir()) and compile `graph` for it; precision 'fp32' or 'fp16';
    `progress` hears of every pipeline built."""
    from vkserve.cache.persist import default_cache_dir  # noqa: PLC0415 (see module docstring)
    from vkserve.devices.vulkan.device import VulkanDevice  # noqa: PLC0415
    from vkserve.devices.vulkan.engine.plan import Plan, engine_precision  # noqa: PLC0415

    caps = find_vulkan_device(device_index)
    mode = engine_precision(caps, precision)
    t0 = time.perf_counter()
    device = VulkanDevice(caps, cache_dir or default_cache_dir())
    try:
        plan = Plan(device, graph, input_shapes, mode, outputs, progress=progress)
    except BaseException:
        device.close(save=False)
        raise
    return LoadedPlan(device, plan, time.perf_counter() - t0, plan.glsl_compiles)
