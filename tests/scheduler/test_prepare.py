"""A device's one-time preparation (the CPU's kernels compiled for this machine: minutes on a
first start) runs beside everything else: the scheduler answers meanwhile, the model's
placement says what it waits for, a job sent then runs once it is done; a failed preparation
fails that device's placements with its reason and the scheduler goes on. A first start
compiles the kernels in a child process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numba
import numpy as np
import pytest
import trio

from tests.scheduler.test_scheduler import reference, until, write_model, x
from tests.support.paths import DIGITS, REPO
from vkserve.devices.cpu.warm import KERNEL_MODULES, compile_kernels, kernels_cached
from vkserve.scheduler import DeviceHandle, ModelRepository, ModelState, Scheduler, SchedulerConfig, core, engine


async def test_the_scheduler_serves_while_the_cpu_kernels_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_model(tmp_path)
    await trio.to_thread.run_sync(compile_kernels)  # run alone too: the wait below is not a compile's
    release = threading.Event()
    prepared = core.prepare_device

    async def slow_prepare(device: DeviceHandle) -> str | None:  # a first start's long compile
        assert await trio.to_thread.run_sync(release.wait, 30)
        return await prepared(device)

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
        await until(sched, sched.ready)  # the start-up task ends a step after the job's answer
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

    async def failing_prepare(device: DeviceHandle) -> str | None:
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


async def test_a_first_start_compiles_the_cpu_kernels_in_a_child_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's cache without vkserve's stamp is a first start: a child process compiles the
    kernels (here it finds them in a copy of the test run's cache, so it loads rather than
    compiles them) and writes the stamp; a later start finds the stamp and needs no child.
    The daemon's own process compiles none and loads none either way (each model's load
    loads those it runs: ``test_the_daemon_loads_only_the_kernels_its_models_run``)."""
    await trio.to_thread.run_sync(compile_kernels)  # this run's cache holds every kernel
    cache = tmp_path / "numba"
    shutil.copytree(os.environ["NUMBA_CACHE_DIR"], cache,
                    ignore=shutil.ignore_patterns("vkserve-kernels.stamp"))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))  # the child's cache, and the stamp's folder
    assert not kernels_cached()
    first = await engine.prepare_device(DeviceHandle.cpu(0))
    assert first is not None and re.match(
        r"CPU kernels ready in [\d.]+ s: 0 compiled .* loaded from the cache "
        rf"\({re.escape(str(cache))}\), in a child process; each model loads those it runs$", first), first
    assert kernels_cached() and (cache / "vkserve-kernels.stamp").is_file()
    again = await engine.prepare_device(DeviceHandle.cpu(0))
    assert again == (f"CPU kernels ready: compiled for this machine, in numba's cache ({cache}); "
                     "each model loads those it runs"), again


#: a fresh process (no kernel loaded yet), as the daemon starts with its kernels cached: the
#: CPU's preparation, then the scheduler's load of a small model (Plans, warm-up runs)
_LAZY_CHILD = """
import json, sys, numba, trio
from pathlib import Path
from vkserve.devices.cpu.warm import KERNEL_MODULES
from vkserve.models.graph import load_model
from vkserve.scheduler import DeviceHandle, core, engine
from vkserve.scheduler.registry import read_model_folder

def loaded():
    return sorted(f"{m.__name__}.{k}" for m in KERNEL_MODULES for k, v in vars(m).items()
                  if isinstance(v, numba.core.registry.CPUDispatcher) and v.overloads)

released = []  # the kernels loaded as the compiler's pages were let go, each time
engine.release_compiler_pages = lambda: released.append(len(loaded()))
said = trio.run(engine.prepare_device, DeviceHandle.cpu(0))
at_start = loaded()
spec = read_model_folder(Path(sys.argv[1]))
graph = load_model(spec.param_path, spec.bin_path, input_shapes={"data": (1, 8, 8)})

async def load():
    return await trio.to_thread.run_sync(core._compile_and_warm, DeviceHandle.cpu(0), graph, spec, 1, 1)

trio.run(load)
print(json.dumps({"said": said, "at_start": at_start, "after_load": loaded(), "released": released}))
"""


def test_the_daemon_loads_only_the_kernels_its_models_run() -> None:
    """With the kernels in numba's cache, the CPU's preparation loads none (every kernel
    loaded took 31 MiB more of a serving process) and lets go of the JIT compiler's pages the
    imports read; a model's load loads those its Plans run, in its warm-up, and then lets the
    compiler's pages go again (``after_warm_up``)."""
    compile_kernels()  # the stamp and every kernel in this run's cache
    done = subprocess.run([sys.executable, "-c", _LAZY_CHILD, str(DIGITS)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["said"].startswith("CPU kernels ready: compiled for this machine, in numba's cache"), got
    assert got["at_start"] == [], got
    every = {f"{m.__name__}.{k}" for m in KERNEL_MODULES for k, v in vars(m).items()
             if isinstance(v, numba.core.registry.CPUDispatcher)}
    assert got["after_load"] and set(got["after_load"]) < every, got  # the model's own: a few of them
    assert "vkserve.devices.cpu.jit.conv.conv_gemm" in got["after_load"] or any(
        "innerproduct" in k for k in got["after_load"]), got
    assert got["released"] == [0, len(got["after_load"])], got  # at the start, then after the load


async def test_the_childs_stamp_is_the_one_the_daemon_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child inherits the daemon's settings as explicit NUMBA_* variables: the stamp it
    writes is the daemon's own, so the next start needs no child."""
    await trio.to_thread.run_sync(compile_kernels)
    cache = tmp_path / "numba"
    shutil.copytree(os.environ["NUMBA_CACHE_DIR"], cache,
                    ignore=shutil.ignore_patterns("vkserve-kernels.stamp"))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    report = await engine.compile_kernels_apart()
    assert (report.compiled, report.cache_dir) == (0, str(cache)) and report.cached > 0, report
    assert kernels_cached()


async def test_a_failed_child_compilation_names_its_exit_status_and_last_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))  # no stamp: the child is needed
    python = tmp_path / "python"  # the child's interpreter, failing as a broken numba would
    python.write_text("#!/bin/sh\necho 'numba: cannot allocate executable memory' >&2\nexit 3\n")
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    with pytest.raises(RuntimeError) as failed:
        await engine.prepare_device(DeviceHandle.cpu(0))
    assert str(failed.value) == ("compiling the CPU kernels in a child process failed (exit "
                                 "status 3): numba: cannot allocate executable memory")
