"""The one seam between the scheduler and the execution engines.

An *executor* is one Plan instance's worth of capacity: ``run_batch(items, between_waits)``
blocks (the scheduler calls it in a worker thread, one job per executor at a time). The scheduler asks
for as many executors per (model, device) as the device has slots:

- CPU: one ``vkserve.devices.cpu.executor.Plan`` each (a CPU Plan is not re-entrant), the
  first built and the others its siblings (own arenas, the packed weights shared);
- Vulkan: one ``vkserve.devices.vulkan.engine.plan.Plan`` with ``max_instances`` = slots, shared by
  that many thin executors (the Plan hands each run its own PlanInstance: arena, staging,
  recorded command buffer, fence). Fence waits call the caller's ``between_waits`` between
  slices (it raises when the scheduler stops), so stopping never hangs on a stuck GPU.

Everything the scheduler knows about the engines lives here (``load_executors``,
``close_executor``, ``is_device_fault``), so changing how an engine is called means editing
this file only. Without the Vulkan engine (or without Vulkan) only the CPU is used.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import trio

from vkserve.devices.capabilities import Precision
from vkserve.devices.cpu.executor import Plan as CpuPlan
from vkserve.devices.cpu.jit.residency import release_compiler_pages
from vkserve.devices.cpu.warm import WarmReport, kernels_cached
from vkserve.devices.output_room import OutputRoom
from vkserve.devices.progress import ProgressFn
from vkserve.devices.timing import StageTimes
from vkserve.devices.vulkan.errors import VulkanError
from vkserve.models.graph import Graph
from vkserve.scheduler.devices import DeviceHandle
from vkserve.scheduler.registry import ModelSpec

log = logging.getLogger(__name__)

__all__ = ["BatchRun", "Executor", "after_warm_up", "close_executor", "is_device_fault", "load_executors",
           "prepare_device", "vulkan_engine_available"]


@dataclasses.dataclass(frozen=True)
class BatchRun:
    """One execution's outputs (per item) and where its time went."""

    outputs: list[dict[str, np.ndarray]]
    stages: StageTimes


class Executor(Protocol):
    def run_batch(self, batch: Sequence[Mapping[str, np.ndarray]], between_waits: Callable[[], None],
                  rooms: Sequence[OutputRoom | None]) -> BatchRun:
        """Run the items (one or more) as one execution (blocking; a worker thread);
        ``between_waits`` runs between the slices of blocking waits and may raise to abandon;
        an item's outputs are written into its room where it has one."""
        ...

    def close(self) -> None: ...


#: arena bytes a CPU Plan instance may take to run a whole batch in one execution; a model
#: whose batch would need more runs its items in executions of fewer. Such models run
#: tens of milliseconds an item, against the ~0.1 ms a batched execution saves per item.
CPU_BATCH_ARENA_BYTES = 16 << 20


