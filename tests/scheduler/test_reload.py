"""Reloads (``Scheduler.rescan`` of a changed model folder) are load-new-then-swap: the serving
version keeps answering while the new one loads, a broken new version is reported and never
swapped in, a plain ``touch`` is no change, jobs running on the old version finish on it, and
the old version is freed once they have ended (issue 11, item 5)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import trio

from tests.support.scheduler import serving
from vkserve.devices.cpu.executor import Plan
from vkserve.models.graph import load_model
from vkserve.models.weights import write_random_bin
from vkserve.scheduler import (
    DeviceHandle,
    ModelState,
    RescanResult,
    Scheduler,
    SchedulerError,
)

TINY = ("7767517\n4 4\n"
        "Input in 0 1 data 0=8 1=8 2=3\n"
        "Convolution conv 1 1 data c 0=4 1=3 4=1 5=1 6=108\n"
        "ReLU relu 1 1 c r\n"
        "InnerProduct fc 1 1 r prob 0=10 1=1 2=2560\n")
# the same layers on a 16x16 input: a new version whose input shape differs
WIDE = (TINY.replace("0=8 1=8 2=3", "0=16 1=16 2=3").replace("2=2560", "2=10240"))
NOTHING = RescanResult(loaded=[], removed=[], reloaded=[], failed={})


def write_model(repo: Path, seed: int, param: str = TINY, config: str | None = None) -> Path:
    folder = repo / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.param").write_text(param)
    write_random_bin(folder / "model.param", folder / "model.bin", seed=seed)
    if config is not None:
        (folder / "config.toml").write_text(config)
    return folder


def data(shape: tuple[int, ...] = (3, 8, 8)) -> np.ndarray:
    return np.random.default_rng(7).standard_normal(shape).astype(np.float32)


def reference(folder: Path, x: np.ndarray) -> np.ndarray:
    return Plan(load_model(folder / "model.param", folder / "model.bin")).run({"data": x})["prob"]


async def rescan(sched: Scheduler) -> RescanResult:
    with trio.fail_after(10):
        return await sched.rescan()


async def test_reload_under_load_never_fails_a_job(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Clients infer in a loop while the weights are truncated, touched, fixed and changed;
    every answer is ok and comes from the version that was serving."""
    folder = write_model(tmp_path, seed=1)
    x = data()
    old = reference(folder, x)
    cpu = DeviceHandle.cpu(0)
    cpu.inject_delay(0.002)  # runs overlap the loads
    answers: list[np.ndarray] = []
    errors: list[str] = []
    async with serving([cpu], tmp_path, instances_per_device=2) as sched:
        stop = trio.Event()

        async def client() -> None:
            while not stop.is_set():
                try:
                    answers.append((await sched.infer("tiny", {"data": x})).outputs["prob"])
                except SchedulerError as exc:
                    errors.append(f"{exc.code}: {exc.message}")
                    await trio.sleep(0.001)  # a refusal has no checkpoint: let others run

        async def traffic(n: int) -> None:  # let at least n more answers come
            goal = len(answers) + n
            with trio.fail_after(10):
                while len(answers) < goal:
                    await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(client)
            await traffic(20)

            # (a) truncated weights: reported, not swapped in; the old version serves on
            good = (folder / "model.bin").read_bytes()
            (folder / "model.bin").write_bytes(good[: len(good) // 2])
            with caplog.at_level(logging.WARNING, logger="vkserve.scheduler.core"):
                report = await rescan(sched)
            assert report.reloaded == [] and list(report.failed) == ["tiny"]
            assert "tiny/model.bin" in report.failed["tiny"]
            (info,) = sched.models()
            assert info.state is ModelState.READY and info.devices == [0]
            assert info.reload_error == report.failed["tiny"] and info.reload_failures == 1
            assert not info.reloading
            queue = sched.status().models["tiny"]
            assert queue.reload_error == report.failed["tiny"] and queue.reload_failures == 1
            warnings = [r.getMessage() for r in caplog.records
                        if r.levelno >= logging.WARNING and "reload" in r.getMessage()]
            assert len(warnings) == 1 and str(folder) in warnings[0]
            assert "model.bin" in warnings[0] and "keeps serving" in warnings[0]
            await traffic(20)

            # a parse error in model.param: also reported, still served
            (folder / "model.param").write_text(TINY.replace("InnerProduct", "InnerPrduct"))
            report = await rescan(sched)
            assert "model.param" in report.failed["tiny"]
            assert sched.models()[0].reload_failures == 2
            (folder / "model.param").write_text(TINY)

            # the files back as they were (rewritten: new mtimes, same content): no reload,
            # and the reload error clears
            (folder / "model.bin").write_bytes(good)
            assert await rescan(sched) == NOTHING
            (info,) = sched.models()
            assert info.reload_error is None and info.reload_failures == 2
            await traffic(20)

            # (b) a plain touch: no reload at all
            before = list(sched._models.values())
            later = (folder / "model.bin").stat().st_mtime + 5
            for name in ("model.param", "model.bin"):
                os.utime(folder / name, (later, later))
            assert await rescan(sched) == NOTHING
            assert list(sched._models.values()) == before  # the very same version
            await traffic(20)

            # (c) new weights: swapped in under load, then every answer is the new one
            write_random_bin(folder / "model.param", folder / "model.bin", seed=2)
            new = reference(folder, x)
            assert not np.allclose(new, old)
            assert await rescan(sched) == RescanResult(loaded=[], removed=[],
                                                        reloaded=["tiny"], failed={})
            swapped = len(answers)
            await traffic(20)
            stop.set()

        assert errors == []
        for k, answer in enumerate(answers):
            # jobs admitted before the swap may end on either version; after it only new
            assert np.allclose(answer, old) or np.allclose(answer, new), k
        assert all(np.allclose(a, new) for a in answers[swapped + 8:])
        with trio.fail_after(5):
            await sched.wait_until(lambda: not sched._retiring)  # the old version is freed
        (info,) = sched.models()
        assert info.state is ModelState.READY and info.reload_error is None
        assert sched.status().totals.failed == 0


async def test_running_jobs_finish_on_the_old_version(tmp_path: Path) -> None:
    """A job running when the new version is swapped in ends on the old one; a job after the
    swap runs on the new one; the old version is freed once its job has ended."""
    folder = write_model(tmp_path, seed=1, config="warmup = 0\n")
    x = data()
    old = reference(folder, x)
    cpu = DeviceHandle.cpu(0)
    async with serving([cpu], tmp_path, instances_per_device=2) as sched:
        results: dict[str, np.ndarray] = {}

        async def infer(key: str) -> None:
            results[key] = (await sched.infer("tiny", {"data": x})).outputs["prob"]

        async with trio.open_nursery() as nursery:
            cpu.pause()  # the job holds an instance of the old version at the gate
            nursery.start_soon(infer, "before")
            with trio.fail_after(5):
                await sched.wait_until(lambda: sched.status().in_flight == 1)
            write_random_bin(folder / "model.param", folder / "model.bin", seed=2)
            new = reference(folder, x)
            with trio.fail_after(5):
                assert (await rescan(sched)).reloaded == ["tiny"]
            assert len(sched._retiring) == 1  # waiting for its running job
            (info,) = sched.models()
            assert info.state is ModelState.READY and info.in_flight == 1
            nursery.start_soon(infer, "after")
            with trio.fail_after(5):
                await sched.wait_until(lambda: sched.status().in_flight == 2)
            cpu.resume()
        np.testing.assert_array_equal(results["before"], old)
        np.testing.assert_array_equal(results["after"], new)
        with trio.fail_after(5):
            await sched.wait_until(lambda: not sched._retiring)


async def test_queued_jobs_stay_with_their_version_when_the_inputs_change(tmp_path: Path) -> None:
    """A new version with another input shape: jobs queued for the old one (validated against
    its shape) run on it; new jobs use the new shape."""
    folder = write_model(tmp_path, seed=1, config="warmup = 0\n")
    x = data()
    old = reference(folder, x)
    cpu = DeviceHandle.cpu(0)
    async with serving([cpu], tmp_path, instances_per_device=1) as sched:
        results: dict[str, np.ndarray] = {}

        async def infer(key: str, arr: np.ndarray) -> None:
            results[key] = (await sched.infer("tiny", {"data": arr})).outputs["prob"]

        async with trio.open_nursery() as nursery:
            cpu.pause()
            nursery.start_soon(infer, "running", x)
            with trio.fail_after(5):
                await sched.wait_until(lambda: sched.status().in_flight == 1)
            nursery.start_soon(infer, "queued", x)
            with trio.fail_after(5):
                await sched.wait_until(lambda: sched.status().queue_depth == 1)
            write_model(tmp_path, seed=3, param=WIDE)
            wide = data((3, 16, 16))
            new = reference(folder, wide)
            with trio.fail_after(5):
                assert (await rescan(sched)).reloaded == ["tiny"]
            assert sched.models()[0].inputs == {"data": [3, 16, 16]}
            assert sched.status().models["tiny"].queue_depth == 1  # still the old version's
            nursery.start_soon(infer, "new", wide)
            await trio.sleep(0.05)
            cpu.resume()
        np.testing.assert_array_equal(results["running"], old)
        np.testing.assert_array_equal(results["queued"], old)
        np.testing.assert_array_equal(results["new"], new)
        with trio.fail_after(5):
            await sched.wait_until(lambda: not sched._retiring)
