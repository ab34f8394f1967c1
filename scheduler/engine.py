"""The one seam between the scheduler and the execution engines.

An *executor* is one Plan instance: ``run(inputs) -> outputs`` blocks (the scheduler calls it
in a worker thread) and is not re-entrant, so the scheduler compiles one per concurrent job.
The CPU engine (``devices.cpu.executor.Plan``) always exists; the Vulkan engine
(``devices.vulkan.engine``) is used when that module offers ``load_plan``. Everything the
scheduler knows about either lives in ``load_executor`` and ``is_device_fault``, so changing
how the Vulkan engine is called means editing this file only.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from devices.capabilities import Precision
from devices.cpu.executor import Plan as CpuPlan
from devices.vulkan.errors import VulkanError
from models.graph import Graph

from scheduler.devices import DeviceHandle
from scheduler.registry import ModelSpec

log = logging.getLogger(__name__)

__all__ = ["Executor", "is_device_fault", "load_executor", "vulkan_engine_available"]


class Executor(Protocol):
    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def _vulkan_load_plan() -> Callable[..., Any] | None:
    try:
        module = importlib.import_module("devices.vulkan.engine")
    except ImportError:
        return None
    loader = getattr(module, "load_plan", None)
    return loader if callable(loader) else None


def vulkan_engine_available() -> bool:
    """True when the Vulkan engine can compile Plans; without it GPUs are not used."""
    return _vulkan_load_plan() is not None


def load_executor(device: DeviceHandle, graph: Graph, spec: ModelSpec) -> Executor:
    """Compile one Plan instance of ``graph`` for ``device`` (blocking; worker thread)."""
    if device.is_cpu:
        return CpuPlan(graph, input_shapes=dict(spec.inputs))
    load_plan = _vulkan_load_plan()
    if load_plan is None:
        raise RuntimeError(f"device {device.index} ({device.name}): no Vulkan engine available")
    precision = None if spec.precision == "auto" else Precision(spec.precision)
    plan: Executor = load_plan(device.vulkan_device(), graph,
                               input_shapes=dict(spec.inputs), precision=precision)
    return plan


def close_executor(executor: Executor) -> None:
    """Free an executor's device memory (Vulkan plans have ``close``; CPU plans are GC'd)."""
    close = getattr(executor, "close", None)
    if callable(close):
        close()


def is_device_fault(exc: BaseException) -> bool:
    """Does ``exc`` mean the device itself is gone (so its jobs must move elsewhere)?

    A lost Vulkan device, or any exception an engine flags with ``device_fault = True``.
    Other errors (bugs, out-of-memory for one job) fail the job and leave the device healthy.
    """
    if isinstance(exc, VulkanError) and exc.device_lost:
        return True
    return bool(getattr(exc, "device_fault", False))
