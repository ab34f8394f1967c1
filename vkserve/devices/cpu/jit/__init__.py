"""numba kernels of the CPU engine: bf16 storage (uint16, RNE on store), fp32 accumulation.

Each kernel widens its inputs, computes, applies the fused activations and narrows its results
in one pass over a tile, and splits its work into ``prange`` tasks: an output element is always
computed by one task, in an order fixed by the shape alone (K blocks, taps, k ascending), so
results are the same bits whatever the thread count (``vkserve.devices.cpu.threads``).

Compiled code is cached on disk (``cache=True``) in ``NUMBA_CACHE_DIR``; unset, this package sets
it before numba loads to ``numba/<hash of this package's sources>`` in vkserve's cache folder
(``$CACHE_DIRECTORY``: the systemd unit's CacheDirectory=, else the XDG cache), beside the
pipeline caches, because an installed package's own folder is read-only under the unit
(``vkserve.devices.cpu.kernel_cache`` says why the hash). An explicit ``NUMBA_CACHE_DIR`` wins.
"""

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from vkserve.devices.cpu.kernel_cache import default_numba_dir
from vkserve.devices.errors import JitUnavailable

if "NUMBA_CACHE_DIR" not in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = str(default_numba_dir())

try:
    import numba  # noqa: E402 (after its cache folder is set)
    import numba.core.config  # noqa: E402
except OSError as exc:  # llvmlite's check at numba's import: no writable+executable memory
    raise JitUnavailable(
        f"the CPU engine compiles its kernels at run time and needs writable+executable memory, "
        f"which this process may not allocate ({exc.strerror}); under systemd, a unit with "
        f"MemoryDenyWriteExecute=yes prevents it (the shipped unit does not set it)") from exc

from numba.core.dispatcher import Dispatcher  # noqa: E402 (numba's compiled-function type)

from vkserve.devices.cpu import threads  # noqa: E402
from vkserve.devices.cpu.jit.vectors import SETTINGS as VECTORS  # noqa: E402

# numba leaves LLVM's SLP vectorizer off (NUMBA_SLP_VECTORIZE=0): the GEMM micro kernel's register
# tile is straight-line code that only it turns into SIMD (measured: 4x16 tile 8 -> 117 GFLOP/s on
# one core). An explicit NUMBA_SLP_VECTORIZE wins.
os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")
if VECTORS.features is not None:
    os.environ["NUMBA_CPU_FEATURES"] = VECTORS.features
# The settings go through the environment, and numba reads it again now: its compiler does so
# itself whenever a NUMBA_* variable changed since its last compilation
# (numba.core.config.reload_config), resetting whatever was set on numba.config alone, and code
# compiled after such a reset (no SLP vectorizer) would be cached under the same key as the
# right code (the key holds the signature, the CPU and its features), slowing every later
# process down. The reload also applies NUMBA_CACHE_DIR in a program that imported numba before
# this package (the kernels would otherwise be cached beside the package's sources, where code
# compiled with other settings may lie: measured, a 3x3 Winograd layer 18 ms instead of 1.9 ms
# loaded from there).
numba.core.config.reload_config()

from vkserve.devices.cpu.jit import (  # noqa: E402 (jit.direct.*, jit.implicit.*, ...)
    direct,
    dwblocks,
    dwrows,
    implicit,
    implicit_pairs,
    pinning,
    pooling,
    poolrows,
    winograd,
)
from vkserve.devices.cpu.jit.conv import conv_gemm, depthwise, gemm_row_chunks, gemm_split, geometry, pack_gemm_weights
from vkserve.devices.cpu.jit.epilogue import epilogue_ops, scale_act
from vkserve.devices.cpu.jit.innerproduct import inner_product, pack_rows

__all__ = ["SMALL_WORK", "SMALL_WORK_SPINNING", "VECTORS", "Dispatcher", "KernelCall", "cap_threads", "conv_gemm",
           "depthwise", "direct", "dwblocks", "dwrows", "epilogue_ops", "gemm_row_chunks", "gemm_split", "geometry",
           "implicit", "implicit_pairs", "inner_product", "kernel_threads", "launch", "task_count",
           "pack_gemm_weights", "pack_rows", "pinning", "pooling", "poolrows", "run_threads", "scale_act",
           "small_work", "use_threads", "winograd"]


_pool_started = False


#: engine threads from which idle pool workers spin a while before they sleep (below: they sleep
#: at once), and for how long: libgomp's GOMP_SPINCOUNT, about 100,000 spins a millisecond by its
#: own estimate, so ~0.3 ms: enough to bridge the gaps between one job's kernels, not to keep
#: cores busy between jobs
SPIN_MIN_THREADS = 2
SPIN_COUNT = "30000"


