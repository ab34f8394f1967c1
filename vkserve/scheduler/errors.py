"""Errors the scheduler ends a job (or a control call) with.

Each carries one of the wire protocol's error codes (DESIGN §8) in ``code`` (an
``ErrorCode``) so the daemon maps it to an error frame without a lookup table, and a
``message`` meant for the person who sent the request: it names the model, input, device or
file at fault.
"""

from __future__ import annotations

from typing import ClassVar

from vkserve.client.protocol import ErrorCode

__all__ = [
    "BadInput",
    "Cancelled",
    "DeadlineExceeded",
    "DeviceFailure",
    "InternalError",
    "ModelNotFound",
    "Overloaded",
    "SchedulerError",
    "Unavailable",
]


class SchedulerError(Exception):
    """Base class; ``code`` is one of BAD_REQUEST, NOT_FOUND, OVERLOADED, DEADLINE_EXCEEDED,
    CANCELLED, DEVICE_ERROR, UNAVAILABLE, INTERNAL."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class BadInput(SchedulerError):
    """The request is malformed: wrong input names, shapes or dtypes, unknown outputs, bad
    config. The message names the offending input, file or key."""

    code = ErrorCode.BAD_REQUEST


class ModelNotFound(SchedulerError):
    code = ErrorCode.NOT_FOUND


class Overloaded(SchedulerError):
    """The model's queue is full; raised at once on submission (admission control)."""

    code = ErrorCode.OVERLOADED


class DeadlineExceeded(SchedulerError):
    """The job's absolute deadline passed while it was queued or running; no late answers."""

    code = ErrorCode.DEADLINE_EXCEEDED


class Cancelled(SchedulerError):
    """The job was cancelled (its caller went away); used for bookkeeping, rarely seen."""

    code = ErrorCode.CANCELLED


class DeviceFailure(SchedulerError):
    """The job's device failed and its one retry failed too (or had nowhere to go)."""

    code = ErrorCode.DEVICE_ERROR


class Unavailable(SchedulerError):
    """The model is not servable right now (failed to load, unloading, shutting down)."""

    code = ErrorCode.UNAVAILABLE


class InternalError(SchedulerError):
    """An executor raised something that is neither bad input nor a device fault."""

    code = ErrorCode.INTERNAL
