"""Jobs, queues, priorities, deadlines, placement, failover and the model registry.

The daemon builds a ``Scheduler`` over the discovered devices and a ``ModelRepository``,
starts ``Scheduler.run`` in its nursery and calls ``infer`` / ``load_model`` /
``unload_model`` / ``rescan`` / ``models`` / ``status`` / ``ready`` / ``aclose``. Answers
are the dataclasses of ``vkserve.scheduler.reports`` (and ``InferResult``); every failure is
a ``SchedulerError`` whose ``code`` is a wire-protocol ``ErrorCode`` (DESIGN §8).
"""

from vkserve.scheduler.config import SchedulerConfig
from vkserve.scheduler.core import Scheduler
from vkserve.scheduler.devices import DeviceHandle, discover_handles
from vkserve.scheduler.engine import is_device_fault, vulkan_engine_available
from vkserve.scheduler.errors import (
    BadInput,
    Cancelled,
    DeadlineExceeded,
    DeviceFailure,
    InternalError,
    ModelNotFound,
    Overloaded,
    SchedulerError,
    Unavailable,
)
from vkserve.scheduler.jobs import InferResult, Job
from vkserve.scheduler.registry import ModelRepository, ModelSpec
from vkserve.scheduler.reports import (
    DeviceStatus,
    JobTotals,
    MemoryStats,
    ModelInfo,
    ModelQueue,
    ModelState,
    PlacementInfo,
    PlacementState,
    RescanResult,
    SchedulerState,
    Status,
    UnloadResult,
)

__all__ = [
    "BadInput",
    "Cancelled",
    "DeadlineExceeded",
    "DeviceFailure",
    "DeviceHandle",
    "DeviceStatus",
    "InferResult",
    "Job",
    "InternalError",
    "JobTotals",
    "MemoryStats",
    "ModelInfo",
    "ModelNotFound",
    "ModelQueue",
    "ModelRepository",
    "ModelSpec",
    "ModelState",
    "Overloaded",
    "PlacementInfo",
    "PlacementState",
    "RescanResult",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "SchedulerState",
    "Status",
    "Unavailable",
    "UnloadResult",
    "discover_handles",
    "is_device_fault",
    "vulkan_engine_available",
]
