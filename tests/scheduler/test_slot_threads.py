"""SlotThreads: runs on long-lived threads, outcomes back on the trio loop, a prompt stop."""

from __future__ import annotations

import threading
import time

import outcome
import pytest
import trio

from vkserve.scheduler.slot_threads import SlotThreads, Stopped


async def test_outcomes_come_back_on_the_loop_thread_in_their_own_callback() -> None:
    threads: SlotThreads[int] = SlotThreads("test", 2)
    loop_thread = threading.get_ident()
    got: dict[int, tuple[outcome.Outcome[int], int, str]] = {}
    done = trio.Event()

    def deliver(key: int, result: outcome.Outcome[int]) -> None:
        got[key] = (result, threading.get_ident(), trio.lowlevel.current_task().name)
        if len(got) == 3:
            done.set()

    def work(value: int) -> int:
        if value < 0:
            raise ValueError(f"bad value {value}")
        return threading.get_ident()

    for key in (1, -3):
        threads.submit(lambda k=key: work(k), lambda r, k=key: deliver(k, r))
    with pytest.raises(RuntimeError, match="more runs than the 2 run threads"):
        threads.submit(lambda: work(9), lambda r: deliver(9, r))  # a scheduler bug: loud
    with trio.fail_after(10):
        while len(got) < 2:
            await trio.sleep(0.001)
    threads.submit(lambda: work(2), lambda r: deliver(2, r))  # a thread is idle again
    with trio.fail_after(10):
        await done.wait()
    await threads.stop()

    for key in (1, 2):
        result, where, _ = got[key]
        assert where == loop_thread  # the callback ran on the loop ...
        assert result.unwrap() != loop_thread  # ... the work did not
    with pytest.raises(ValueError, match="bad value -3"):
        got[-3][0].unwrap()


async def test_each_slot_is_its_own_thread_so_two_runs_overlap() -> None:
    threads: SlotThreads[None] = SlotThreads("test", 2)
    both = threading.Barrier(2, timeout=10)  # only passes if both runs are in flight at once
    finished: list[outcome.Outcome[None]] = []
    done = trio.Event()

    def deliver(result: outcome.Outcome[None]) -> None:
        finished.append(result)
        if len(finished) == 2:
            done.set()

    for _ in range(2):
        threads.submit(lambda: (both.wait(), None)[1], deliver)
    with trio.fail_after(15):
        await done.wait()
    await threads.stop()
    assert [r.unwrap() for r in finished] == [None, None]


async def test_stop_ends_a_blocked_run_through_check_stopped_and_joins() -> None:
    threads: SlotThreads[str] = SlotThreads("test", 1)
    started = threading.Event()
    results: list[outcome.Outcome[str]] = []

    def stuck() -> str:
        started.set()
        while True:  # a fence wait on a hung GPU: slices with a check in between
            time.sleep(0.01)
            threads.check_stopped()

    threads.submit(stuck, results.append)
    await trio.to_thread.run_sync(started.wait)
    with trio.fail_after(10):
        await threads.stop()  # returns only once the thread has ended
    await trio.testing.wait_all_tasks_blocked()
    assert len(results) == 1
    with pytest.raises(Stopped):
        results[0].unwrap()


async def test_sequential_runs_stay_on_one_thread() -> None:
    """The most recently idle thread takes the next run (its caches and OpenMP team warm)."""
    threads: SlotThreads[int] = SlotThreads("test", 4)
    used: list[int] = []
    for _ in range(20):
        ended = trio.Event()

        def deliver(result: outcome.Outcome[int], ended: trio.Event = ended) -> None:
            used.append(result.unwrap())
            ended.set()

        threads.submit(threading.get_ident, deliver)
        with trio.fail_after(10):
            await ended.wait()
    await threads.stop()
    assert len(set(used)) == 1
