"""Dynamic batching on real engines (CPU devices; lavapipe for one execution of a batch):
queued jobs of one model and input shape run together, highest priority first, cut to
max_batch_size and preferred sizes, held up to max_queue_delay_ms; a batch never makes a job
miss a deadline it meets alone; a cancelled job leaves its batch cleanly; a client's leading
batch dimension becomes a batch. Device saturation comes from the DeviceHandle gate."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import trio

from tests.support.scheduler import serving
from vkserve.devices.cpu.executor import Plan
from vkserve.models.graph import load_model
from vkserve.models.weights import write_random_bin
from vkserve.scheduler import BadInput, DeviceFailure, DeviceHandle, Overloaded, Scheduler, discover_handles

TINY = ("7767517\n4 4\n"
        "Input in 0 1 data 0=8 1=8 2=3\n"
        "Convolution conv 1 1 data c 0=4 1=3 4=1 5=1 6=108\n"
        "ReLU relu 1 1 c r\n"
        "InnerProduct fc 1 1 r prob 0=10 1=1 2=2560\n")


def write_model(repo: Path, config: str = "") -> Path:
    folder = repo / "tiny"
    folder.mkdir(parents=True)
    (folder / "model.param").write_text(TINY)
    write_random_bin(folder / "model.param", folder / "model.bin", seed=2)
    (folder / "config.toml").write_text(config)
    return folder


def x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 8, 8)).astype(np.float32)


def reference(folder: Path, data: np.ndarray) -> np.ndarray:
    return Plan(load_model(folder / "model.param", folder / "model.bin")).run({"data": data})["prob"]


async def until(predicate: object, timeout: float = 5) -> None:
    assert callable(predicate)
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.002)


async def saturate(sched: Scheduler, device: DeviceHandle, nursery: trio.Nursery, slots: int = 1) -> None:
    """Hold ``slots`` blocker jobs at the paused device's gate, so later jobs queue."""
    device.pause()
    for n in range(slots):
        nursery.start_soon(sched.infer, "tiny", {"data": x(100 + n)})
    await until(lambda: sched.status().in_flight == slots)


async def test_queued_jobs_run_as_one_batch_with_their_own_answers(tmp_path: Path) -> None:
    folder = write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    got: dict[int, tuple[np.ndarray, int]] = {}
    async with serving([device], tmp_path, instances_per_device=1) as sched:

        async def job(n: int) -> None:
            result = await sched.infer("tiny", {"data": x(n)})
            got[n] = (result.outputs["prob"], result.batch_size)

        async with trio.open_nursery() as nursery:
            await saturate(sched, device, nursery)
            for n in range(5):
                nursery.start_soon(job, n)
            await until(lambda: sched.status().queue_depth == 5)
            device.resume()
        runs = device_runs(sched)
    assert {n: b for n, (_, b) in got.items()} == dict.fromkeys(range(5), 5)
    for n, (prob, _) in got.items():
        np.testing.assert_array_equal(prob, reference(folder, x(n)))
    assert runs == 2  # the blocker, then the batch of five


def device_runs(sched: Scheduler) -> int:
    (device,) = sched.status().devices
    return device.runs


async def test_batches_take_the_highest_priorities_first_up_to_max_batch_size(tmp_path: Path) -> None:
    write_model(tmp_path, "max_batch_size = 3\n")
    device = DeviceHandle.cpu(0)
    finished: list[tuple[int, int]] = []  # (priority, batch size) in completion order
    async with serving([device], tmp_path, instances_per_device=1) as sched:

        async def job(priority: int) -> None:
            result = await sched.infer("tiny", {"data": x(priority)}, priority=priority)
            finished.append((priority, result.batch_size))

        async with trio.open_nursery() as nursery:
            await saturate(sched, device, nursery)
            for n, priority in enumerate([1, 7, 3, 9, 5, 8, 2]):
                nursery.start_soon(job, priority)
                await until(lambda n=n: sched.status().queue_depth == n + 1)
            device.resume()
    # batches in priority order: {9, 8, 7}, {5, 3, 2}, {1}
    groups = [{p for p, _ in finished[0:3]}, {p for p, _ in finished[3:6]}, {p for p, _ in finished[6:]}]
    assert groups == [{9, 8, 7}, {5, 3, 2}, {1}]
    assert [b for _, b in finished] == [3, 3, 3, 3, 3, 3, 1]