def wait_settings(engine_threads: int, env: Mapping[str, str]) -> dict[str, str]:
    """The OpenMP wait settings the pool starts with, unless ``env`` chooses its own
    (OMP_WAIT_POLICY or GOMP_SPINCOUNT): none then.

    One thread: nothing to wait for (passive). Two or more: idle workers spin ~0.3 ms, then
    sleep. Waking a sleeping worker is what each kernel launch pays otherwise: an empty parallel
    region costs 42 us on 16 threads passive, 7.5 us spinning (16-core Xeon,
    benchmarks/cpu_scaling.py), a wake 68-91 us on the 2-core VM; on that VM (an Intel one with
    AMX, twenty-fourth session) the mobile models on 2 passive threads ran no faster than on one
    (squeezenet 9.9 ms, 1.73x ncnn's bf16 time) and spinning 1.5x faster (6.3-6.6 ms, 1.18x).
    A spinning worker whose core another process takes holds up every parallel region (1.5-8x
    slower runs measured beside a busy process), which the Plan's thread choice answers: it
    measures again at once when its runs take longer than one thread's (``thread_choice.DRIFT_RUNS``), keeping one
    thread while the other core is busy."""
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return {}
    if engine_threads >= SPIN_MIN_THREADS:
        return {"GOMP_SPINCOUNT": SPIN_COUNT}
    return {"OMP_WAIT_POLICY": "PASSIVE"}


def _start_pool() -> None:
    """Start numba's thread pool with ``wait_settings``. They are set only while the pool's
    libgomp starts (it reads them once), so other OpenMP users in the process (ncnn bundles
    its own libgomp) keep theirs."""
    global _pool_started, _small_work
    chosen = wait_settings(threads.THREADS, os.environ)
    os.environ.update(chosen)
    try:
        numba.get_num_threads()  # launches the pool
    finally:
        for name in chosen:
            del os.environ[name]
    _small_work = SMALL_WORK_SPINNING if "GOMP_SPINCOUNT" in chosen else SMALL_WORK
    _pool_started = True


#: multiply-adds (or elements) below which a kernel runs on its calling thread alone: waking
#: the pool costs more than it saves there. Measured on the 2-core VM: the digits example (five
#: kernels of 3-131 k multiply-adds) 73 us a run on one thread, 125-355 us on two, 78 us on two
#: with this rule; mobile models at 2 threads unchanged within the run-to-run noise (+-10 %)
#: at 2^18, while 2^20 cost mobilenet_v2 up to 12 %.
SMALL_WORK = 1 << 18
#: the same where idle workers spin (``wait_settings``): waking them costs ~5-7 us instead of
#: 20-40 (16-core Xeon), and layers of 2^16-2^18 multiply-adds (shufflenet_v2's and the mobile
#: models' 7x7 depthwise layers, 0.2 ms each on one thread) are worth splitting
SMALL_WORK_SPINNING = 1 << 16
_small_work = SMALL_WORK


def small_work() -> int:
    """The threshold ``use_threads`` applies now (``SMALL_WORK`` until the pool has started)."""
    return _small_work


class _ThreadSettings(threading.local):
    """What ``use_threads`` last set on the calling thread (numba's settings are per thread):
    asking numba costs ~5 us a call, and it was asked twice per kernel launch."""

    threads = 0
    chunked = False
    #: at most this many threads for the calling thread's kernels (0: ``threads.THREADS``)
    cap = 0
    #: the largest team of the calling thread whose workers are pinned (``jit.pinning``)
    pinned = 0


_settings = _ThreadSettings()


def cap_threads(n: int) -> None:
    """Run the calling thread's next kernels on at most ``n`` threads (0: no cap): a Plan's
    thread choice (``vkserve.devices.cpu.thread_choice``)."""
    _settings.cap = n


@contextmanager
def run_threads(n: int) -> Iterator[None]:
    """A job's kernels on the calling thread: on at most ``n`` threads (``cap_threads``), the
    calling thread kept meanwhile on the core its team's pinned workers leave it
    (``jit.pinning``). The team is made and pinned first (``use_threads``), while the calling
    thread may still use every core: a thread started inside would inherit the one-core mask
    (measured: a Plan profiled before its first run ran its 2 threads on one core for good)."""
    cap_threads(n)
    try:
        use_threads()
        with pinning.launcher_on_first_core(min(n, threads.THREADS)):
            yield
    finally:
        cap_threads(0)


