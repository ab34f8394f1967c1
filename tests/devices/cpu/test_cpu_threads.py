"""The CPU engine's thread count: the daemon config's ``[cpu] threads``, else
``$VKSERVE_CPU_THREADS``, else the cores the process may use (``vkserve.devices.cpu.threads``),
checked in the config, in-process, and in a real daemon's log."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from tests.support.daemon import Launch, cpu_engine_prob, sample
from vkserve.client import Client
from vkserve.daemon.config import DEFAULT_CONFIG, ConfigError, parse_config
from vkserve.devices.cpu import jit, threads


def test_config_key_defaults_to_zero_and_is_checked() -> None:
    assert parse_config(DEFAULT_CONFIG).cpu.threads == 0  # the documented default
    assert parse_config("[cpu]\nthreads = 3\n").cpu.threads == 3
    with pytest.raises(ConfigError, match=r"cpu\.threads: must be >= 0"):
        parse_config("[cpu]\nthreads = -1\n")
    with pytest.raises(ConfigError, match=r"cpu\.threads: expected int"):
        parse_config('[cpu]\nthreads = "all"\n')
    with pytest.raises(ConfigError, match=r"cpu\.thread: unknown key"):
        parse_config("[cpu]\nthread = 2\n")


def test_config_then_environment_then_cores(caplog: pytest.LogCaptureFixture) -> None:
    cores = threads.available_cores()
    assert threads.resolve(3, {"VKSERVE_CPU_THREADS": "5"}) == (3, "cpu.threads")
    assert threads.resolve(0, {"VKSERVE_CPU_THREADS": "5"}) == (5, "VKSERVE_CPU_THREADS")
    assert threads.resolve(0, {})[0] == cores
    with caplog.at_level(logging.WARNING, logger=threads.__name__):
        assert threads.resolve(0, {"VKSERVE_CPU_THREADS": "many"})[0] == cores
    assert "VKSERVE_CPU_THREADS='many' is not a positive integer" in caplog.text


def test_configure_sets_the_kernels_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "THREADS", threads.THREADS)  # restored afterwards
    assert threads.configure(1) == "CPU engine: 1 thread (cpu.threads)"
    jit.use_threads()
    assert numba.get_num_threads() == 1
    n = min(2, numba.config.NUMBA_NUM_THREADS)
    assert threads.configure(n).startswith(f"CPU engine: {n} thread")
    jit.use_threads()
    assert numba.get_num_threads() == n
    # the numpy split pool follows the new count (a 4-way split runs on 3 pool workers)
    threads.configure(4)
    seen: list[int] = []
    threads.run_chunks(lambda i, lo, hi: seen.append(i), [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert sorted(seen) == [0, 1, 2, 3]


def test_small_kernels_run_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ``jit.small_work()`` multiply-adds a kernel runs on its calling thread alone
    (waking the pool costs more there); the result is the same bits either way."""
    n = min(2, numba.config.NUMBA_NUM_THREADS)
    monkeypatch.setattr(threads, "THREADS", n)
    jit.use_threads()  # the pool started: the threshold is known
    with jit.launch(jit.small_work() - 1):
        assert numba.get_num_threads() == 1
    with jit.launch(jit.small_work()):
        assert numba.get_num_threads() == n


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs numba's pool of 2 or more threads")
def test_a_call_made_once_runs_on_the_team_launch_would_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    """``KernelCall`` skips ``launch`` only where it would change nothing: after another call
    (a small one, on one thread), a cap, or the engine's count changing, its kernel runs on the
    team ``launch`` chooses for it."""
    monkeypatch.setattr(threads, "THREADS", 2)
    jit.use_threads()  # the pool started: the threshold is known
    seen: list[int] = []

    def kernel() -> None:
        seen.append(numba.get_num_threads())

    big = jit.KernelCall(kernel, (), jit.small_work())
    small = jit.KernelCall(kernel, (), jit.small_work() - 1)
    big(), big(), small(), big()
    jit.cap_threads(1)
    big()
    jit.cap_threads(0)
    big()
    monkeypatch.setattr(threads, "THREADS", 1)
    big()
    monkeypatch.setattr(threads, "THREADS", 2)
    big()
    assert seen == [2, 2, 1, 2, 1, 2, 1, 2]


def test_daemon_applies_the_config_key(tmp_path: Path, launch_daemon: Launch) -> None:
    """A real daemon: ``[cpu] threads = 1`` wins over the environment, is logged at start, and
    the daemon serves CPU jobs with it."""
    d = launch_daemon(tmp_path, f'[server]\nsocket = "{tmp_path}/d.sock"\n[cpu]\nthreads = 1\n'
                                '[scheduler]\nuse_vulkan = false\n',
                      env={"VKSERVE_CPU_THREADS": "2"})
    assert "CPU engine: 1 thread (cpu.threads)" in d.log_text()
    x = sample(3)
    with Client.connect(f"unix:{d.socket}") as c:
        prob = c.infer("digits", {"data": x})["prob"]
    np.testing.assert_array_equal(prob, cpu_engine_prob(x))


def test_idle_workers_sleep_on_few_threads_and_spin_briefly_on_many() -> None:
    assert jit.wait_settings(1, {}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert jit.wait_settings(jit.SPIN_MIN_THREADS - 1, {}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert jit.wait_settings(jit.SPIN_MIN_THREADS, {}) == {"GOMP_SPINCOUNT": jit.SPIN_COUNT}
    assert jit.wait_settings(16, {}) == {"GOMP_SPINCOUNT": jit.SPIN_COUNT}
    # the environment's own choice wins, whichever of the two it sets
    assert jit.wait_settings(16, {"OMP_WAIT_POLICY": "PASSIVE"}) == {}
    assert jit.wait_settings(1, {"GOMP_SPINCOUNT": "0"}) == {}


def test_the_wait_settings_do_not_leak_into_the_environment() -> None:
    """Set only while the pool's libgomp starts: a later OpenMP user (ncnn's own libgomp, a
    child process) sees the environment as it was."""
    code = ("import os, numpy as np\n"
            "from vkserve.devices.cpu import jit\n"
            "jit.use_threads(1 << 30)\n"
            "print(sorted(k for k in os.environ if k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')),"
            " jit.small_work())\n")
    # spinning workers wake fast: smaller kernels are split too
    for count, small in (("1", jit.SMALL_WORK), ("8", jit.SMALL_WORK_SPINNING)):
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        env["VKSERVE_CPU_THREADS"] = count
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             timeout=120, check=True)
        assert out.stdout.strip() == f"[] {small}", out.stderr
