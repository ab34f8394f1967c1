"""Runs on the event loop's own thread (``inline_run_ms``): a short run that is all there is
to do skips the two thread hand-offs; anything else in flight, a test hook, a run measured
longer, or ``inline_run_ms = 0`` keeps runs on the device's run threads. Same results, same
failover either way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

from tests.scheduler.test_scheduler import device_info, reference, until, write_model, x
from tests.support.scheduler import serving
from vkserve.devices.capabilities import DeviceCaps
from vkserve.devices.vulkan.errors import VulkanError
from vkserve.scheduler import DeviceHandle, Job, Scheduler
from vkserve.scheduler import core as scheduler_core


@pytest.fixture
def run_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of the thread each run ran on, in order."""
    names: list[str] = []
    original = scheduler_core._run_blocking

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        names.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(scheduler_core, "_run_blocking", recording)
    yield names


LOOP = threading.main_thread().name  # the tests' trio loop runs on the main thread
#: well above the tiny model's runs on a slow CI box (its warm-up runs seed the estimate)
LIMIT_MS = 100.0


async def _submit_and_wait(sched: Scheduler, seed: int) -> Job:
    ended: list[Job] = []
    job = sched.submit("tiny", {"data": x(seed)}, priority=None, deadline=None, outputs=None,
                       on_done=ended.append)
    assert job is not None
    assert ended == []  # never ended inside submit: the connection records it first
    await until(sched, lambda: bool(ended))
    return job


async def test_a_lone_short_run_runs_on_the_loop_thread(tmp_path: Path, run_threads: list[str]) -> None:
    folder = write_model(tmp_path)
    async with serving([DeviceHandle.cpu(0)], tmp_path, inline_run_ms=LIMIT_MS) as sched:
        before = len(run_threads)
        for seed in range(3):
            job = await _submit_and_wait(sched, seed)
            assert job.result is not None and job.error is None
            np.testing.assert_allclose(job.result.outputs["prob"], reference(folder, x(seed)),
                                       rtol=1e-5, atol=1e-6)
            result = await sched.infer("tiny", {"data": x(seed)})  # the awaiting path too
            np.testing.assert_array_equal(result.outputs["prob"], job.result.outputs["prob"])
        assert run_threads[before:] == [LOOP] * 6
        info = device_info(sched, 0)
        assert info.inline_runs == 6 and info.runs >= 6


async def test_a_vulkan_run_on_the_loop_thread_waits_for_its_fence_there(
        tmp_path: Path, run_threads: list[str], vulkan_caps: DeviceCaps) -> None:
    """lavapipe: the Plan's submission, fence wait and read-back on the loop's thread."""
    folder = write_model(tmp_path, config='devices = "gpu"\nprecision = "fp32"\n')
    async with serving([DeviceHandle(vulkan_caps)], tmp_path, inline_run_ms=LIMIT_MS) as sched:
        before = len(run_threads)
        job = await _submit_and_wait(sched, 5)
        assert job.result is not None and job.error is None and job.result.device == "vulkan:0"
        assert run_threads[before:] == [LOOP]
        np.testing.assert_allclose(job.result.outputs["prob"], reference(folder, x(5)), rtol=2e-2, atol=2e-2)


async def test_runs_stay_on_the_run_threads_while_other_work_is_in_flight(
        tmp_path: Path, run_threads: list[str]) -> None:
    write_model(tmp_path, config="max_batch_size = 1\n")
    async with serving([DeviceHandle.cpu(0)], tmp_path, instances_per_device=2,
                       inline_run_ms=LIMIT_MS) as sched:
        before = len(run_threads)
        ended: list[Job] = []
        for seed in range(2):  # the second is admitted while the first is in flight
            assert sched.submit("tiny", {"data": x(seed)}, priority=None, deadline=None,
                                outputs=None, on_done=ended.append) is not None
        await until(sched, lambda: len(ended) == 2)
        assert all(job.error is None for job in ended)
        # the first on the loop's thread, the second on a run thread (in either order of start)
        on_loop, elsewhere = sorted(run_threads[before:], key=lambda name: name != LOOP)
        assert on_loop == LOOP and elsewhere.startswith("vkserve-run cpu")
        assert device_info(sched, 0).inline_runs == 1


async def test_a_hooked_device_a_longer_run_or_zero_keep_runs_off_the_loop(
        tmp_path: Path, run_threads: list[str]) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, inline_run_ms=LIMIT_MS) as sched:
        before = len(run_threads)
        device.pause()  # a paused run on the loop's thread would hold the loop that resumes it
        job = sched.submit("tiny", {"data": x()}, priority=None, deadline=None, outputs=None,
                           on_done=lambda _: None)
        assert job is not None
        await trio.sleep(0.05)
        device.resume()
        await until(sched, lambda: job.done.is_set())
        [paused] = run_threads[before:]
        assert paused.startswith("vkserve-run cpu") and job.error is None
    for limit in (0.001, 0):  # every run measured longer than 1 us; never
        async with serving([DeviceHandle.cpu(0)], tmp_path, inline_run_ms=limit) as sched:
            before = len(run_threads)
            await _submit_and_wait(sched, 2)
            [ran] = run_threads[before:]
            assert ran.startswith("vkserve-run cpu") and device_info(sched, 0).inline_runs == 0


async def test_a_run_not_yet_measured_on_its_device_stays_off_the_loop(
        tmp_path: Path, run_threads: list[str]) -> None:
    """No warm-up, and a prior under the limit: the first run is measured on a run thread."""
    write_model(tmp_path, config="warmup = 0\n")
    async with serving([DeviceHandle.cpu(0)], tmp_path, inline_run_ms=LIMIT_MS,
                       default_latency_s=1e-6) as sched:
        before = len(run_threads)
        await _submit_and_wait(sched, 6)
        await _submit_and_wait(sched, 7)
        first, second = run_threads[before:]
        assert first.startswith("vkserve-run cpu") and second == LOOP


async def test_a_device_fault_on_the_loop_thread_fails_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_threads: list[str]) -> None:
    folder = write_model(tmp_path)
    first, second = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    async with serving([first, second], tmp_path, inline_run_ms=LIMIT_MS) as sched:
        recording = scheduler_core._run_blocking

        faults = [1]

        def lost_on_the_loop(handle, *args):  # type: ignore[no-untyped-def]
            if threading.current_thread().name == LOOP and faults:
                faults.pop()
                raise VulkanError("vkQueueSubmit (a fault on the loop's thread)", "VK_ERROR_DEVICE_LOST")
            return recording(handle, *args)

        monkeypatch.setattr(scheduler_core, "_run_blocking", lost_on_the_loop)
        job = await _submit_and_wait(sched, 4)
        assert job.error is None and job.result is not None and job.attempts == 2
        np.testing.assert_allclose(job.result.outputs["prob"], reference(folder, x(4)), rtol=1e-5, atol=1e-6)
        unhealthy = [d for d in sched.status().devices if not d.healthy]
        assert len(unhealthy) == 1 and "a fault on the loop's thread" in str(unhealthy[0].fault)
        assert sched.status().totals.retried == 1
        # the failed run is not counted (as runs are not); the retry ran on the loop's thread too
        counts = [(d.runs, d.inline_runs) for d in sched.status().devices]
        assert sorted(counts) == [(0, 0), (1, 1)], counts
