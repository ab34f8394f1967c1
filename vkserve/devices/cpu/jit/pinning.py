"""Each worker of a launching thread's OpenMP team pinned to a core of its own.

The pool's idle workers sleep (``wait_settings``: at once on one thread, after ~0.3 ms of
spinning on more), so a kernel launched after a pause wakes them, and Linux places a woken
thread by its wake-affine rule: after an idle pause
it put the worker on the core of the thread that woke it, which was busy running its own share
of the kernel, and moved it away only tens of milliseconds later. Measured on the 2-core VM
(RESULTS.md, "the second thread after an idle pause"): a 3x3 layer on 2 threads 3.0 ms back to
back, 5.5 ms (one thread's time) for the ~11 runs after a 0.5 s pause. So each worker is pinned
once, from inside a parallel region of the team it belongs to, to one of the cores the process
may use from the second on, and the launching thread (a scheduler thread, Python's) is kept on
the first only while it runs a job's kernels (``launcher_on_first_core``), free otherwise.
(libgomp's own ``OMP_PROC_BIND`` pins the launching thread for good, and every thread started
after it inherits that mask: the whole daemon would share one core.)

``VKSERVE_CPU_PIN=0`` leaves the workers free (a box whose cores other processes keep busy:
a pinned worker cannot move off a busy core).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import numpy as np
from numba import get_thread_id, njit, prange, types

__all__ = ["ENV_VAR", "enabled", "launcher_on_first_core", "pin_workers", "worker_cores"]

ENV_VAR = "VKSERVE_CPU_PIN"

log = logging.getLogger(__name__)

# libc's, resolved by name when the kernel loads (so numba can cache it; a ctypes pointer would
# be baked into the code). The mask pointer is passed as an address-sized integer.
_setaffinity = types.ExternalFunction("sched_setaffinity", types.int32(types.int32, types.uintp, types.uintp))
_usleep = types.ExternalFunction("usleep", types.int32(types.uint32))

#: 64-bit words of a cpu_set_t (1024 CPUs)
MASK_WORDS = 16
#: each task's pause (us): long enough that every worker of the team takes a task of its own
PAUSE_US = 2000


@njit(parallel=True, cache=True)
def _pin(masks, tasks, done):  # noqa: ANN001
    """Task i: the thread running it (a worker, not the launching thread 0) pins itself to
    ``masks[id - 1]`` and records ``done[id]``; then pauses, so that the other threads take
    the remaining tasks."""
    for i in prange(tasks):
        tid = get_thread_id()
        if tid > 0 and done[tid] == 0:
            done[tid] = 1 if _setaffinity(0, masks.shape[1] * 8, masks[tid - 1].ctypes.data) == 0 else -1
        _usleep(PAUSE_US)


def worker_cores(cores: list[int], workers: int) -> list[int]:
    """The core of each of ``workers`` workers: the process's cores in order from the second
    (the first is the launching thread's while it runs kernels: ``launcher_on_first_core``),
    round the list again past its end."""
    return [cores[(1 + i) % len(cores)] for i in range(workers)]


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip() != "0"


def pin_workers(threads: int) -> None:
    """Pin the workers of the calling thread's team of ``threads`` (numba's thread count must
    already be ``threads``): worker k to ``worker_cores``' k-th core. The team's threads persist
    (libgomp keeps a pool per launching thread), so once per launching thread and count."""
    cores = sorted(os.sched_getaffinity(0))
    if threads <= 1 or len(cores) < 2:
        return
    masks = np.zeros((threads - 1, MASK_WORDS), dtype=np.uint64)
    for w, core in enumerate(worker_cores(cores, threads - 1)):
        masks[w, core // 64] |= np.uint64(1) << np.uint64(core % 64)
    done = np.zeros(threads, dtype=np.int64)
    _pin(masks, 4 * threads, done)
    missed = int(np.count_nonzero(done[1:] != 1))
    if missed:  # refused (a cgroup's cpuset), or a worker took no task: it stays free
        log.warning("CPU threads: %d of %d workers not pinned to a core (%d refused by the system); "
                    "they run unpinned", missed, threads - 1, int(np.count_nonzero(done[1:] == -1)))


@contextlib.contextmanager
def launcher_on_first_core(threads: int) -> Iterator[None]:
    """While the calling thread runs a job's kernels on ``threads`` threads, keep it on the
    first of its cores, the one no worker of its team is pinned to; its own mask is restored
    after. Pinned workers alone were not enough (measured: 6-7 ms after a 0.5 s pause, as
    unpinned): the launching thread, woken from its own sleep, was placed on a worker's core."""
    if threads <= 1 or not enabled():
        yield
        return
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        yield
        return
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
