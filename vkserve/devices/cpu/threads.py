"""The CPU engine's thread count, and a small persistent pool for splitting numpy passes.

``THREADS`` is the daemon config's ``[cpu] threads`` where set (``configure``), else
``VKSERVE_CPU_THREADS=N``, else the number of cores this process may use (its affinity mask,
capped by a cgroup v2 ``cpu.max`` quota): ``resolve``. The numba kernels
(``vkserve.devices.cpu.jit``) run on that many threads, and numpy passes (the RNE narrowing,
large widenings) are split over the pool below. Convolution, InnerProduct, the Linear form of
Gemm, MatMul and MultiHeadAttention do not call BLAS; the layers that still do (Gemm's other
forms, Deconvolution) use numpy's BLAS pool, sized by ``OPENBLAS_NUM_THREADS`` /
``OMP_NUM_THREADS`` before numpy loads.

numpy releases the GIL inside its ufunc loops and copies, so one large pass split into row
chunks can run on several cores at once. Work below ``MIN_SPLIT`` elements runs inline:
handing a chunk to a thread costs ~10-30 us. (Measured on the 2-core development VM before the
numba kernels: with OpenBLAS at 2 threads the split made whole models 0-6 % slower, since
OpenBLAS's idle worker spins on the second core after every GEMM; the convolutions no longer
run through BLAS.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

#: elements (fp32 values) below which a pass is not split (measured: splitting the RNE
#: narrowing over 2 threads pays off from about 400K values on this machine; below, it loses)
MIN_SPLIT = 256 * 1024


#: the cgroup v2 hierarchy, and this process's place in it ("0::<path>" in /proc/self/cgroup)
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def _cgroup_quota() -> int | None:
    """Whole cores allowed by the cgroup v2 ``cpu.max`` limits of this process's cgroup and its
    ancestors (the smallest; at least one), or None where none is set or readable."""
    try:
        rel = next((line[3:].strip() for line in PROC_CGROUP.read_text().splitlines()
                    if line.startswith("0::")), "/")
    except OSError:
        rel = "/"
    group = CGROUP_ROOT / rel.lstrip("/")
    best: int | None = None
    for d in [group, *group.parents]:
        try:
            quota, period = (d / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            quota = "max"
        if quota != "max":
            cores = max(1, int(quota) // int(period))
            best = cores if best is None else min(best, cores)
        if d == CGROUP_ROOT:
            break
    return best


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by the cgroup v2 quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, n if quota is None else min(n, quota))


#: the environment variable that sets the count where the daemon's config does not
ENV_VAR = "VKSERVE_CPU_THREADS"


def resolve(configured: int = 0, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """The engine's thread count and where it came from: ``configured`` (the daemon config's
    ``[cpu] threads``) when > 0, else ``$VKSERVE_CPU_THREADS`` when set to a positive integer,
    else ``available_cores()``. The one place that decides it."""
    if configured > 0:
        return configured, "cpu.threads"
    raw = (os.environ if env is None else env).get(ENV_VAR, "").strip()
    if raw:
        if raw.isdigit() and int(raw) > 0:
            return int(raw), ENV_VAR
        log.warning("%s=%r is not a positive integer: ignored, using the cores this process may use",
                    ENV_VAR, raw)
    return available_cores(), "the cores this process may use (affinity, cgroup quota)"


def configure(configured: int) -> str:
    """Set ``THREADS`` from the daemon config's ``[cpu] threads`` (0: see ``resolve``) before the
    first job; returns a line saying the count and its source."""
    global THREADS, _pool
    THREADS, source = resolve(configured)
    if _pool is not None:  # sized for the old count
        _pool.shutdown(wait=False)
        _pool = None
    return f"CPU engine: {THREADS} thread{'s' if THREADS != 1 else ''} ({source})"


THREADS = resolve()[0]
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0


def _get_pool() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid():  # a forked child gets its own
        _pool = ThreadPoolExecutor(max_workers=THREADS - 1, thread_name_prefix="vkserve-cpu")
        _pool_pid = os.getpid()
    return _pool


def split(n: int, work: int, threads: int | None = None) -> list[tuple[int, int]]:
    """``[lo, hi)`` pieces of ``range(n)``: one per thread when ``work`` (elements) is large
    enough to pay for the hand-off, else the whole range."""
    t = THREADS if threads is None else threads
    t = min(t, n, max(1, work // MIN_SPLIT))
    if t <= 1:
        return [(0, n)]
    step = -(-n // t)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def run_chunks(fn: Callable[[int, int, int], object], pieces: list[tuple[int, int]]) -> None:
    """Run ``fn(index, lo, hi)`` for every piece: the first on this thread, the rest on the
    pool; returns when all are done (exceptions propagate)."""
    if len(pieces) == 1:
        lo, hi = pieces[0]
        fn(0, lo, hi)
        return
    pool = _get_pool()
    futures = [pool.submit(fn, i, lo, hi) for i, (lo, hi) in enumerate(pieces[1:], 1)]
    try:
        fn(0, *pieces[0])
    finally:
        for f in futures:
            f.result()


def parallel(fn: Callable[[int, int, int], object], n: int, work: int) -> None:
    """Split ``range(n)`` (rows) by ``work`` (total elements) and run ``fn(i, lo, hi)``."""
    run_chunks(fn, split(n, work))
