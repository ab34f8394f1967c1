"""A Plan's choice between one thread and the engine's (``vkserve.devices.cpu.thread_choice``):
the measuring order and the rule, and on a real Plan the counts its kernels were launched with,
the same bits on either count, the log line, and a sibling measuring on its own."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest

from tests.support.params import param_text
from vkserve.devices.cpu import threads
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.cpu.jit import KernelCall
from vkserve.devices.cpu.kernels import conv as conv_kernels
from vkserve.devices.cpu.thread_choice import (
    DRIFT_RUNS,
    MARGIN,
    RECHECK_RUNS,
    RECHECK_S,
    ROUNDS,
    SOON,
    WARMUP,
    ThreadChoice,
)
from vkserve.models.graph import load_model


def test_runs_alternate_after_the_warm_up_then_the_choice_holds() -> None:
    choice = ThreadChoice(4)
    order = []
    while choice.chosen is None:
        n = choice.next()
        order.append(n)
        choice.record(n, 0.010 if n == 1 else 0.004)
    assert order == [4] * WARMUP + [1, 4] * ROUNDS
    assert choice.chosen == 4 and choice.next() == 4
    assert not choice.record(4, 1.0) and choice.samples[4] == [0.004] * ROUNDS  # no more samples


@pytest.mark.parametrize(("one", "many", "chosen"), [
    (0.010, 0.010 * MARGIN, 4),  # saves the margin: the threads are worth their cores
    (0.010, 0.010 * MARGIN * 1.01, 1),  # saves less: one thread
    (0.010, 0.015, 1),  # slower on 4 (the pool's wake-ups): one thread
])
def test_several_threads_only_where_they_save_the_margin(one: float, many: float, chosen: int) -> None:
    choice = ThreadChoice(4)
    decided = []
    while choice.chosen is None:
        n = choice.next()
        decided.append(choice.record(n, one if n == 1 else many))
    assert choice.chosen == chosen
    assert decided.count(True) == 1 and decided[-1]  # the last run chose


def test_the_median_decides_not_one_slow_run() -> None:
    choice = ThreadChoice(2)
    times = {1: iter([0.010, 0.010, 0.010]), 2: iter([0.005, 0.050, 0.006])}  # one stall on 2
    choice.record(choice.next(), 1.0)  # the warm-up: not a sample
    while choice.chosen is None:
        n = choice.next()
        choice.record(n, next(times[n]))
    assert choice.chosen == 2 and choice.median(2) == 0.006


def test_the_choice_is_measured_again_after_enough_runs_and_time() -> None:
    """A daemon's box changes: another process takes a core. After RECHECK_RUNS runs and
    RECHECK_S seconds (both) the runs alternate again, without a warm-up, and a new choice
    holds."""
    now = [100.0]
    choice = ThreadChoice(2, clock=lambda: now[0])
    while choice.chosen is None:
        n = choice.next()
        choice.record(n, 0.010 if n == 1 else 0.004)
    assert choice.chosen == 2 and choice.previous is None
    for _ in range(RECHECK_RUNS):  # enough runs, not yet the time
        assert not choice.record(choice.next(), 0.004)
    now[0] += RECHECK_S / 2
    choice.record(choice.next(), 0.004)
    assert choice.chosen == 2
    now[0] += RECHECK_S / 2
    choice.record(choice.next(), 0.004)
    assert choice.chosen is None and choice.previous == 2
    order = []
    while choice.chosen is None:  # the box is busy now: the second thread costs
        n = choice.next()
        order.append(n)
        choice.record(n, 0.010 if n == 1 else 0.030)
    assert order == [1, 2] * ROUNDS and choice.chosen == 1 and choice.previous == 2
    assert choice.since_choice == 0 and choice.chosen_at == now[0]
    for _ in range(RECHECK_RUNS - 1):  # and the new choice holds as long
        choice.record(choice.next(), 0.010)
    now[0] += 2 * RECHECK_S
    assert choice.chosen == 1
    choice.record(choice.next(), 0.010)
    assert choice.chosen is None and choice.previous == 1


def test_several_threads_slower_than_one_was_are_measured_again_at_once() -> None:
    """Another process takes the core a spinning worker waits on: every parallel region waits
    for it. Once the median of the chosen count's last DRIFT_RUNS runs exceeds one thread's
    measured median, the runs alternate again, long before RECHECK_RUNS and RECHECK_S; stalls
    now and then, or a slowdown that keeps them faster than one thread, do not (a passing
    disturbance must not send a many-core Plan to one thread); nor does one thread slowing."""
    choice = ThreadChoice(2, clock=lambda: 0.0)
    while choice.chosen is None:
        n = choice.next()
        choice.record(n, 0.010 if n == 1 else 0.004)
    assert choice.chosen == 2 and choice.reference == 0.010
    for i in range(4 * DRIFT_RUNS):  # a stall now and then, and runs 2.4x slower than chosen on
        choice.record(choice.next(), 0.040 if i % 4 == 0 else 0.0095)
    for _ in range(DRIFT_RUNS):
        choice.record(choice.next(), 0.004)
    assert choice.chosen == 2
    slow = 0
    while choice.chosen == 2:  # until half the last DRIFT_RUNS runs are slow: their median is
        choice.record(choice.next(), 0.030)
        slow += 1
    assert slow == DRIFT_RUNS // 2 and choice.chosen is None and choice.previous == 2
    order = []
    while choice.chosen is None:
        n = choice.next()
        order.append(n)
        choice.record(n, 0.010 if n == 1 else 0.030)
    assert order == [1, 2] * ROUNDS and choice.chosen == 1
    assert choice.reference is None and len(choice.recent) == 0
    for _ in range(4 * DRIFT_RUNS):  # one thread, slower now too: it holds until the recheck
        choice.record(choice.next(), 0.050)
    assert choice.chosen == 1


def measure(choice: ThreadChoice, one: float, many: float) -> int:
    while choice.chosen is None:
        n = choice.next()
        choice.record(n, one if n == 1 else many)
    return choice.chosen


def runs_until_measuring(choice: ThreadChoice, now: list[float], seconds_a_run: float, one: float) -> int:
    runs = 0
    while choice.chosen is not None:
        now[0] += seconds_a_run
        choice.record(choice.next(), one)
        runs += 1
    return runs


def test_one_thread_chosen_after_a_slowdown_is_measured_again_soon_then_less_often() -> None:
    """The busy process may leave: one thread, chosen after several slowed down, is measured
    again after SOON of RECHECK_RUNS and RECHECK_S, each recheck that keeps it doubling that
    share, and a recheck that goes back to several threads restores the whole."""
    now = [0.0]
    choice = ThreadChoice(2, clock=lambda: now[0])
    assert measure(choice, 0.010, 0.004) == 2
    for _ in range(DRIFT_RUNS):
        choice.record(choice.next(), 0.030)
    assert measure(choice, 0.010, 0.030) == 1 and choice.interval == SOON
    waits = []
    for _ in range(5):  # the process stays: rechecks keep one thread, less and less often
        waits.append(runs_until_measuring(choice, now, 0.001, 0.010))
        assert measure(choice, 0.010, 0.030) == 1
    # by the time bound: SOON x 60 s at 1 ms a run, doubling, up to the whole RECHECK_S
    want = [RECHECK_S * SOON / 0.001 * f for f in (1, 2, 4, 8, 10)]
    assert all(abs(w - x) <= 1 for w, x in zip(waits, want, strict=True)), waits  # (a float clock)
    assert choice.interval == 1.0
    waits_runs = runs_until_measuring(choice, now, 1.0, 0.010)  # slow runs: the run bound holds
    assert waits_runs == RECHECK_RUNS
    assert measure(choice, 0.010, 0.004) == 2 and choice.interval == 1.0  # the process left
    # a recheck on schedule that drops to one thread (no slowdown seen) keeps the whole share
    assert runs_until_measuring(choice, now, 1.0, 0.004) == RECHECK_RUNS
    assert measure(choice, 0.010, 0.030) == 1 and choice.interval == 1.0


def test_one_thread_engines_and_fixed_counts_never_measure() -> None:
    assert ThreadChoice(1).chosen == 1 and ThreadChoice(1).next() == 1
    fixed = ThreadChoice.fixed(8)
    assert fixed.next() == 8 and not fixed.record(8, 1.0) and fixed.runs == 0
    one = ThreadChoice(1)
    for _ in range(RECHECK_RUNS + 1):  # nor measure again, however long they run
        assert not fixed.record(8, 1.0) and not one.record(1, 1.0)
    assert fixed.chosen == 8 and one.chosen == 1


#: one 3x3 convolution large enough (~7 M multiply-adds) for the engine's threads by default
LINE = "Convolution c 1 1 data out 0=64 1=3 4=1 5=1 6=" + str(64 * 32 * 9)
SHAPE = (32, 20, 20)


def big_plan(tmp_path: Path) -> Plan:
    param = tmp_path / "big.param"
    param.write_text(param_text({"data": SHAPE}, [LINE]))
    return Plan(load_model(param, None, {"data": SHAPE}, seed=3))


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs numba's pool of 2 or more threads")
def test_a_plan_launches_its_kernels_on_the_count_it_measures_then_keeps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(threads, "THREADS", 2)
    launched: list[int] = []
    store_call = conv_kernels.Convolution.store_call

    def spy(self: conv_kernels.Convolution, *args: Any) -> KernelCall | None:
        call = store_call(self, *args)  # the call the Plan makes once: its kernel spied on as it runs
        assert call is not None
        run = call.kernel

        def counted(*kernel_args: object) -> None:
            launched.append(numba.get_num_threads())
            run(*kernel_args)

        call.kernel = counted
        return call

    monkeypatch.setattr(conv_kernels.Convolution, "store_call", spy)
    plan = big_plan(tmp_path)
    x = {"data": np.random.default_rng(4).uniform(-1, 1, SHAPE).astype(np.float32)}
    caplog.set_level(logging.INFO, logger="vkserve.devices.cpu.executor")
    outputs = []
    while plan.thread_choice.chosen is None:
        outputs.append(plan.run(x)["out"])
    chosen = plan.thread_choice.chosen
    assert launched == [2] * WARMUP + [1, 2] * ROUNDS
    for _ in range(3):
        outputs.append(plan.run(x)["out"])
    assert launched[-3:] == [chosen] * 3
    assert all(o.tobytes() == outputs[0].tobytes() for o in outputs)  # either count: the same bits
    lines = [r.getMessage() for r in caplog.records if "measured over its first runs" in r.getMessage()]
    assert len(lines) == 1 and f": {chosen} thread" in lines[0]
    assert "CPU Plan of big.param (data [32, 20, 20]; batch 1)" in lines[0]
    # a sibling (another instance, or another batch size) measures for itself
    twin = plan.sibling(batch=2)
    assert twin.thread_choice is not plan.thread_choice and twin.thread_choice.chosen is None
    assert Plan(load_model(tmp_path / "big.param", None, {"data": SHAPE}, seed=3), name="big").name == "big"
    # the engine's count changing (the daemon's [cpu] threads) starts the measuring again
    monkeypatch.setattr(threads, "THREADS", 1)
    launched.clear()
    plan.run(x)
    assert plan.thread_choice.threads == 1 and launched == [1]
