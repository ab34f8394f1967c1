"""One long-lived worker thread per device slot: where batches run.

A run used to be a task in the device's nursery calling ``trio.to_thread.run_sync``: per run
a task spawned, a thread taken from trio's cache and a task woken when it ended, each a round
of the event loop. Measured on the daemon's sequential path (digits, cProfile of the loop,
2-core box): 8 loop rounds per request, and the run hand-off the largest share of the loop's
own work after framing. Here the loop hands a run to the device's threads with one queue put
and the thread delivers the outcome with one ``run_sync_soon``: the callback finishes the
jobs in the loop directly, with no task between (the scheduler's ``_run_done``).

Ownership stays structured: the threads start with the scheduler's device and ``stop`` ends
and joins them (the scheduler awaits it before freeing any Plan), so no run outlives the
scheduler. A run cannot be interrupted mid-kernel; its blocking waits (a Vulkan fence, a
paused test device) poll ``check_stopped``, which raises :class:`Stopped` once ``stop`` began.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import outcome
import trio

__all__ = ["SlotThreads", "Stopped"]

log = logging.getLogger(__name__)

T = TypeVar("T")


_Inbox = queue.SimpleQueue[tuple[Callable[[], T], Callable[[outcome.Outcome[T]], None]] | None]


class Stopped(Exception):
    """The scheduler is stopping: a run abandoned its wait (its jobs already ended)."""


class SlotThreads(Generic[T]):
    """``count`` threads running submitted work in order of submission; each outcome goes
    back to the trio loop that created this (``done(outcome)`` runs there)."""

    def __init__(self, name: str, count: int) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stopping = threading.Event()
        self._inboxes: list[_Inbox[T]] = [queue.SimpleQueue() for _ in range(count)]
        # idle threads' inboxes, the most recently idle last: a run goes to the thread that
        # ran the previous one, whose caches and OpenMP team (the CPU kernels') are warm;
        # alternating threads measured ~40 % slower CPU runs of a small model
        self._idle = list(reversed(self._inboxes))
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._serve, args=(inbox,), daemon=True,
                                          name=f"vkserve-run {name} #{i}")
                         for i, inbox in enumerate(self._inboxes)]
        for thread in self._threads:
            thread.start()

    def submit(self, work: Callable[[], T], done: Callable[[outcome.Outcome[T]], None]) -> None:
        """Run ``work()`` on an idle thread; then ``done`` gets its outcome on the loop.
        Never blocks. The scheduler never has more runs in flight than threads (a thread is
        idle again before its outcome reaches the loop)."""
        with self._lock:
            if not self._idle:
                raise RuntimeError(f"more runs than the {len(self._threads)} run threads")
            inbox = self._idle.pop()
        inbox.put((work, done))

    def check_stopped(self) -> None:
        """Between a run's blocking waits: raise :class:`Stopped` once ``stop`` began."""
        if self._stopping.is_set():
            raise Stopped("the scheduler is stopping")

    async def stop(self) -> None:
        """End the threads after their current runs (whose waits now raise ``Stopped``) and
        join them; outcomes that arrive meanwhile are still delivered."""
        self._stopping.set()
        for inbox in self._inboxes:
            inbox.put(None)
        await trio.to_thread.run_sync(self._join)

    def _join(self) -> None:
        for thread in self._threads:
            thread.join()

    def _serve(self, inbox: _Inbox[T]) -> None:
        while (item := inbox.get()) is not None:
            work, done = item
            result = outcome.capture(work)
            with self._lock:
                self._idle.append(inbox)
            try:
                self._token.run_sync_soon(done, result)
            except trio.RunFinishedError:  # the loop ended under a run: nobody to tell
                log.warning("a run ended after the scheduler's event loop: outcome dropped")
