"""The pool's workers pinned to cores of their own, the launching thread kept off them while it
runs a job's kernels and left free otherwise (``vkserve.devices.cpu.jit.pinning``): every
thread's CPU mask as the kernel has it (the threads of ``/proc/self/task``), in child processes
that run a real 2-thread Plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vkserve.devices.cpu import threads
from vkserve.devices.cpu.jit import pinning

#: a child: one convolution large enough to split, run on 2 threads; then every thread's CPU
#: list, the main thread's mask during and after the run, and that of a thread started after it
CHILD = r"""
import json, os, threading
import numpy as np
from vkserve.devices.cpu import jit
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.cpu.thread_choice import ThreadChoice
from vkserve.models.graph import build_graph, parse_param_text
from vkserve.models.randinit import random_weights
layers = parse_param_text("7767517\n2 2\nInput data 0 1 data 0=32 1=32 2=64\n"
                          "Convolution conv 1 1 data out 0=64 1=3 4=1 5=1 6=36864 9=1\n", "one conv")
for layer, weights in zip(layers, random_weights(layers, 1)):
    layer.weights = weights
plan = Plan(build_graph(layers, "one conv"))
plan.thread_choice = ThreadChoice.fixed(2)
during = []
kernel = next(s.kernel for s in plan._steps if s.kernel.layer.type == "Convolution")
store_call = kernel.store_call
def spying(*args):  # the call the Plan makes once: its kernel, spied on as it runs
    call = store_call(*args)
    run = call.kernel
    def kernel_run(*kernel_args):
        during.append(sorted(os.sched_getaffinity(0)))
        run(*kernel_args)
    call.kernel = kernel_run
    return call
kernel.store_call = spying
if os.environ["FIRST"] == "profile":  # the job's first parallel region inside run_threads
    plan.profile({"data": np.ones((64, 32, 32), np.float32)}, runs=1)
else:
    plan.run({"data": np.ones((64, 32, 32), np.float32)})
def lists():  # every thread of the process: its CPU mask (a thread id names the thread)
    return {tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}
later = []
t = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
t.start(); t.join()
print(json.dumps({"main_tid": str(threading.get_native_id()), "lists": lists(), "during": during,
                  "after": sorted(os.sched_getaffinity(0)), "later": later[0]}))
"""


def run_child(pin: str, first: str = "run") -> dict:
    env = dict(os.environ, VKSERVE_CPU_THREADS="2", VKSERVE_CPU_PIN=pin, FIRST=first)
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


needs_two = pytest.mark.skipif(threads.available_cores() < 2, reason="pinning needs 2 cores this process may use")


@needs_two
@pytest.mark.parametrize("first", ["run", "profile"])
def test_a_two_thread_job_pins_its_worker_and_keeps_the_launching_thread_off_its_core(first: str) -> None:
    """Also where the process's first parallel region runs inside the job (``Plan.profile``
    loads its inputs there): the team's worker, started then, must not inherit the launching
    thread's one-core mask."""
    cores = sorted(os.sched_getaffinity(0))
    got = run_child("1", first)
    assert got["during"] and all(d == cores[:1] for d in got["during"])  # on the first core while it runs kernels
    assert got["after"] == cores and got["later"] == cores  # its own mask back; new threads not pinned
    assert got["lists"][got["main_tid"]] == cores
    others = [v for tid, v in got["lists"].items() if tid != got["main_tid"]]
    assert [cores[1]] in others, got["lists"]  # the team's worker, on the second core
    assert cores[:1] not in others, got["lists"]  # and none on the launching thread's


@needs_two
def test_pinning_can_be_turned_off() -> None:
    cores = sorted(os.sched_getaffinity(0))
    got = run_child("0")
    assert got["during"] and all(d == cores for d in got["during"])
    assert all(v == cores for v in got["lists"].values()), got["lists"]


def test_worker_cores_start_at_the_second_and_wrap() -> None:
    assert pinning.worker_cores([0, 1], 1) == [1]
    assert pinning.worker_cores([2, 5, 7], 4) == [5, 7, 2, 5]
    assert pinning.worker_cores([0, 1, 2, 3], 3) == [1, 2, 3]


def test_launcher_scope_restores_the_mask_and_does_nothing_for_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    before = os.sched_getaffinity(0)
    with pinning.launcher_on_first_core(1):
        assert os.sched_getaffinity(0) == before
    monkeypatch.setenv(pinning.ENV_VAR, "0")
    with pinning.launcher_on_first_core(4):
        assert os.sched_getaffinity(0) == before
    monkeypatch.setenv(pinning.ENV_VAR, "1")
    with pinning.launcher_on_first_core(4):
        assert os.sched_getaffinity(0) == ({min(before)} if len(before) > 1 else before)
    assert os.sched_getaffinity(0) == before