async def test_preferred_batch_sizes_cut_the_batch(tmp_path: Path) -> None:
    write_model(tmp_path, "max_batch_size = 8\npreferred_batch_sizes = [2, 4]\n")
    device = DeviceHandle.cpu(0)
    sizes: list[int] = []
    async with serving([device], tmp_path, instances_per_device=1) as sched:

        async def job(n: int) -> None:
            sizes.append((await sched.infer("tiny", {"data": x(n)})).batch_size)

        async with trio.open_nursery() as nursery:
            await saturate(sched, device, nursery)
            for n in range(7):
                nursery.start_soon(job, n)
            await until(lambda: sched.status().queue_depth == 7)
            device.resume()
    assert sorted(sizes) == [1, 2, 2, 4, 4, 4, 4]  # 7 = 4 + 2 + 1


async def test_a_short_batch_waits_up_to_max_queue_delay(tmp_path: Path) -> None:
    write_model(tmp_path, "max_batch_size = 4\nmax_queue_delay_ms = 400\n")
    async with serving([DeviceHandle.cpu(0)], tmp_path, instances_per_device=1) as sched:
        results = []

        async def job(n: int) -> None:
            results.append(await sched.infer("tiny", {"data": x(n)}))

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(job, 0)
            await trio.sleep(0.05)
            nursery.start_soon(job, 1)  # joins the first one, which is still waiting
        took = trio.current_time() - start
        assert [r.batch_size for r in results] == [2, 2]
        assert took >= 0.4  # the two were not a full batch: they waited out the delay
        # a full batch does not wait
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(job, n)
        assert trio.current_time() - start < 0.4
        assert [r.batch_size for r in results[2:]] == [4, 4, 4, 4]


async def test_a_batch_never_makes_a_job_miss_a_deadline_it_meets_alone(tmp_path: Path) -> None:
    """Runs take 50 ms (an injected delay, measured by the warm-up); a batch of six is
    estimated at six times that until measured. The job with a 300 ms deadline would miss it
    in the batch, so it runs alone on the second slot, and meets it."""
    write_model(tmp_path, "warmup = 2\n")
    device = DeviceHandle.cpu(0)
    device.inject_delay(0.05)
    results: dict[str, int] = {}
    async with serving([device], tmp_path, instances_per_device=2) as sched:

        async def job(tag: str, deadline: float | None) -> None:
            results[tag] = (await sched.infer("tiny", {"data": x(1)}, deadline=deadline)).batch_size

        async with trio.open_nursery() as nursery:
            await saturate(sched, device, nursery, slots=2)
            for n in range(5):
                nursery.start_soon(job, f"plain{n}", None)
            await until(lambda: sched.status().queue_depth == 5)
            nursery.start_soon(job, "deadline", time.time() + 0.3)
            await until(lambda: sched.status().queue_depth == 6)
            device.resume()
    assert results == {**{f"plain{n}": 5 for n in range(5)}, "deadline": 1}


