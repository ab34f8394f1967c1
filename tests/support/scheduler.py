"""A running Scheduler for tests: started, ready, and drained and stopped on exit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from vkserve.devices.cpu.warm import compile_kernels
from vkserve.scheduler import DeviceHandle, ModelRepository, Scheduler, SchedulerConfig


@asynccontextmanager
async def serving(devices: list[DeviceHandle] | None, repo: Path, *, ready_timeout: float = 30,
                  **config: Any) -> AsyncIterator[Scheduler]:
    """The scheduler over ``repo`` on ``devices`` (None: discover them), once ready; on exit
    paused devices are resumed, admitted jobs drained (5 s) and the scheduler stopped.
    ``instances_per_device`` applies to the CPU devices too unless ``cpu_instances`` is given
    (the tests' fake devices are CPU handles). The CPU kernels are compiled first, outside
    ``ready_timeout`` (a cold numba cache: minutes; in-process after the first: nothing)."""
    await trio.to_thread.run_sync(compile_kernels)
    if "instances_per_device" in config:
        config.setdefault("cpu_instances", config["instances_per_device"])
    sched = Scheduler(devices, SchedulerConfig(**config), ModelRepository(repo))
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        with trio.fail_after(ready_timeout):
            await sched.wait_until(sched.ready)
        try:
            yield sched
        finally:
            for device in devices or []:
                device.resume()
            with trio.fail_after(15):
                await sched.aclose(timeout=5)
