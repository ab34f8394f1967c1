"""What the scheduler hands the daemon: states, model and device reports, control results.

Plain frozen dataclasses and string enums, built fresh on every call (a report never changes
under its reader). The daemon turns them into wire maps in one place
(``vkserve.daemon.backend.to_wire``): field names are the wire's keys, enums go out as their
values.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Literal

from vkserve.cache.pipeline_cache import CacheStats
from vkserve.devices.discovery import GpuProblem
from vkserve.devices.names import device_name

__all__ = [
    "DeviceStatus",
    "JobTotals",
    "MemoryStats",
    "ModelInfo",
    "ModelQueue",
    "ModelState",
    "PlacementInfo",
    "PlacementState",
    "RescanResult",
    "SchedulerState",
    "Status",
    "UnloadResult",
]


class SchedulerState(enum.StrEnum):
    NEW = "new"
    STARTING = "starting"  # discovering devices, starting workers
    RUNNING = "running"  # accepting jobs
    CLOSING = "closing"  # aclose(): refusing new jobs, draining admitted ones
    STOPPING = "stopping"  # ending what is left, freeing the devices
    STOPPED = "stopped"


class PlacementState(enum.StrEnum):
    """One model on one device."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"  # the load failed, or the model was unloaded from the device


class ModelState(enum.StrEnum):
    """A model over all its devices: ready on a healthy one, else loading, else failed."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNLOADING = "unloading"


@dataclasses.dataclass(frozen=True)
class PlacementInfo:
    device: int
    state: PlacementState
    error: str | None
    healthy: bool  # the device's health
    latency_ms: float | None  # EWMA of run times, once measured
    load_seconds: float | None
    load_cache: Literal["cold", "warm"] | None  # cold: the load compiled GLSL
    in_flight: int
    shapes: list[str] = dataclasses.field(default_factory=list)  # input shapes with built Plans
    progress: str | None = None  # while loading: what is building ("building Plans for ... (1 of 2)")
    name: str = ""  # the device's name: cpu or vulkan:N (devices.names); `device` is the scheduler's index


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """One entry of ``Scheduler.models()`` (and what ``load_model`` returns)."""

    name: str
    state: ModelState
    inputs: dict[str, list[int]]  # name -> shape (-1: any size; []: any shape, see scheduler.shapes)
    outputs: dict[str, list[int]]
    devices: list[int]  # where it is ready, on a healthy device
    placements: list[PlacementInfo]
    queue_depth: int
    in_flight: int
    queue_limit: int
    precision: str
    error: str | None  # why it is failed (None unless failed)
    # reloads (Scheduler.rescan: load-new-then-swap; this version serves meanwhile)
    reloading: bool = False  # a new version of its files is loading beside this one
    reload_error: str | None = None  # why the last reload failed (None once one succeeds)
    reload_failures: int = 0  # failed reloads of this model since start
    max_batch_size: int = 1  # jobs one execution may run together (config.toml); 1: no batching
    device_names: list[str] = dataclasses.field(default_factory=list)  # `devices` by name (cpu, vulkan:N)


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Bytes of a Vulkan device's memory pool."""

    in_use_bytes: int  # held by loaded models and running jobs
    pooled_bytes: int  # idle, kept for reuse
    budget_bytes: int


@dataclasses.dataclass(frozen=True)
class DeviceStatus:
    index: int
    device: str = dataclasses.field(init=False)  # its name: cpu or vulkan:N (devices.names)
    name: str  # the driver's name of the device
    kind: str  # "vulkan" or "cpu"
    software: bool
    healthy: bool
    fault: str | None = None
    slots: int = 1
    queue_depth: int = 0  # jobs placed on this device, waiting for one of its slots
    in_flight: int = 0
    models: list[str] = dataclasses.field(default_factory=list)  # ready here
    latency_ms: dict[str, float | None] = dataclasses.field(default_factory=dict)
    mean_latency_ms: float | None = None
    runs: int = 0
    inline_runs: int = 0  # of runs, those run on the event loop's thread (inline_run_ms)
    inputs_in_place: int = 0  # inputs in clients' shared memory the GPU read where they lay
    shared_inputs_copied: int = 0  # such inputs copied into staging instead
    completed: int = 0
    faults: int = 0
    memory: MemoryStats | None = None  # None on the CPU and before the Vulkan device opens
    pipeline_cache: CacheStats | None = None  # likewise

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", device_name(self.kind, self.index))


@dataclasses.dataclass(frozen=True)
class ModelQueue:
    state: ModelState
    queue_depth: int
    in_flight: int
    reload_error: str | None = None  # as in ModelInfo
    reload_failures: int = 0


@dataclasses.dataclass
class JobTotals:
    """Job counters since start.

    ``submitted`` counts every job that passed admission (valid inputs for a servable model,
    and not refused for a full queue, which counts as ``overloaded`` instead). Each submitted
    job ends exactly once, as ``completed``, ``failed``, ``deadline_exceeded`` or
    ``cancelled`` — one whose deadline had already passed when it arrived is submitted and
    ends at once — so once nothing is queued or running, ``submitted`` is the sum of those
    four. A caller cancelled before its job is admitted cannot happen: admission has no
    checkpoint. A job that finishes in the instant its caller is cancelled counts as
    ``cancelled``: the outcome is the one the caller saw. ``retried`` (jobs moved off a failed device), ``discarded`` (results that
    came after their job ended) and ``device_faults`` count events, not jobs.
    """

    submitted: int = 0
    completed: int = 0
    failed: int = 0
    overloaded: int = 0
    deadline_exceeded: int = 0
    cancelled: int = 0
    retried: int = 0
    discarded: int = 0
    device_faults: int = 0


@dataclasses.dataclass(frozen=True)
class Status:
    state: SchedulerState
    ready: bool
    devices: list[DeviceStatus]
    models: dict[str, ModelQueue]
    queue_depth: int  # jobs waiting, all models
    in_flight: int  # jobs running, all devices
    totals: JobTotals
    gpu_problem: GpuProblem | None = None  # GPU device nodes exist but Vulkan found no GPU


@dataclasses.dataclass(frozen=True)
class UnloadResult:
    name: str
    state: Literal["unloaded"]
    devices: list[int]  # the devices it was freed from


@dataclasses.dataclass(frozen=True)
class RescanResult:
    loaded: list[str]
    removed: list[str]
    reloaded: list[str]
    failed: dict[str, str]  # name -> why
