"""Jobs, queues, priorities, deadlines, placement, failover and the model registry.

The daemon builds a ``Scheduler`` over the discovered devices and a ``ModelRepository``,
starts ``Scheduler.run`` in its nursery and calls ``infer`` / ``load_model`` /
``unload_model`` / ``models`` / ``status`` / ``ready`` / ``aclose``. Every failure is a
``SchedulerError`` whose ``code`` is a wire-protocol error code (DESIGN §8).
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
from vkserve.scheduler.jobs import InferResult
from vkserve.scheduler.registry import ModelRepository, ModelSpec

__all__ = [
    "BadInput",
    "Cancelled",
    "DeadlineExceeded",
    "DeviceFailure",
    "DeviceHandle",
    "InferResult",
    "InternalError",
    "ModelNotFound",
    "ModelRepository",
    "ModelSpec",
    "Overloaded",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "Unavailable",
    "discover_handles",
    "is_device_fault",
    "vulkan_engine_available",
]
