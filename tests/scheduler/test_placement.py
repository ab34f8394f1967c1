"""Placement across devices holding one model (issue 18): least expected finish time with a
batch-aware cost, both devices kept busy, and failover under load with no job lost.

Device speeds are simulated with ``DeviceHandle.inject_delay`` (a flat cost per run, as a GPU
batch costs about one run) and faults come from ``inject_fault``; both act inside the device
worker thread, so the real placement, batching and failover paths run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import trio

from tests.scheduler.test_scheduler import reference, write_model, x
from tests.support.scheduler import serving
from vkserve.scheduler import (
    DeviceHandle,
    InferResult,
    Scheduler,
    discover_handles,
    vulkan_engine_available,
)


def lavapipe_and_cpu() -> list[DeviceHandle]:
    assert vulkan_engine_available(), "no Vulkan engine: is lavapipe installed?"
    handles, _ = discover_handles(use_vulkan=True)
    gpus = [h for h in handles if not h.is_cpu]
    assert gpus, "discovery found no Vulkan device (lavapipe expected)"
    return [gpus[0], next(h for h in handles if h.is_cpu)]


async def closed_loop(sched: Scheduler, workers: int, total: int,
                      on_answer: object = None) -> dict[int, InferResult]:
    """``workers`` clients, each sending its next request when the last is answered, until
    ``total`` requests were sent; every answer by request number (seeded inputs)."""
    answers: dict[int, InferResult] = {}
    sent = iter(range(total))

    async def worker() -> None:
        for n in sent:
            result = await sched.infer("tiny", {"data": x(n)})
            assert n not in answers  # one answer per request
            answers[n] = result
            if callable(on_answer):
                on_answer(len(answers))

    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(worker)
    return answers


def check_answers(folder: Path, answers: dict[int, InferResult], total: int) -> None:
    assert sorted(answers) == list(range(total))
    for n, result in answers.items():
        want = reference(folder, x(n))
        np.testing.assert_allclose(result.outputs["prob"], want, rtol=0.05,
                                   atol=0.05 * float(np.abs(want).max()))


async def test_a_busy_fast_device_takes_a_burst_as_one_batch_rather_than_spill(
        tmp_path: Path) -> None:
    # the fast device's batch of 8 costs about one run: the burst waits for it as one batch,
    # which ends sooner than one job on the free slow device
    write_model(tmp_path, config="devices = [0]\nwarmup = 2\n")
    fast, slow = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    fast.inject_delay(0.05)
    slow.inject_delay(0.4)
    async with serving([fast, slow], tmp_path, instances_per_device=1) as sched:

        async def burst(results: list[InferResult]) -> None:
            async with trio.open_nursery() as nursery:
                for n in range(9):  # the first runs alone, the other 8 queue behind it
                    nursery.start_soon(_collect, sched, results, n)
                    await trio.sleep(0)

        measured: list[InferResult] = []
        await burst(measured)  # only the fast device holds the model yet: batches measured
        assert sorted(r.batch_size for r in measured)[-1] == 8
        await sched.load_model("tiny", [1])  # the slow one joins (warm-up measures it)
        assert sched.models()[0].devices == [0, 1]
        runs_before = {d.index: d.runs for d in sched.status().devices}
        results: list[InferResult] = []
        await burst(results)
        assert [r.device_index for r in results] == [0] * 9
        runs = {d.index: d.runs - runs_before[d.index] for d in sched.status().devices}
        assert runs == {0: 2, 1: 0}


async def _collect(sched: Scheduler, results: list[InferResult], n: int) -> None:
    results.append(await sched.infer("tiny", {"data": x(n)}))


async def test_load_beyond_one_device_keeps_both_busy(tmp_path: Path) -> None:
    # the same per-run cost on both: queued work spreads instead of waiting for one device
    write_model(tmp_path, config="devices = [0, 1]\n")
    first, second = DeviceHandle.cpu(0), DeviceHandle.cpu(1)
    for device in (first, second):
        device.inject_delay(0.01)
    async with serving([first, second], tmp_path, instances_per_device=2) as sched:
        answers = await closed_loop(sched, workers=32, total=400)
        by_device = [sum(r.device_index == d for r in answers.values()) for d in (0, 1)]
        assert min(by_device) >= 400 // 4, by_device
        status = sched.status()
        assert status.totals.completed == 400 and status.totals.failed == 0
        assert all(d.runs > 0 for d in status.devices)


async def test_lavapipe_and_cpu_both_serve_a_model_loaded_on_both(tmp_path: Path) -> None:
    folder = write_model(tmp_path, config='devices = "all"\nprecision = "fp32"\n')
    handles = lavapipe_and_cpu()
    for device in handles:  # equal simulated speeds: the real ones differ by the box's load
        device.inject_delay(0.005)
    async with serving(handles, tmp_path, instances_per_device=2) as sched:
        assert sched.models()[0].devices == sorted(h.index for h in handles)
        answers = await closed_loop(sched, workers=16, total=160)
        check_answers(folder, answers, 160)
        used = {r.device_index for r in answers.values()}
        assert used == {h.index for h in handles}
        assert max(r.batch_size for r in answers.values()) > 1  # the load formed batches


async def test_failover_under_load_loses_no_job(tmp_path: Path) -> None:
    # lavapipe fails mid-run while both devices are busy: what ran on it moves to the CPU,
    # every request gets its own correct answer, nothing is answered twice
    folder = write_model(tmp_path, config='devices = "all"\nprecision = "fp32"\n')
    gpu, cpu = lavapipe_and_cpu()
    for device in (gpu, cpu):
        device.inject_delay(0.005)
    async with serving([gpu, cpu], tmp_path, instances_per_device=2) as sched:
        failed_at: list[int] = []

        def fail_once(answered: int) -> None:
            if answered == 40 and not failed_at:
                failed_at.append(answered)
                gpu.inject_fault(1)  # the next run on it raises VK_ERROR_DEVICE_LOST

        answers = await closed_loop(sched, workers=24, total=240, on_answer=fail_once)
        check_answers(folder, answers, 240)
        status = sched.status()
        moved = [r for r in answers.values() if r.attempts == 2]
        assert moved and all(r.device_index == cpu.index for r in moved)
        assert status.totals.retried == len(moved)
        assert status.totals.completed == 240 and status.totals.failed == 0
        devices = {d.index: d for d in status.devices}
        assert devices[gpu.index].healthy is False
        assert "VK_ERROR_DEVICE_LOST" in (devices[gpu.index].fault or "")
        assert sum(d.completed for d in status.devices) == 240
        assert devices[gpu.index].completed >= 1  # it served until it failed
        assert sched.models()[0].devices == [cpu.index]


async def test_held_batches_of_two_models_share_a_busy_device(tmp_path: Path) -> None:
    # a busy device, jobs of two models held for it in priority order: tiny, other, tiny.
    # The last tiny cannot join the first one's batch (other's runs after it): it is held
    # for a batch of its own, and every job runs once the device frees
    folder = write_model(tmp_path)
    write_model(tmp_path, "other", seed=2)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        device.pause()
        results: dict[str, InferResult] = {}

        async def job(tag: str, model: str, priority: int) -> None:
            results[tag] = await sched.infer(model, {"data": x(priority)}, priority=priority)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(job, "blocker", "tiny", 9)
            with trio.fail_after(5):
                await sched.wait_until(lambda: sched.status().in_flight == 1)
            for tag, model, priority in (("a", "tiny", 5), ("b", "other", 4), ("c", "tiny", 3)):
                nursery.start_soon(job, tag, model, priority)
            with trio.fail_after(5):
                await sched.wait_until(lambda: sched.status().queue_depth == 3)
            assert [d.queue_depth for d in sched.status().devices] == [3]
            device.resume()
        assert sorted(results) == ["a", "b", "blocker", "c"]
        np.testing.assert_array_equal(results["c"].outputs["prob"], reference(folder, x(3)))
