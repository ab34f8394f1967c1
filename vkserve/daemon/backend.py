"""The seam between the daemon and the scheduler.

``Backend`` is everything the daemon calls (``vkserve.scheduler.Scheduler`` satisfies it; the
connection tests use a scripted double). Its answers are the scheduler's dataclasses, read by
attribute in the daemon (metrics, readiness, systemd status, the banner); failures are
``SchedulerError`` subclasses carrying an ``ErrorCode``. ``to_wire`` is the one place where
a report becomes the plain map the protocol sends.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Protocol, TypeAlias

import numpy as np
import trio

from vkserve.devices.output_room import OutputRoom
from vkserve.scheduler import InferResult, Job, ModelInfo, RescanResult, Status, UnloadResult

__all__ = ["Backend", "Wire", "to_wire"]

#: What msgpack sends: str-keyed maps, lists, scalars, bin.
Wire: TypeAlias = None | bool | int | float | str | bytes | list["Wire"] | dict[str, "Wire"]


class Backend(Protocol):
    """What the daemon needs from the scheduler."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...

    async def aclose(self, timeout: float | None = None) -> None: ...

    async def infer(self, model: str, inputs: dict[str, np.ndarray], *, priority: int | None = None,
                    deadline: float | None = None, outputs: list[str] | None = None,
                    room: OutputRoom | None = None) -> InferResult: ...

    def submit(self, model: str, inputs: dict[str, np.ndarray], *, priority: int | None,
               deadline: float | None, outputs: list[str] | None,
               on_done: Callable[[Job], None], room: OutputRoom | None = None) -> Job | None: ...

    def cancel(self, job: Job, message: str) -> None: ...

    async def load_model(self, name: str, devices: list[int] | None = None) -> ModelInfo: ...

    async def unload_model(self, name: str) -> UnloadResult: ...

    async def rescan(self) -> RescanResult: ...

    def models(self) -> list[ModelInfo]: ...

    def status(self) -> Status: ...

    def ready(self) -> bool: ...

    async def wait_until(self, predicate: Callable[[], bool]) -> None: ...


def to_wire(report: Status | ModelInfo | UnloadResult) -> dict[str, Wire]:
    """A scheduler report as the protocol's map: field names are the keys, nested dataclasses
    maps, enums their values, tuples lists."""
    return dataclasses.asdict(report, dict_factory=_wire_map)


def _wire_map(items: list[tuple[str, object]]) -> dict[str, Wire]:
    return {key: _wire_value(value) for key, value in items}


def _wire_value(value: object) -> Wire:
    if isinstance(value, enum.Enum):  # before str: the states are StrEnums
        return _wire_value(value.value)
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (list, tuple)):
        return [_wire_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _wire_value(v) for k, v in value.items()}
    raise TypeError(f"a scheduler report holds a {type(value).__name__}, which has no wire form")
