"""Whether a Plan runs on the engine's threads or on one: measured over its first runs.

Every kernel launch on several threads wakes the pool's sleeping workers, and on a 2-core VM a
wake costs 68-91 us (RESULTS.md); a mobile model launches 40-100 kernels, so there 2 threads
ran slower than 1 (mobilenet_v2 15.0 against 10.5 ms) while large models gained 1.4-1.6x. Which
one wins depends on the model, the machine and its load, so it is measured rather than modelled:
a Plan's first runs alternate between one thread and ``threads.THREADS`` (after one warm-up
run, whose first calls load the kernels), ``ROUNDS`` of each, and the Plan then keeps the count
whose median was faster, preferring one thread unless the others save ``MARGIN`` of its time
(a thread left idle serves another job). Outputs do not depend on the thread count (each output
value is computed by one task in a fixed order), so the runs that measure serve as any other.

The machine changes under a long-running daemon (another process takes a core, or leaves one),
so the choice is measured again after ``RECHECK_RUNS`` runs and ``RECHECK_S`` seconds, both: a
few runs at the other count each time; and a choice of several threads at once when the median
of its last ``DRIFT_RUNS`` runs exceeds one thread's measured median: the workers wait for work
spinning (``jit.wait_settings``), and a worker whose core another process takes holds up every
parallel region (measured on the 2-core VM, RESULTS.md, twenty-third and twenty-fourth sessions:
resnet18 on 2 pinned threads 32-47 ms a run beside a busy process against 25.5 on one thread and
17-20 idle). One thread chosen so is measured again sooner (``SOON``), later each time it
holds. Only then: a first rule on the chosen count's own slowdown (1.5x its median) left
Plans on the 16-core Xeon measuring again and again (RESULTS.md, twenty-fourth session).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from collections.abc import Callable

#: measured runs on each thread count before choosing
ROUNDS = 3
#: runs before measuring (the first run of a Plan loads its kernels)
WARMUP = 1
#: several threads are kept only where their median run takes at most this share of one thread's
MARGIN = 0.9
#: a choice is measured again once this many runs and this many seconds have passed since it
RECHECK_RUNS = 500
RECHECK_S = 60.0
#: a choice of several threads is measured again at once where the median of its last
#: DRIFT_RUNS runs took longer than one thread's measured median
DRIFT_RUNS = 8
#: after such a drop to one thread the next recheck comes at this share of RECHECK_RUNS and
#: RECHECK_S (the busy process may be gone soon), the share doubling at each recheck that keeps
#: one thread, back to the whole once a recheck changes the choice
SOON = 0.1


@dataclasses.dataclass
class ThreadChoice:
    """The thread count of one Plan's runs, for an engine of ``threads`` threads."""

    threads: int
    runs: int = 0
    samples: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    chosen: int | None = None
    #: the choice before the one being measured now (None: none yet)
    previous: int | None = None
    #: never measured (``fixed``, or an engine of one thread)
    fixed_count: bool = False
    #: runs since the choice, and when it was made (``clock``)
    since_choice: int = 0
    chosen_at: float = 0.0
    #: one thread's median when several were chosen (else none), and the chosen count's latest
    #: runs since (at most DRIFT_RUNS)
    reference: float | None = None
    recent: collections.deque[float] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=DRIFT_RUNS))
    #: the share of RECHECK_RUNS and RECHECK_S the next recheck waits for, and whether the
    #: measurement under way was started by the chosen count slowing down (``slowed``)
    interval: float = 1.0
    after_slowdown: bool = False
    clock: Callable[[], float] = dataclasses.field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        if self.threads <= 1:
            self.chosen, self.fixed_count = 1, True

    @classmethod
    def fixed(cls, threads: int) -> ThreadChoice:
        """Always ``threads``, never measured (a benchmark of a given thread count)."""
        return cls(threads, chosen=threads, fixed_count=True)

    def next(self) -> int:
        """Threads for the next run: the chosen count, else the turn of the measurement."""
        if self.chosen is not None:
            return self.chosen
        if self.runs < WARMUP:
            return self.threads
        return 1 if (self.runs - WARMUP) % 2 == 0 else self.threads

    def record(self, threads: int, seconds: float) -> bool:
        """A run on ``threads`` took ``seconds``; True when this run made the choice."""
        if self.fixed_count:
            return False
        if self.chosen is not None:
            self.since_choice += 1
            if self.reference is not None:
                self.recent.append(seconds)
            slowed = self.slowed()
            if slowed or (self.since_choice >= RECHECK_RUNS * self.interval
                          and self.clock() - self.chosen_at >= RECHECK_S * self.interval):
                # measure again (the kernels are loaded: no warm-up)
                self.previous, self.chosen, self.samples, self.runs = self.chosen, None, {}, WARMUP
                self.after_slowdown = slowed
            return False
        self.runs += 1
        if self.runs <= WARMUP:
            return False
        self.samples.setdefault(threads, []).append(seconds)
        if min(len(self.samples.get(1, ())), len(self.samples.get(self.threads, ()))) < ROUNDS:
            return False
        one, many = self.median(1), self.median(self.threads)
        self.chosen = self.threads if many <= MARGIN * one else 1
        self.since_choice, self.chosen_at = 0, self.clock()
        if self.after_slowdown and self.chosen == 1:
            self.interval = SOON
        elif self.chosen == self.previous:
            self.interval = min(1.0, 2 * self.interval)
        else:
            self.interval = 1.0
        self.after_slowdown = False
        self.reference = one if self.chosen > 1 else None
        self.recent.clear()
        return True

    def slowed(self) -> bool:
        """Whether several threads were chosen and their latest DRIFT_RUNS runs took, by their
        median, longer than one thread's runs did when they were chosen."""
        return (self.reference is not None and len(self.recent) == DRIFT_RUNS
                and statistics.median(self.recent) > self.reference)

    def median(self, threads: int) -> float:
        """Median seconds of the measured runs on ``threads``."""
        return statistics.median(self.samples[threads])
