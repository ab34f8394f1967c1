"""A device's one-time preparation (the CPU's kernels compiled for this machine: minutes on a
first start) runs beside everything else: the scheduler answers meanwhile, the model's
placement says what it waits for, a job sent then runs once it is done; a failed preparation
fails that device's placements with its reason and the scheduler goes on."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import trio

from tests.scheduler.test_scheduler import reference, until, write_model, x
from vkserve.scheduler import DeviceHandle, ModelRepository, ModelState, Scheduler, SchedulerConfig, core


async def test_the_scheduler_serves_while_the_cpu_kernels_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_model(tmp_path)
    release = threading.Event()
    prepared = core.prepare_device

    def slow_prepare(device: DeviceHandle) -> str | None:  # a first start's long compile
        assert release.wait(30)
        return prepared(device)

    monkeypatch.setattr(core, "prepare_device", slow_prepare)
    sched = Scheduler([DeviceHandle.cpu(0)], SchedulerConfig(), ModelRepository(tmp_path))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_release_at_exit, release)  # even when an assertion below fails
        await nursery.start(sched.run)
        waiting = "waiting for cpu's kernels to be compiled for this machine (a first start: minutes)"
        await until(sched, lambda: bool(sched.models())
                    and sched.models()[0].placements[0].progress == waiting)
        [info] = sched.models()
        assert info.state is ModelState.LOADING and not sched.ready()
        results = []

        async def ask() -> None:
            results.append(await sched.infer("tiny", {"data": x(2)}))

        nursery.start_soon(ask)
        await trio.sleep(0.2)
        assert results == [] and sched.status().totals.completed == 0
        release.set()
        await until(sched, lambda: bool(results), timeout=30)
        np.testing.assert_allclose(results[0].outputs["prob"], reference(folder, x(2)),
                                   rtol=1e-5, atol=1e-6)
        assert sched.ready()
        await sched.aclose(timeout=5)
        nursery.cancel_scope.cancel()


async def _release_at_exit(release: threading.Event) -> None:
    try:
        await trio.sleep_forever()
    finally:
        release.set()


async def test_a_failed_preparation_fails_the_devices_placements_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_model(tmp_path)

    def failing_prepare(device: DeviceHandle) -> str | None:
        raise OSError("no space left on device: numba's cache")

    monkeypatch.setattr(core, "prepare_device", failing_prepare)
    sched = Scheduler([DeviceHandle.cpu(0)], SchedulerConfig(), ModelRepository(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        await until(sched, lambda: bool(sched.models()) and sched.models()[0].state is ModelState.FAILED,
                    timeout=30)
        [info] = sched.models()
        want = "preparing cpu failed: OSError: no space left on device: numba's cache"
        assert info.error is not None and want in info.error, info.error
        assert want in (info.placements[0].error or "")
        assert [d.index for d in sched.status().devices] == [0]  # still running, answering
        await sched.aclose(timeout=5)
