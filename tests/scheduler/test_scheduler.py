"""Scheduler behaviour on real (tiny) models: CPU devices, and lavapipe where the Vulkan engine
exists. Device saturation, slowness and faults come from the DeviceHandle test hooks, which act
inside the device worker thread (no mock of Vulkan or of the executors).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from tests.support.scheduler import serving
from vkserve.devices.cpu.executor import Plan
from vkserve.models.graph import load_model
from vkserve.models.weights import write_random_bin
from vkserve.scheduler import (
    BadInput,
    DeadlineExceeded,
    DeviceFailure,
    DeviceHandle,
    DeviceStatus,
    ModelNotFound,
    ModelQueue,
    ModelRepository,
    ModelState,
    Overloaded,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    SchedulerState,
    Unavailable,
    UnloadResult,
    discover_handles,
    vulkan_engine_available,
)

TINY = ("7767517\n4 4\n"
        "Input in 0 1 data 0=8 1=8 2=3\n"
        "Convolution conv 1 1 data c 0=4 1=3 4=1 5=1 6=108\n"
        "ReLU relu 1 1 c r\n"
        "InnerProduct fc 1 1 r prob 0=10 1=1 2=2560\n")


def write_model(repo: Path, name: str = "tiny", config: str | None = None, seed: int = 1) -> Path:
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.param").write_text(TINY)
    write_random_bin(folder / "model.param", folder / "model.bin", seed=seed)
    if config is not None:
        (folder / "config.toml").write_text(config)
    return folder


def x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 8, 8)).astype(np.float32)


def reference(folder: Path, data: np.ndarray) -> np.ndarray:
    graph = load_model(folder / "model.param", folder / "model.bin")
    return Plan(graph).run({"data": data})["prob"]


async def until(sched: Scheduler, predicate: Callable[[], bool], timeout: float = 5) -> None:
    """Poll: some conditions involve the test's own state, which the scheduler cannot signal."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.002)


def device_info(sched: Scheduler, index: int) -> DeviceStatus:
    return next(d for d in sched.status().devices if d.index == index)


# ---------------------------------------------------------------------------------------------


async def test_cpu_serves_a_model_with_the_cpu_engines_results(tmp_path: Path) -> None:
    folder = write_model(tmp_path)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        result = await sched.infer("tiny", {"data": x(3)})
        np.testing.assert_array_equal(result.outputs["prob"], reference(folder, x(3)))
        assert result.device_index == 0 and result.attempts == 1
        assert result.run_seconds > 0 and result.queue_seconds >= 0
        only = await sched.infer("tiny", {"data": x(3)}, outputs=["prob"])
        assert list(only.outputs) == ["prob"]


async def test_input_validation_names_the_input(tmp_path: Path) -> None:
    folder = write_model(tmp_path)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        cases = [
            ({"dat": x()}, "'dat'"),
            ({}, "missing input 'data'"),
            ({"data": x()[:, :4]}, "input 'data': shape [3, 4, 8]"),
            ({"data": x().astype(np.int32)}, "input 'data': dtype int32"),
            ({"data": x().tolist()}, "input 'data': expected a numpy array"),
            ({"data": np.full((3, 8, 8), 1e300)}, "input 'data': float64 values out of"),
        ]
        for inputs, text in cases:
            with pytest.raises(BadInput, match=re.escape(text)) as info:
                await sched.infer("tiny", inputs)
            assert info.value.code == "BAD_REQUEST"
        with pytest.raises(BadInput, match="unknown output"):
            await sched.infer("tiny", {"data": x()}, outputs=["nope"])
        with pytest.raises(ModelNotFound) as missing:
            await sched.infer("nope", {"data": x()})
        assert missing.value.code == "NOT_FOUND"
        want = reference(folder, x(1))
        for dtype in (np.float16, np.float64):
            data = x(1).astype(dtype)
            got = (await sched.infer("tiny", {"data": data})).outputs["prob"]
            exact = reference(folder, data.astype(np.float32))
            np.testing.assert_array_equal(got, exact)
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert sched.status().totals.submitted == 2  # bad requests are never admitted


