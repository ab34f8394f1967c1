"""A small persistent thread pool for splitting numpy passes over the engine's cores.

numpy releases the GIL inside its ufunc loops and copies, so one large pass split into row
chunks can run on several cores at once. Used by the RNE narrowing, large widenings and the
depthwise convolution (split by channels). Work below ``MIN_SPLIT`` elements runs inline:
handing a chunk to a thread costs ~10-30 us.

Off by default (``VKSERVE_CPU_THREADS`` unset = 1 thread outside BLAS): measured on the
2-core development VM with OpenBLAS at 2 threads, the split made isolated passes 1.3-2x
faster (a 144x56x56 depthwise layer 1.9 -> 0.9 ms, narrowing 3.2M values 3.0 -> 1.8 ms) but
whole models 0-6 % *slower* (mobilenet, mobilenet_v2, efficientnet_b0, shufflenet_v2;
alternating runs in one process): OpenBLAS's idle worker spins on the second core after every
GEMM, so a numpy thread started right after one competes with it for the core. Set
``VKSERVE_CPU_THREADS=N`` where cores are not that scarce (or with
``OPENBLAS_THREAD_TIMEOUT=4``, which made the split a 0-7 % gain here).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

#: elements (fp32 values) below which a pass is not split (measured: splitting the RNE
#: narrowing over 2 threads pays off from about 400K values on this machine; below, it loses)
MIN_SPLIT = 256 * 1024


def _thread_count() -> int:
    v = os.environ.get("VKSERVE_CPU_THREADS", "").strip()
    return int(v) if v.isdigit() and int(v) > 0 else 1


THREADS = _thread_count()
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