async def test_a_cancelled_job_leaves_its_batch_cleanly(tmp_path: Path) -> None:
    folder = write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    got: dict[int, np.ndarray] = {}
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        scopes = {n: trio.CancelScope() for n in range(6)}

        async def job(n: int) -> None:
            with scopes[n]:
                got[n] = (await sched.infer("tiny", {"data": x(n)})).outputs["prob"]

        async with trio.open_nursery() as nursery:
            await saturate(sched, device, nursery)
            for n in range(3):
                nursery.start_soon(job, n)
            await until(lambda: sched.status().queue_depth == 3)
            scopes[1].cancel()  # queued: leaves before the batch forms
            await until(lambda: sched.status().queue_depth == 2)
            device.resume()
        device.inject_delay(0.3)  # now a batch that is running when one of its jobs is cancelled
        async with trio.open_nursery() as nursery:
            await saturate(sched, device, nursery)
            for n in range(3, 6):
                nursery.start_soon(job, n)
            await until(lambda: sched.status().queue_depth == 3)
            device.resume()
            await until(lambda: sched.status().in_flight == 3)
            scopes[4].cancel()
        totals = sched.status().totals
    assert sorted(got) == [0, 2, 3, 5]
    for n, prob in got.items():
        np.testing.assert_array_equal(prob, reference(folder, x(n)))
    assert totals.cancelled == 2 and totals.discarded == 1 and totals.failed == 0


async def test_a_clients_leading_batch_dimension_is_a_batch(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "max_batch_size = 4\nqueue_limit = 3\n")
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        data = np.stack([x(n) for n in range(3)])
        result = await sched.infer("tiny", {"data": data})
        assert result.outputs["prob"].shape == (3, 10)
        for n in range(3):
            np.testing.assert_array_equal(result.outputs["prob"][n], reference(folder, x(n)))
        with pytest.raises(BadInput, match=r"a batch of 5; the model takes 1 to 4"):
            await sched.infer("tiny", {"data": np.zeros((5, 3, 8, 8), np.float32)})
        with pytest.raises(Overloaded, match="the batch adds 4"):
            await sched.infer("tiny", {"data": np.zeros((4, 3, 8, 8), np.float32)})


async def test_lavapipe_runs_a_batch_in_one_execution(tmp_path: Path) -> None:
    handles, _ = discover_handles(use_vulkan=True, cache_dir=str(tmp_path / "cache"))
    gpu = next(h for h in handles if not h.is_cpu)
    repo = tmp_path / "repo"
    folder = write_model(repo, 'precision = "fp32"\ndevices = "gpu"\n')
    got: dict[int, tuple[np.ndarray, int]] = {}
    async with serving([gpu], repo, instances_per_device=1) as sched:

        async def job(n: int) -> None:
            result = await sched.infer("tiny", {"data": x(n)})
            got[n] = (result.outputs["prob"], result.batch_size)

        async with trio.open_nursery() as nursery:
            gpu.pause()
            nursery.start_soon(sched.infer, "tiny", {"data": x(99)})
            await until(lambda: sched.status().in_flight == 1)
            for n in range(4):
                nursery.start_soon(job, n)
            await until(lambda: sched.status().queue_depth == 4)
            gpu.resume()
    for n, (prob, size) in got.items():
        assert size == 4
        np.testing.assert_allclose(prob, reference(folder, x(n)), rtol=1e-2, atol=1e-2)


async def test_a_clients_batch_runs_as_one_batch_on_an_idle_device(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        result = await sched.infer("tiny", {"data": np.stack([x(n) for n in range(6)])})
        assert result.batch_size == 6 and device_runs(sched) == 1


async def test_a_failing_item_fails_the_clients_batch_with_its_error(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        device.inject_fault(1)  # the batch's run fails; no other device: DEVICE_FAILURE
        with pytest.raises(DeviceFailure, match="injected fault"):
            await sched.infer("tiny", {"data": np.stack([x(n) for n in range(3)])})
        totals = sched.status().totals
        assert totals.submitted == 3 and totals.completed == 0


async def test_results_carry_the_executions_stage_times(tmp_path: Path) -> None:
    write_model(tmp_path)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        result = await sched.infer("tiny", {"data": x(0)})
    stages = result.stages
    assert stages is not None and min(stages.copy_in, stages.run, stages.copy_out) >= 0
    assert 0 < stages.copy_in + stages.run + stages.copy_out <= result.run_seconds