async def test_priority_order_under_saturation(tmp_path: Path) -> None:
    write_model(tmp_path, config="max_batch_size = 1\n")  # one job per run: the order shows
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        device.pause()
        finished: list[str] = []

        async def job(tag: str, priority: int) -> None:
            await sched.infer("tiny", {"data": x()}, priority=priority)
            finished.append(tag)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(job, "blocker", 0)
            await until(sched, lambda: sched.status().in_flight == 1)
            order = [("a0", 0), ("b5", 5), ("c1", 1), ("d5", 5), ("e0", 0), ("f9", 9), ("g-3", -3)]
            for n, (tag, priority) in enumerate(order, start=1):
                nursery.start_soon(job, tag, priority)
                await until(sched, lambda n=n: sched.status().queue_depth == n)
            assert device_info(sched, 0).queue_depth == len(order)
            device.resume()
        assert finished == ["blocker", "f9", "b5", "d5", "c1", "a0", "e0", "g-3"]


async def test_admission_control_rejects_at_once_when_the_queue_is_full(tmp_path: Path) -> None:
    write_model(tmp_path, config="queue_limit = 2\n")
    write_model(tmp_path, "other")
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        device.pause()
        async with trio.open_nursery() as nursery:
            for n in range(3):  # one running, two queued
                nursery.start_soon(sched.infer, "tiny", {"data": x()})
                await until(sched, lambda n=n: sched.status().totals.submitted == n + 1)
            await until(sched, lambda: sched.status().models["tiny"].queue_depth == 2)
            started = trio.current_time()
            with pytest.raises(Overloaded, match="queue full") as info:
                await sched.infer("tiny", {"data": x()})
            assert info.value.code == "OVERLOADED"
            assert trio.current_time() - started < 0.5
            # the limit is per model: another model still gets in
            nursery.start_soon(sched.infer, "other", {"data": x()})
            await until(sched, lambda: sched.status().models["other"].queue_depth == 1)
            device.resume()
        totals = sched.status().totals
        assert totals.overloaded == 1 and totals.completed == 4


async def test_deadline_while_queued(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        device.pause()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sched.infer, "tiny", {"data": x()})
            await until(sched, lambda: sched.status().in_flight == 1)
            started = time.time()
            with pytest.raises(DeadlineExceeded, match="queued") as info:
                await sched.infer("tiny", {"data": x()}, deadline=started + 0.2)
            assert info.value.code == "DEADLINE_EXCEEDED"
            assert 0.15 < time.time() - started < 1.0  # at the deadline, not when the device frees
            assert sched.status().queue_depth == 0
            with pytest.raises(DeadlineExceeded, match="before the job arrived"):
                await sched.infer("tiny", {"data": x()}, deadline=time.time() - 1)
            device.resume()
        assert device_info(sched, 0).runs == 1  # the expired jobs never ran
        totals = sched.status().totals  # the job that arrived expired is submitted and ended
        assert (totals.submitted, totals.completed, totals.deadline_exceeded) == (3, 1, 2)


async def test_deadline_while_running_never_gives_a_late_answer(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path) as sched:
        device.inject_delay(0.4)
        started = time.time()
        with pytest.raises(DeadlineExceeded, match="running"):
            await sched.infer("tiny", {"data": x()}, deadline=started + 0.1)
        assert time.time() - started < 0.35
        await until(sched, lambda: sched.status().totals.discarded == 1)
        device.inject_delay(0)
        assert (await sched.infer("tiny", {"data": x()}, deadline=time.time() + 5)).outputs