def kernel_threads() -> int:
    """The threads the calling thread's large kernels run on (``threads.THREADS``, or fewer
    under ``cap_threads``): what a kernel splits its work for (split for 2 threads and run on
    one, four mobile models ran 1.00-1.03x as long as split for one)."""
    return min(threads.THREADS, _settings.cap or threads.THREADS)


def task_count(units: int) -> int:
    """How many contiguous tasks a kernel splits ``units`` independent rows, channels or
    blocks into: four per thread of ``kernel_threads``, never more than there are units."""
    return min(units, 4 * kernel_threads())


def use_threads(work: int = SMALL_WORK) -> None:
    """Run the next kernels on ``threads.THREADS`` threads (one if ``work`` is below
    ``small_work()``), one task at a time (numba's settings are per calling thread; the count is
    capped by the pool numba started: ``NUMBA_NUM_THREADS``, all CPUs by default). The first time
    the calling thread runs more threads than before, its team's workers are pinned to cores of
    their own (``jit.pinning``)."""
    if not _pool_started:
        _start_pool()
    wanted = 1 if work < _small_work else kernel_threads()
    n = max(1, min(wanted, numba.config.NUMBA_NUM_THREADS))
    if _settings.threads != n:
        numba.set_num_threads(n)
        _settings.threads = n
    if n > _settings.pinned and pinning.enabled():
        with _launch_lock:  # a parallel region: one at a time where the layer requires it
            pinning.pin_workers(n)
        _settings.pinned = n
    if not _settings.chunked:
        # tasks are handed out one at a time (dynamic scheduling): tasks differ in size, and a
        # core shared with another process must not hold up the whole kernel
        numba.set_parallel_chunksize(1)
        _settings.chunked = True


_launch_lock = threading.Lock()
_UNLOCKED = nullcontext()
_threadsafe_layer: bool | None = None


def _threadsafe() -> bool:
    """numba's threading layer runs parallel regions from several threads at once (tbb, omp;
    the workqueue fallback aborts the process instead). Unknown until a first region has run."""
    global _threadsafe_layer
    if _threadsafe_layer is None:
        try:
            _threadsafe_layer = numba.threading_layer() != "workqueue"
        except ValueError:  # no parallel region has run yet: the layer is not chosen
            return False
    return _threadsafe_layer


def launch(work: int = SMALL_WORK) -> AbstractContextManager[object]:
    """Around a kernel call of ``work`` multiply-adds (or elements): the thread settings of
    ``use_threads``, and one kernel at a time across the process's threads (Plans run on the
    scheduler's worker threads) unless the threading layer is thread-safe.
    ``with launch(work): kernel(...)``"""
    use_threads(work)
    return _UNLOCKED if _threadsafe() else _launch_lock


class KernelCall:
    """One compiled kernel's call with its arguments, made once: what a Plan repeats for a
    step each run (``kernels.base.Kernel.store_call``). Its arguments are arrays (the step's
    arena views, work buffers, weights) and values fixed at compile time, never values read
    from an input, so a later run's data flows through the same call. Made once, a step costs
    the kernel's call alone, and ``launch`` (the thread settings) where they change: measured
    on the 2-core VM, a 64-value ReLU step 6.5-11 us through ``forward_store`` (its views,
    epilogue and task counts made each run), of which the numba call took 2.5 and ``launch``
    0.85."""

    __slots__ = ("_cap", "_team", "_threads", "args", "kernel", "work")

    def __init__(self, kernel: Callable[..., None], args: tuple[Any, ...], work: int) -> None:
        self.kernel = kernel  # a numba dispatcher
        self.args = args
        self.work = work  # multiply-adds (or elements): one thread below ``jit.small_work``
        # what its last ``launch`` saw and set: the cap, the engine's count, the team's size
        self._cap = -1
        self._threads = 0
        self._team = 0

    def __call__(self) -> None:
        """The kernel, after ``launch`` where it could change anything: a calling thread whose
        team is the one this call's last launch set, under the same cap and engine count (what
        ``use_threads`` decides from, with the work, fixed here, and the threshold, fixed once
        the pool has started), on a thread-safe layer, calls the kernel at once. Measured on
        the Zen 4 VM: a trivial kernel's call 1.0 us through ``launch``, 0.23 alone."""
        s = _settings
        if (s.threads == self._team and s.cap == self._cap and threads.THREADS == self._threads
                and _threadsafe_layer):
            self.kernel(*self.args)
            return
        with launch(self.work):
            self.kernel(*self.args)
        self._cap, self._threads, self._team = s.cap, threads.THREADS, s.threads
