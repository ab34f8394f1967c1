"""`Scheduler.submit`: jobs without a task of their own (the daemon's connections use it), ended
through their callback with the result, at their deadline (the scheduler's watcher), when
cancelled, or not admitted at all where the awaiting `infer` is needed (a client's batch)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import trio

from tests.scheduler.test_scheduler import reference, until, write_model, x
from tests.support.scheduler import serving
from vkserve.devices.output_room import OutputRoom, Placed
from vkserve.scheduler import BadInput, Cancelled, DeadlineExceeded, DeviceHandle, Job


async def test_a_submitted_job_ends_through_its_callback(tmp_path: Path) -> None:
    folder = write_model(tmp_path)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        ended: list[Job] = []
        job = sched.submit("tiny", {"data": x(3)}, priority=None, deadline=None, outputs=None,
                           on_done=ended.append)
        assert job is not None
        await until(sched, lambda: bool(ended))
        assert ended == [job] and job.error is None and job.result is not None
        np.testing.assert_allclose(job.result.outputs["prob"], reference(folder, x(3)), rtol=1e-5, atol=1e-6)
        assert sched.status().totals.completed == 1


async def test_the_engine_writes_a_job_s_outputs_into_its_room(tmp_path: Path) -> None:
    folder = write_model(tmp_path)
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        memory = bytearray(4096)
        room = OutputRoom(memoryview(memory))
        ended: list[Job] = []
        job = sched.submit("tiny", {"data": x(3)}, priority=None, deadline=None, outputs=None,
                           on_done=ended.append, room=room)
        assert job is not None and job.room is room
        await until(sched, lambda: bool(ended))
        assert job.result is not None
        prob = job.result.outputs["prob"]
        assert np.shares_memory(prob, np.frombuffer(memory, np.uint8))  # written there by the run
        np.testing.assert_allclose(prob, reference(folder, x(3)), rtol=1e-5, atol=1e-6)
        assert room.complete(job.result.outputs) == {"prob": Placed(0, prob.nbytes)}


async def test_a_job_ended_during_its_run_leaves_its_room_untouched(tmp_path: Path) -> None:
    """The answer (deadline exceeded) goes out while the run goes on; the run's end writes
    nothing into the room the client may already be reusing."""
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path) as sched:
        device.inject_delay(0.4)
        memory = bytearray(4096)
        ended: list[Job] = []
        job = sched.submit("tiny", {"data": x(3)}, priority=None, deadline=time.time() + 0.1,
                           outputs=None, on_done=ended.append, room=OutputRoom(memoryview(memory)))
        await until(sched, lambda: bool(ended))
        assert job is not None and isinstance(job.error, DeadlineExceeded)
        await until(sched, lambda: sched.status().totals.discarded == 1)  # the run ended
        assert memory == bytearray(4096)


async def test_the_deadline_watcher_ends_a_queued_job_on_time(tmp_path: Path) -> None:
    write_model(tmp_path, config="max_batch_size = 1\n")
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path, instances_per_device=1) as sched:
        device.pause()
        ended: list[Job] = []
        blocker = sched.submit("tiny", {"data": x()}, priority=None, deadline=None, outputs=None,
                               on_done=ended.append)
        await until(sched, lambda: sched.status().in_flight == 1)
        start = trio.current_time()
        late = sched.submit("tiny", {"data": x(1)}, priority=None, deadline=time.time() + 0.3,
                            outputs=None, on_done=ended.append)
        sooner = sched.submit("tiny", {"data": x(2)}, priority=None, deadline=time.time() + 0.1,
                              outputs=None, on_done=ended.append)
        await until(sched, lambda: len(ended) == 2)
        assert ended == [sooner, late]  # each at its own deadline, the earlier one first
        assert 0.25 <= trio.current_time() - start < 1.5
        for job in ended:
            assert isinstance(job.error, DeadlineExceeded)
            assert "deadline passed while the job was queued" in str(job.error.message)
        device.resume()
        await until(sched, lambda: len(ended) == 3)
        assert ended[2] is blocker and blocker.error is None
        totals = sched.status().totals
        assert (totals.deadline_exceeded, totals.completed) == (2, 1)


async def test_cancel_ends_a_submitted_job_once(tmp_path: Path) -> None:
    write_model(tmp_path)
    device = DeviceHandle.cpu(0)
    async with serving([device], tmp_path) as sched:
        device.pause()
        ended: list[Job] = []
        job = sched.submit("tiny", {"data": x()}, priority=None, deadline=None, outputs=None,
                           on_done=ended.append)
        assert job is not None
        sched.cancel(job, "the caller cancelled the job")
        sched.cancel(job, "again")  # ended already: nothing happens
        assert ended == [job] and isinstance(job.error, Cancelled)
        assert "the caller cancelled the job" in job.error.message
        device.resume()
        await trio.sleep(0.1)
        assert ended == [job] and sched.status().totals.cancelled == 1


async def test_a_client_batch_is_left_to_infer(tmp_path: Path) -> None:
    write_model(tmp_path, config="max_batch_size = 4\n")
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        batch = np.stack([x(0), x(1)])
        assert sched.submit("tiny", {"data": batch}, priority=None, deadline=None, outputs=None,
                            on_done=lambda job: None) is None
        assert sched.status().totals.submitted == 0
        result = await sched.infer("tiny", {"data": batch})
        assert result.outputs["prob"].shape[0] == 2


async def test_a_model_with_postprocess_is_submitted_and_its_job_ends_explained(tmp_path: Path) -> None:
    folder = write_model(tmp_path, config='[inputs]\ndata = [3, 8, 8]\n[preprocess]\npixel_format = "RGB"\n'
                                          '[postprocess]\nkind = "topk"\ntop_k = 2\n')
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        ended: list[Job] = []
        job = sched.submit("tiny", {"data": x(4)}, priority=None, deadline=None, outputs=None,
                           on_done=ended.append)
        assert job is not None  # a float tensor: nothing to preprocess, a top-k computed inline
        await until(sched, lambda: bool(ended))
        assert job.error is None and job.result is not None
        prob = reference(folder, x(4))
        [top] = job.result.meanings
        assert [c.index for c in top.classes] == list(np.argsort(-prob)[:2])
        # an image to convert (a worker thread's work): the awaiting path instead
        image = np.zeros((8, 8, 3), np.uint8)
        assert sched.submit("tiny", {"data": image}, priority=None, deadline=None, outputs=None,
                            on_done=ended.append) is None
        assert sched.status().totals.completed == 1


async def test_a_result_that_cannot_be_explained_fails_its_submitted_job(tmp_path: Path) -> None:
    write_model(tmp_path, config='[postprocess]\nkind = "detection"\n')  # prob is no box table
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        ended: list[Job] = []
        job = sched.submit("tiny", {"data": x(4)}, priority=None, deadline=None, outputs=None,
                           on_done=ended.append)
        assert job is not None
        await until(sched, lambda: bool(ended))
        assert job.result is None and isinstance(job.error, BadInput), job.error
        assert "prob" in job.error.message, job.error.message