async def test_cancel_queued_and_running_jobs(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        device.pause()
        results: list[str] = []

        async def job(tag: str, scope: trio.CancelScope) -> None:
            with scope:
                await sched.infer("tiny", {"data": x()})
                results.append(tag)

        running, queued = trio.CancelScope(), trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(job, "running", running)
            await until(sched, lambda: sched.status().in_flight == 1)
            nursery.start_soon(job, "queued", queued)
            await until(sched, lambda: sched.status().queue_depth == 1)
            queued.cancel()
            await until(sched, lambda: sched.status().queue_depth == 0)
            running.cancel()
            await until(sched, lambda: sched.status().totals.cancelled == 2)
            assert sched.status().in_flight == 1  # still on the device; its result is discarded
            device.resume()
        await until(sched, lambda: sched.status().in_flight == 0)
        assert results == []
        assert device_info(sched, 0).runs == 1  # the queued job never ran
        assert sched.status().totals.discarded == 1
        assert (await sched.infer("tiny", {"data": x()})).outputs  # the worker keeps going


async def test_failover_moves_jobs_without_losing_or_duplicating_any(tmp_path: Path) -> None:
    folder = write_model(tmp_path)
    bad, good = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    async with serving([bad, good], tmp_path, instances_per_device=2) as sched:
        for device in (bad, good):
            device.inject_delay(0.005)
        bad.inject_fault(2)
        answers: dict[int, list[Any]] = {n: [] for n in range(60)}

        async def job(n: int) -> None:
            answers[n].append(await sched.infer("tiny", {"data": x(n)}, priority=n % 3))

        async with trio.open_nursery() as nursery:
            for n in answers:
                nursery.start_soon(job, n)
        assert all(len(a) == 1 for a in answers.values())
        for n, (result,) in answers.items():
            np.testing.assert_array_equal(result.outputs["prob"], reference(folder, x(n)))
        moved = [r for (r,) in answers.values() if r.attempts == 2]
        status = sched.status()
        assert status.totals.retried == len(moved) >= 1
        assert all(r.device_index == 1 for r in moved)
        assert status.totals.completed == 60 and status.totals.failed == 0
        assert sum(d.completed for d in status.devices) == 60  # one answer per job
        dev0, dev1 = device_info(sched, 0), device_info(sched, 1)
        assert dev0.healthy is False and "VK_ERROR_DEVICE_LOST" in dev0.fault
        assert dev1.healthy is True
        assert sched.models()[0].devices == [1] and sched.models()[0].state is ModelState.READY
        assert sched.ready()


async def test_a_job_is_retried_once_only(tmp_path: Path) -> None:
    write_model(tmp_path)
    first, second = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    async with serving([first, second], tmp_path, instances_per_device=1) as sched:
        first.inject_fault(1)
        second.inject_fault(1)
        with pytest.raises(DeviceFailure, match="already a retry") as info:
            await sched.infer("tiny", {"data": x()})
        assert info.value.code == "DEVICE_ERROR"
        status = sched.status()
        assert status.totals.retried == 1 and status.totals.failed == 1
        assert [d.healthy for d in status.devices] == [False, False]
        assert not sched.ready()
        with pytest.raises(Unavailable):
            await sched.infer("tiny", {"data": x()})


async def test_failover_loads_the_model_on_the_cpu_on_demand(tmp_path: Path) -> None:
    folder = write_model(tmp_path, config="devices = [0]\n")
    write_model(tmp_path, "pinned", config="devices = [0]\ncpu_fallback = false\n")
    gpu_like, cpu = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    async with serving([gpu_like, cpu], tmp_path) as sched:
        assert {m.name: m.devices for m in sched.models()} == {"pinned": [0], "tiny": [0]}
        gpu_like.inject_fault(1)
        result = await sched.infer("tiny", {"data": x(4)})
        assert (result.device_index, result.attempts) == (1, 2)
        np.testing.assert_array_equal(result.outputs["prob"], reference(folder, x(4)))
        models = {m.name: m for m in sched.models()}
        assert models["tiny"].devices == [1]
        assert models["pinned"].state is ModelState.FAILED and "unhealthy" in models["pinned"].error
        with pytest.raises(Unavailable, match="pinned"):
            await sched.infer("pinned", {"data": x()})


async def test_placement_prefers_the_device_that_finishes_first(tmp_path: Path) -> None:
    write_model(tmp_path, config="warmup = 2\nmax_batch_size = 1\n")  # placement of single jobs
    slow, fast = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    slow.inject_delay(0.03)  # before start: the warm-up runs measure it
    async with serving([slow, fast], tmp_path, instances_per_device=1) as sched:
        lat = {d.index: d.latency_ms["tiny"] for d in sched.status().devices}
        assert lat[0] > 25 > lat[1]
        one_at_a_time = [(await sched.infer("tiny", {"data": x()})).device_index for _ in range(10)]
        assert one_at_a_time == [1] * 10
        # a burst: jobs queue for the fast device while its backlog is shorter than one slow
        # run, and the overflow goes to the slow device
        fast.inject_delay(0.01)
        used: list[int] = []

        async def job() -> None:
            used.append((await sched.infer("tiny", {"data": x()})).device_index)

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(job)
        assert len(used) == 12 and used.count(1) > used.count(0) >= 1


async def test_placement_avoids_a_loaded_device(tmp_path: Path) -> None:
    write_model(tmp_path, config="max_batch_size = 1\n")  # placement of single jobs
    busy, idle = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    async with serving([busy, idle], tmp_path, instances_per_device=2) as sched:
        busy.pause()  # stuck: whatever it takes stays in flight
        used: list[int] = []

        async def job() -> None:
            used.append((await sched.infer("tiny", {"data": x()})).device_index)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(job)
            # at most its two slots' worth stay on the stuck device; the rest finish elsewhere
            await until(sched, lambda: len(used) + device_info(sched, 0).in_flight == 8)
            assert set(used) == {1} and len(used) >= 6
            assert sched.status().queue_depth == 0
            busy.resume()
        assert len(used) == 8


async def test_unloading_a_model_still_loading_cancels_its_load(tmp_path: Path) -> None:
    """The load stops at its next warm-up run (here: held at a paused device's gate) instead
    of finishing first; what it built is freed and the model is gone."""
    write_model(tmp_path, config="warmup = 1\n")
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        await sched.unload_model("tiny")
        device.pause()  # the next load's warm-up run waits at the gate, indefinitely
        failures: list[BaseException] = []

        async def load() -> None:
            try:
                await sched.load_model("tiny")
            except SchedulerError as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(load)
            await until(sched, lambda: [m.state for m in sched.models()] == [ModelState.LOADING])
            with trio.fail_after(10):  # not held by the load (it never ends while paused)
                result = await sched.unload_model("tiny")
        assert result == UnloadResult("tiny", "unloaded", [])
        assert sched.models() == [] and device_info(sched, 0).models == []
        assert len(failures) == 1  # the load's caller hears that it did not load
        device.resume()
        info = await sched.load_model("tiny")  # and it loads again
        assert info.state is ModelState.READY


async def test_unload_waits_for_in_flight_jobs_then_frees(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        device.pause()
        results: list[Any] = []
        unloaded: list[UnloadResult] = []

        async def run_job() -> None:
            results.append(await sched.infer("tiny", {"data": x()}))

        async def unload() -> None:
            unloaded.append(await sched.unload_model("tiny"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_job)
            await until(sched, lambda: sched.status().in_flight == 1)
            nursery.start_soon(run_job)  # queued: admitted before the unload, so it is served
            await until(sched, lambda: sched.status().queue_depth == 1)
            nursery.start_soon(unload)
            await until(sched, lambda: sched.models()[0].state is ModelState.UNLOADING)
            with pytest.raises(Unavailable, match="being unloaded"):
                await sched.infer("tiny", {"data": x()})
            await trio.sleep(0.1)
            assert unloaded == [] and [m.name for m in sched.models()] == ["tiny"]
            device.resume()
        assert len(results) == 2
        assert unloaded == [UnloadResult("tiny", "unloaded", [0])]
        assert sched.models() == [] and device_info(sched, 0).models == []
        with pytest.raises(ModelNotFound):
            await sched.infer("tiny", {"data": x()})
        # and it loads again at runtime
        info = await sched.load_model("tiny")
        assert info.state is ModelState.READY and info.devices == [0]
        assert (await sched.infer("tiny", {"data": x()})).outputs


async def test_load_model_at_runtime(tmp_path: Path) -> None:
    write_model(tmp_path)
    async with serving([DeviceHandle.cpu(0), DeviceHandle.cpu(1)], tmp_path) as sched:
        write_model(tmp_path, "late", config="devices = [1]\ncpu_fallback = false\nwarmup = 0\n")
        with pytest.raises(ModelNotFound):
            await sched.load_model("missing")
        with pytest.raises(BadInput, match="does not allow device 0"):
            await sched.load_model("late", devices=[0])
        with pytest.raises(BadInput, match="no device 7"):
            await sched.load_model("late", devices=[7])
        info = await sched.load_model("late")
        assert info.devices == [1] and info.inputs == {"data": [3, 8, 8]}
        assert (await sched.infer("late", {"data": x()})).device_index == 1
        assert (await sched.load_model("late")).devices == [1]  # already loaded: no-op
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "model.param").write_text("7767517\n1 1\nFoo f 0 1 x\n")
        with pytest.raises(BadInput, match="broken/model.param line 3"):
            await sched.load_model("broken")


async def test_models_and_status_content(tmp_path: Path) -> None:
    write_model(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.param").write_text(TINY)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        await sched.infer("tiny", {"data": x()})
        models = {m.name: m for m in sched.models()}
        assert models["tiny"].state is ModelState.READY
        assert models["tiny"].inputs == {"data": [3, 8, 8]}
        assert models["tiny"].outputs == {"prob": [10]}
        assert models["tiny"].devices == [0] and models["tiny"].error is None
        assert models["bad"].state is ModelState.FAILED and "bad/model.bin: missing" in models["bad"].error
        with pytest.raises(Unavailable, match="model.bin"):
            await sched.infer("bad", {"data": x()})
        status = sched.status()
        assert status.ready is True and status.state is SchedulerState.RUNNING
        (device,) = status.devices
        assert device.kind == "cpu" and device.healthy is True
        assert device.models == ["tiny"] and device.in_flight == 0
        assert device.mean_latency_ms > 0 and device.latency_ms["tiny"] > 0
        assert status.models["tiny"] == ModelQueue(ModelState.READY, queue_depth=0, in_flight=0)
        assert status.totals.submitted == 1 and status.totals.completed == 1


async def test_aclose_drains_admitted_jobs(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    sched = Scheduler([device], SchedulerConfig(instances_per_device=1), ModelRepository(tmp_path))
    results: list[Any] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        await until(sched, sched.ready)
        device.inject_delay(0.05)

        async def job() -> None:
            results.append(await sched.infer("tiny", {"data": x()}))

        async with trio.open_nursery() as jobs:
            for _ in range(4):
                jobs.start_soon(job)
            await until(sched, lambda: sched.status().totals.submitted == 4)
            with trio.fail_after(5):
                await sched.aclose()
        assert len(results) == 4
        assert sched.status().state is SchedulerState.STOPPED
        with pytest.raises(Unavailable):
            await sched.infer("tiny", {"data": x()})


async def test_shutdown_timeout_ends_the_rest_with_unavailable(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    sched = Scheduler([device], SchedulerConfig(instances_per_device=1), ModelRepository(tmp_path))
    errors: list[SchedulerError] = []

    async def job() -> None:
        try:
            await sched.infer("tiny", {"data": x()})
        except SchedulerError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        await until(sched, sched.ready)
        device.pause()
        async with trio.open_nursery() as jobs:
            for _ in range(3):
                jobs.start_soon(job)
            await until(sched, lambda: sched.status().totals.submitted == 3)
            with trio.fail_after(5):
                await sched.aclose(timeout=0.1)  # paused device: nothing finishes in time
    assert [e.code for e in errors] == ["UNAVAILABLE"] * 3


async def test_lavapipe_serves_and_fails_over_to_the_cpu(tmp_path: Path) -> None:
    assert vulkan_engine_available(), "no Vulkan engine: is lavapipe installed?"
    folder = write_model(tmp_path, config='precision = "fp32"\n')
    handles, gpu_problem = discover_handles(use_vulkan=True)
    gpus = [h for h in handles if not h.is_cpu]
    assert gpus and gpu_problem is None, "discovery found no Vulkan device (lavapipe expected)"
    gpu = gpus[0].index
    async with serving(handles, tmp_path) as sched:
        assert sched.models()[0].devices == [gpu]  # auto: GPUs only while there are some
        result = await sched.infer("tiny", {"data": x(5)})
        assert result.device_index == gpu
        want = reference(folder, x(5))
        np.testing.assert_allclose(result.outputs["prob"], want, rtol=0.05,
                                   atol=0.05 * float(np.abs(want).max()))
        gpus[0].inject_fault(1)
        moved = await sched.infer("tiny", {"data": x(5)})
        assert moved.attempts == 2 and moved.device_index != gpu
        assert device_info(sched, gpu).healthy is False
        assert math.isfinite(float(moved.outputs["prob"].sum()))


async def test_every_job_ends_exactly_once_under_mixed_trouble(tmp_path: Path) -> None:
    """Priorities, deadlines that expire on arrival, queued or running, callers that cancel,
    and a device that fails mid-run: each request gets one outcome and the totals add up.

    Which outcome a job gets depends on timing; what is asserted holds for every timing
    (a deadline may pass before its job even arrives on a loaded machine: that job is still
    submitted, see JobTotals). The random choices are all drawn before any job starts.
    """
    folder = write_model(tmp_path)
    first, second = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    rng = np.random.default_rng(11)
    n_jobs = 120
    kinds = [n % 6 for n in range(n_jobs)]  # 1: a deadline, 2: the caller cancels, else plain
    priorities = rng.integers(0, 3, n_jobs).tolist()
    delays = rng.uniform(0.0, 0.2, n_jobs).tolist()
    outcomes: dict[int, list[str]] = {n: [] for n in range(n_jobs)}
    moved_ok = 0  # completed on their second attempt
    want = {n: reference(folder, x(n % 7)) for n in range(7)}
    async with serving([first, second], tmp_path, queue_limit_per_model=n_jobs) as sched:
        for device in (first, second):
            device.inject_delay(0.004)

        async def job(n: int, deadline: float | None, cancel_after: float | None) -> None:
            nonlocal moved_ok
            with trio.CancelScope() as scope:
                if cancel_after is not None:
                    scope.deadline = trio.current_time() + cancel_after
                try:
                    result = await sched.infer("tiny", {"data": x(n % 7)},
                                               priority=priorities[n], deadline=deadline)
                except SchedulerError as exc:
                    outcomes[n].append(exc.code)
                    return
                np.testing.assert_array_equal(result.outputs["prob"], want[n % 7])
                outcomes[n].append("OK")
                if result.attempts == 2:
                    moved_ok += 1
            if scope.cancelled_caught:
                outcomes[n].append("CANCELLED")

        async with trio.open_nursery() as nursery:
            for n, kind in enumerate(kinds):
                deadline = time.time() + 0.01 + delays[n] if kind == 1 else None
                nursery.start_soon(job, n, deadline, delays[n] if kind == 2 else None)
                if n == 40:
                    first.inject_fault(3)
                if n % 10 == 0:
                    await trio.sleep(0.005)
        assert all(len(o) == 1 for o in outcomes.values()), outcomes
        codes = [o[0] for o in outcomes.values()]
        assert set(codes) <= {"OK", "DEADLINE_EXCEEDED", "CANCELLED"}, codes
        assert codes.count("OK") >= kinds.count(0) + kinds.count(3) + kinds.count(4) + kinds.count(5)
        await until(sched, lambda: sched.status().in_flight == 0)
        status = sched.status()
        totals = status.totals
        assert totals.submitted == n_jobs
        assert totals.completed == codes.count("OK")
        assert totals.deadline_exceeded == codes.count("DEADLINE_EXCEEDED")
        assert totals.cancelled == codes.count("CANCELLED")
        assert totals.failed == 0
        assert totals.submitted == (totals.completed + totals.failed + totals.deadline_exceeded
                                    + totals.cancelled)
        # the first fault takes device 0 out; each run that failed on it (the one or two
        # running then, each a batch of up to max_batch_size = 8 jobs) moved its jobs unless
        # they had ended meanwhile (cancelled, expired)
        assert totals.device_faults == 1 and status.devices[0].healthy is False
        assert moved_ok <= totals.retried <= 8 * status.devices[0].faults
        assert status.queue_depth == 0
        # a run may complete on its device in the instant its caller is cancelled: the device
        # counts the run, the totals count the job as the caller saw it (cancelled)
        assert codes.count("OK") <= sum(d.completed for d in status.devices) <= codes.count("OK") + totals.cancelled


async def test_a_cold_model_load_saves_the_pipeline_cache(tmp_path: Path) -> None:
    from vkserve.cache.cache_file import inspect_cache_file

    write_model(tmp_path, config='precision = "fp32"\n')
    cache_dir = tmp_path / "pipeline-cache"
    handles, _ = discover_handles(use_vulkan=True, cache_dir=cache_dir)
    assert any(not h.is_cpu for h in handles), "lavapipe expected"
    async with serving(handles, tmp_path) as sched:
        assert sched.models()[0].state is ModelState.READY
        # saved after the load, while the daemon still runs (not only at shutdown)
        files = list(cache_dir.glob("vkserve-*.cache"))
        assert len(files) == 1
        info = inspect_cache_file(files[0].read_bytes())
        assert info["valid"], info["reason"]
        assert len(info["entries"]) >= 2  # the model's shaders (conv, innerproduct, ...)