def cpu_batch_size(plan: CpuPlan, max_batch_size: int) -> int:
    """Items a CPU Plan of ``plan``'s graph runs in one execution: up to the model's
    ``max_batch_size`` within ``CPU_BATCH_ARENA_BYTES`` of arena; 1 for graphs with
    data-dependent outputs."""
    if not plan.batchable:
        return 1
    return max(1, min(max_batch_size, CPU_BATCH_ARENA_BYTES // max(plan.arena_bytes, 1)))


class _CpuExecutor:
    """One CPU Plan, built for up to ``plan.batch`` items per execution: a batch runs in
    executions of that many (element-wise layers once over the items, the others item by
    item in the same pass, the run's fixed costs paid once)."""

    def __init__(self, plan: CpuPlan) -> None:
        self.plan = plan

    def run_batch(self, batch: Sequence[Mapping[str, np.ndarray]], between_waits: Callable[[], None],
                  rooms: Sequence[OutputRoom | None]) -> BatchRun:
        size = self.plan.batch
        runs = [self.plan.run_batch_timed(batch[i:i + size], rooms[i:i + size])
                for i in range(0, len(batch), size)]
        stages = [s for _, s in runs]
        return BatchRun([outputs for chunk, _ in runs for outputs in chunk],
                        StageTimes(sum(s.copy_in for s in stages), sum(s.run for s in stages),
                                   sum(s.copy_out for s in stages)))

    def close(self) -> None:
        """Nothing to free: the Plan's arrays go with the executor."""


def _vulkan_plan_class() -> Any:
    try:
        from vkserve.devices.vulkan.engine.plan import Plan  # noqa: PLC0415 (optional engine)
    except (ImportError, OSError) as exc:
        log.debug("Vulkan engine unavailable: %s", exc)
        return None
    return Plan


def vulkan_engine_available() -> bool:
    """True when the Vulkan engine can compile Plans; without it GPUs are not used."""
    return _vulkan_plan_class() is not None


class _VulkanExecutor:
    """One of the slots of a shared Vulkan Plan (the Plan picks the instance per run)."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan

    def run_batch(self, batch: Sequence[Mapping[str, np.ndarray]], between_waits: Callable[[], None],
                  rooms: Sequence[OutputRoom | None]) -> BatchRun:
        """The batch in one submission (a Plan instance of that batch size, made on first use)."""
        outputs, stages = self.plan.run_batch_timed(batch, between_waits=between_waits, rooms=rooms)
        return BatchRun(outputs, stages)

    def close(self) -> None:
        self.plan.close()  # idempotent: the first executor of the Plan frees it


def vulkan_precision(device: DeviceHandle, name: str) -> Precision:
    """Config precision -> engine precision. ``auto``: fp16 where the device stores it
    (ncnn's default; halves memory traffic), else fp32."""
    from vkserve.devices.vulkan.engine.plan import engine_precision  # noqa: PLC0415

    if name == "auto":
        name = "fp16" if device.caps.fp16_storage else "fp32"
    if name in ("fp32", "fp16"):
        return engine_precision(device.caps, name)
    return Precision(name)


async def prepare_device(device: DeviceHandle) -> str | None:
    """What ``device`` needs once before its first Plan, described for the log (None:
    nothing). The CPU: every kernel compiled for this machine into numba's cache, so that no
    model's load compiles one. Where the cache lacks them (a first start), a child process
    compiles them (``compile_kernels_apart``): minutes of numba's compiler inside the daemon
    would hold the GIL against the event loop (measured on an H200: mobilenet at 48 in flight
    served 2,064 req/s while they compiled in a thread, 4,589 with them cached). The daemon
    loads none of them here: each model's load (its warm-up runs) loads those it runs, 0.3 s
    for a mobile model, and the daemon holds 31 MiB less than with every kernel loaded
    (``after_warm_up``; measured on the 2-core VM: shufflenet_v2 130 -> 99.5 MiB); its peak
    is 18 MiB lower for the import's LLVM pages let go here (166 -> 148 MiB)."""
    if not device.is_cpu:
        return None
    if kernels_cached():
        said = (f"CPU kernels ready: compiled for this machine, in numba's cache "
                f"({os.environ.get('NUMBA_CACHE_DIR', '')}); each model loads those it runs")
    else:
        log.info("CPU kernels: not in numba's cache for this machine: compiling them in a child "
                 "process (a first start: ~65 kernels, about 3 minutes on a 2-core box)")
        compiled = await compile_kernels_apart()
        said = f"{compiled.describe()}, in a child process; each model loads those it runs"
    # the pages of LLVM's library that importing numba read: out of the resident set until a
    # model's load reads some again (a daemon serving from GPUs alone never does)
    await trio.to_thread.run_sync(release_compiler_pages)
    return said


def after_warm_up(device: DeviceHandle) -> None:
    """Once a model's Plans on ``device`` have run their warm-up: for the CPU, the JIT
    compiler's pages that loading its kernels from numba's cache read leave the resident set
    (``jit.residency``; running the kernels reads none of them)."""
    if device.is_cpu:
        release_compiler_pages()


async def compile_kernels_apart() -> WarmReport:
    """``compile_kernels`` in a child process (``vkserve.devices.cpu.compile_child``: killed if
    this is cancelled, so a stop does not wait for it, and when the daemon dies); its report.
    RuntimeError naming its exit status and last words when it fails."""
    command = [sys.executable, "-m", "vkserve.devices.cpu.compile_child", str(os.getpid())]
    done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"compiling the CPU kernels in a child process failed (exit status "
                           f"{done.returncode}): " + (" / ".join(last) or "no message"))
    return WarmReport.from_json(json.loads(done.stdout))


def load_executors(device: DeviceHandle, graph: Graph, spec: ModelSpec,
                   count: int, progress: ProgressFn | None = None) -> list[Executor]:
    """Compile ``count`` slots of ``graph`` (built for one set of input shapes) for
    ``device`` (blocking; worker thread); ``progress`` hears of each Vulkan pipeline built."""
    if device.is_cpu:  # one Plan's weights, an arena (for a batch) per instance
        single = CpuPlan(graph, name=spec.name)
        batch = cpu_batch_size(single, spec.max_batch_size)
        first = single.sibling(batch=batch) if batch > 1 else single
        return [_CpuExecutor(first), *(_CpuExecutor(first.sibling()) for _ in range(count - 1))]
    plan_class = _vulkan_plan_class()
    if plan_class is None:
        raise RuntimeError(f"device {device.index} ({device.name}): no Vulkan engine available")
    plan = plan_class(device.vulkan_device(), graph,
                      precision=vulkan_precision(device, spec.precision), max_instances=count,
                      progress=progress)
    return [_VulkanExecutor(plan) for _ in range(count)]


def executors_nbytes(executors: list[Executor]) -> int:
    """Memory the executors' Plans hold at most: a Vulkan Plan's weights plus an arena and
    staging per instance (from the device pool); a CPU Plan's arena and bf16 weights."""
    total = 0
    cpu_weights: dict[int, int] = {}  # a CPU Plan's siblings share its weights
    for plan in {id(p): p for p in (_plan_of(e) for e in executors)}.values():
        if isinstance(plan, CpuPlan):
            total += plan.arena_bytes
            cpu_weights[plan.weights_id] = plan.weight_bytes
        else:
            total += plan.weight_bytes + plan.max_instances * (plan.arena_bytes + plan.staging_bytes)
    return total + sum(cpu_weights.values())


def _plan_of(executor: Executor) -> Any:
    assert isinstance(executor, (_CpuExecutor, _VulkanExecutor))
    return executor.plan


def close_executor(executor: Executor) -> None:
    """Free an executor's device memory (Vulkan plans close; CPU plans are garbage)."""
    executor.close()


def is_device_fault(exc: BaseException) -> bool:
    """Does ``exc`` mean the device itself is gone (so its jobs must move elsewhere)?

    A lost Vulkan device, or any exception an engine flags with ``device_fault = True``.
    Other errors (bugs, out-of-memory for one job) fail the job and leave the device healthy.
    """
    if isinstance(exc, VulkanError) and exc.device_lost:
        return True
    return bool(getattr(exc, "device_fault", False))
