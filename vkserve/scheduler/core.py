"""The Scheduler: admission, priority queues, placement, device workers, failover.

Shape of the machinery (DESIGN §2/§3, issue 6 part 3):

- **Admission**: ``infer`` validates the inputs and appends the job to its model's queue, or
  raises ``Overloaded`` at once when that queue already holds ``queue_limit`` jobs.
- **Late binding**: a job stays in its model queue until a device slot can take it; only then
  is its device chosen. Priorities keep working while jobs wait, and a device that frees up
  early takes work immediately (Triton's pull model) instead of jobs sitting behind a slow one.
- **Placement**: ``_dispatch`` walks all queued jobs in priority order (higher first, FIFO
  within a level) and gives each the device where it would *finish* soonest: the earliest time
  one of that device's slots frees (now, or when a running job is expected to end) plus the
  EWMA latency of that model on that device. If that device has a free slot the job starts;
  otherwise the job reserves that slot in the simulation (so later jobs see the device as
  busier) and keeps waiting. The reservations are the per-device ``queue_depth`` in
  ``status()``.
- **Workers**: each device has a nursery (its worker) that owns the tasks of its running jobs;
  each job runs in ``trio.to_thread.run_sync`` under the device's CapacityLimiter, on one of
  the model's Plan instances on that device (one instance per slot; Plans are not re-entrant).
- **Deadlines** are absolute and end to end: the caller waits under a cancel scope that fires
  at the deadline (so it never gets a late answer), and the dispatcher drops expired jobs at
  dequeue and the worker discards results that arrive after it.
- **Cancellation**: a cancelled caller ends its job; a queued job leaves the queue, a running
  one finishes on the device and its result is discarded.
- **Failover**: a device fault marks the device unhealthy; every job that fails on it goes back
  to the queue (keeping its place) and runs on another healthy device holding the model, or on
  the CPU (loaded on demand when the model allows it) — at most one retry per job.
- Every job ends exactly once (``Job.finish`` is a one-shot gate; see ``vkserve.scheduler.jobs``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import trio

from vkserve.devices.discovery import GpuProblem
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph
from vkserve.scheduler.config import SchedulerConfig
from vkserve.scheduler.devices import DeviceHandle, discover_handles
from vkserve.scheduler.engine import Executor, close_executor, is_device_fault, load_executors, vulkan_engine_available
from vkserve.scheduler.errors import (
    BadInput,
    Cancelled,
    DeadlineExceeded,
    DeviceFailure,
    InternalError,
    ModelNotFound,
    Overloaded,
    SchedulerError,
    Unavailable,
)
from vkserve.scheduler.jobs import InferResult, Job, validate_inputs
from vkserve.scheduler.registry import ModelRepository, ModelSpec
from vkserve.scheduler.reports import (
    DeviceStatus,
    JobTotals,
    ModelInfo,
    ModelQueue,
    ModelState,
    PlacementInfo,
    PlacementState,
    RescanResult,
    SchedulerState,
    Status,
    UnloadResult,
)

log = logging.getLogger(__name__)

__all__ = ["Scheduler"]

_EPS = 1e-6  # seconds; keeps "busy" slot-free times strictly after now
#: States in which admitted jobs are placed and run (closing: draining them).
_WORKING = (SchedulerState.RUNNING, SchedulerState.CLOSING)


@dataclasses.dataclass(eq=False)
class _Placement:
    """One model on one device: its Plan instances, state and measured latency."""

    device: int
    state: PlacementState = PlacementState.LOADING
    error: str | None = None
    executors: list[Executor] = dataclasses.field(default_factory=list)
    free: list[Executor] = dataclasses.field(default_factory=list)
    latency: float | None = None  # EWMA of run seconds
    running: int = 0
    load_seconds: float | None = None
    load_cache: Literal["cold", "warm"] | None = None  # cold: the load compiled GLSL


@dataclasses.dataclass(eq=False)
class _Model:
    spec: ModelSpec
    placements: dict[int, _Placement] = dataclasses.field(default_factory=dict)
    queue: list[Job] = dataclasses.field(default_factory=list)
    running: int = 0
    unloading: bool = False
    error: str | None = None  # why the model as a whole is unusable (bad folder, no device)
    fingerprint: tuple[Any, ...] = ()  # the folder's files when read (rescan: changed?)

    @property
    def name(self) -> str:
        return self.spec.name


@dataclasses.dataclass(eq=False)
class _Device:
    handle: DeviceHandle
    slots: int
    limiter: trio.CapacityLimiter
    nursery: trio.Nursery | None = None
    healthy: bool = True
    fault: str | None = None
    running: dict[int, tuple[float, float]] = dataclasses.field(
        default_factory=dict)  # job id -> (start, expected seconds)
    queue_depth: int = 0  # jobs waiting for this device in the last placement pass
    runs: int = 0
    run_seconds: float = 0.0
    completed: int = 0
    faults: int = 0

    @property
    def index(self) -> int:
        return self.handle.index

    def slot_free_times(self, now: float) -> list[float]:
        """When each slot is expected to free, earliest first. A run past its estimate is
        assumed to need as long again as it has taken so far, so a stuck device looks
        busier the longer it is stuck and waiting jobs drift to other devices."""
        ends = [start + expected if start + expected > now else now + max(now - start, _EPS)
                for start, expected in self.running.values()]
        return sorted([now] * max(0, self.slots - len(ends)) + ends)


def folder_fingerprint(spec: ModelSpec) -> tuple[Any, ...]:
    """Blocking: (name, mtime, size) of the folder's files and the spec itself, so a rescan
    sees edited weights as well as an edited config.toml or graph."""
    files = [spec.param_path, spec.bin_path, spec.path / "config.toml"]
    stats: list[tuple[str, int, int] | None] = []
    for path in files:
        try:
            st = path.stat() if path is not None else None
        except OSError:
            st = None
        stats.append(None if st is None or path is None
                     else (str(path), st.st_mtime_ns, st.st_size))
    return (spec, *stats)


def _scan_with_fingerprints(repository: ModelRepository
                            ) -> dict[str, tuple[ModelSpec, tuple[Any, ...]]]:
    return {name: (spec, folder_fingerprint(spec))
            for name, spec in repository.scan().items()}


def _read_with_fingerprint(repository: ModelRepository, name: str
                           ) -> tuple[ModelSpec, tuple[Any, ...]] | None:
    spec = repository.spec(name)
    return None if spec is None else (spec, folder_fingerprint(spec))


def _run_blocking(handle: DeviceHandle, executor: Executor,
                  inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """Worker thread: one run with the device's test hooks; returns outputs and seconds."""
    handle.wait_gate()
    start = time.perf_counter()
    handle.apply_hooks()
    outputs = executor.run(inputs)
    return outputs, time.perf_counter() - start


def _compile_and_warm(handle: DeviceHandle, graph: Graph, spec: ModelSpec, instances: int,
                      warmup: int) -> tuple[list[Executor], list[float], bool]:
    """Worker thread: compile ``instances`` Plans and run each ``warmup`` times; also
    returns whether GLSL was compiled meanwhile (a cold pipeline cache; a load running
    in parallel on the same device may be counted too).

    Warm-up runs go through the device hooks like jobs do, so an injected delay seeds the
    latency estimate and an injected fault fails the load the way a lost device would.
    """
    executors: list[Executor] = []
    timings: list[float] = []
    rng = np.random.default_rng(spec.seed)
    inputs = {n: rng.standard_normal(s).astype(np.float32) for n, s in spec.inputs.items()}
    compiles = handle.glsl_compiles()
    try:
        executors = load_executors(handle, graph, spec, instances)
        compiled = handle.glsl_compiles() > compiles
        if compiled:
            handle.save_pipeline_cache()  # a crash later still finds this load's pipelines
        for executor in executors:
            for _ in range(warmup):
                timings.append(_run_blocking(handle, executor, inputs)[1])
    except BaseException:
        for executor in executors:
            close_executor(executor)
        raise
    return executors, timings, compiled


class Scheduler:
    """Serves inference jobs on every device; see the module docstring for the design.

    Lifecycle: construct, then ``await nursery.start(scheduler.run)`` (returns once the device
    workers are up; models may still be loading — see ``ready()``), call ``infer`` and the
    control methods from any task, and ``await scheduler.aclose()`` to drain and stop.
    """

    def __init__(self, devices: list[DeviceHandle] | None = None,
                 config: SchedulerConfig | None = None,
                 repository: ModelRepository | None = None, *,
                 gpu_problem: GpuProblem | None = None) -> None:
        """``devices``: None to discover them in ``run``; ``gpu_problem``: what discovery
        said about the given ones (reported in ``status()``)."""
        self.config = config or SchedulerConfig()
        self.repository = repository
        self._handles = list(devices) if devices is not None else None
        self._gpu_problem = gpu_problem
        if self._handles is not None:
            indices = [h.index for h in self._handles]
            if len(set(indices)) != len(indices):
                raise ValueError(f"device indices must be unique, got {indices}")
        self._devices: dict[int, _Device] = {}
        self._models: dict[str, _Model] = {}
        self._jobs: dict[int, Job] = {}
        self._state = SchedulerState.NEW
        self._startup_pending = True
        self._nursery: trio.Nursery | None = None
        self._load_limiter: trio.CapacityLimiter | None = None
        self._changed = trio.Event()
        self._recheck_at = math.inf  # when to re-run placement for jobs held by choice
        self._stop = trio.Event()
        self._stopped = trio.Event()
        self._totals = JobTotals()

    # ------------------------------------------------------------------------------------
    # lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the device workers and model loads until ``aclose`` (or cancellation).

        Discovers devices (when none were given), scans the repository, starts one worker
        per device, calls ``task_status.started()`` and loads every repository model on its
        devices in the background (parallel, warm-up before ready).
        """
        if self._state is not SchedulerState.NEW:
            raise RuntimeError("Scheduler.run can be called only once")
        self._state = SchedulerState.STARTING
        try:
            if self._handles is None:
                use_vulkan = self.config.use_vulkan and vulkan_engine_available()
                discovered, self._gpu_problem = await trio.to_thread.run_sync(
                    lambda: discover_handles(use_vulkan=use_vulkan,
                                             cache_dir=self.config.cache_dir))
                self._handles = discovered
            handles = self._handles
            specs: dict[str, tuple[ModelSpec, tuple[Any, ...]]] = {}
            if self.repository is not None:
                specs = await trio.to_thread.run_sync(_scan_with_fingerprints,
                                                      self.repository)
            self._load_limiter = trio.CapacityLimiter(self.config.load_threads)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for handle in handles:
                    slots = self.config.instances_per_device
                    if handle.is_cpu and self.config.cpu_instances is not None:
                        slots = self.config.cpu_instances
                    device = _Device(handle, slots, trio.CapacityLimiter(slots))
                    self._devices[handle.index] = device
                    await nursery.start(self._device_worker, device)
                startup: list[tuple[_Model, list[_Device]]] = []
                for spec, fingerprint in specs.values():
                    model = _Model(spec, fingerprint=fingerprint)
                    self._models[spec.name] = model
                    if spec.error:
                        model.error = spec.error
                        continue
                    startup.append((model, self._begin_placements(model, None)))
                if self._state is SchedulerState.STARTING:  # aclose() may have come first
                    self._state = SchedulerState.RUNNING
                log.info("scheduler running on %d device(s): %s", len(self._devices),
                         ", ".join(f"{d.index}={d.handle.name}" for d in self._devices.values()))
                task_status.started()
                nursery.start_soon(self._recheck_placement)
                nursery.start_soon(self._startup_loads, startup)
                await self._stop.wait()
                self._state = SchedulerState.STOPPING
                nursery.cancel_scope.cancel()
        finally:
            self._state = SchedulerState.STOPPING
            for job in list(self._jobs.values()):
                self._end(job, error=Unavailable("the scheduler stopped before the job ran"))
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close_everything)
            self._state = SchedulerState.STOPPED
            self._notify()
            self._stopped.set()

    async def aclose(self, timeout: float | None = None) -> None:
        """Drain: refuse new jobs (UNAVAILABLE), let admitted ones finish (up to ``timeout``
        seconds; the rest then end with UNAVAILABLE), stop the workers, free the devices."""
        if self._state is SchedulerState.NEW:
            self._state = SchedulerState.STOPPED
            return
        if self._state in (SchedulerState.STARTING, SchedulerState.RUNNING):
            self._state = SchedulerState.CLOSING
            self._notify()
        with trio.move_on_after(math.inf if timeout is None else timeout):
            await self._wait_for(lambda: not self._jobs)
        self._stop.set()
        await self._stopped.wait()

    def ready(self) -> bool:
        """Serving, start-up loads finished (each model ready or failed) and a device healthy."""
        return (self._state is SchedulerState.RUNNING and not self._startup_pending
                and any(d.healthy for d in self._devices.values()))

    async def _device_worker(self, device: _Device, *,
                             task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The device's worker: a nursery that owns the tasks of the jobs running on it."""
        async with trio.open_nursery() as nursery:
            device.nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def _recheck_placement(self) -> None:
        """Re-run placement when jobs wait for a busy device although another one is free:
        if the busy device does not free up when estimated, they may be better off moving.
        (Every other reason to place jobs is an event that calls ``_dispatch`` itself.)"""
        while True:
            changed = self._changed
            with trio.move_on_at(self._recheck_at):
                await changed.wait()
            if trio.current_time() >= self._recheck_at:
                self._recheck_at = math.inf
                self._dispatch()

    async def _startup_loads(self, startup: list[tuple[_Model, list[_Device]]]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for model, targets in startup:
                    nursery.start_soon(self._load, model, targets)
        finally:
            self._startup_pending = False
            self._notify()

    def _close_everything(self) -> None:
        """Worker thread, at stop: free every Plan and close the Vulkan devices."""
        for model in self._models.values():
            for placement in model.placements.values():
                self._close_executors(placement)
        for device in self._devices.values():
            try:
                device.handle.close()
            except Exception:  # one device failing to close must not leak the others
                log.exception("closing device %d failed", device.index)

    @staticmethod
    def _close_executors(placement: _Placement) -> None:
        executors, placement.executors, placement.free = placement.executors, [], []
        for executor in executors:
            try:
                close_executor(executor)
            except Exception:  # a lost device may fail to free; keep freeing the rest
                log.exception("freeing a plan on device %d failed", placement.device)

    # ------------------------------------------------------------------------------------
    # inference

    async def infer(self, model: str, inputs: dict[str, np.ndarray], *,
                    priority: int | None = None, deadline: float | None = None,
                    outputs: list[str] | None = None) -> InferResult:
        """Run ``model`` on ``inputs`` and return its outputs.

        ``priority``: higher runs first (default ``config.default_priority``). ``deadline``:
        absolute ``time.time()`` by which the answer must be ready, or DeadlineExceeded.
        ``outputs``: a subset of the model's outputs to return. Cancelling the calling task
        cancels the job. Raises a SchedulerError subclass on every failure.
        """
        self._check_accepting()
        entry = self._models.get(model)
        if entry is None:
            raise ModelNotFound(f"no model '{model}' (models: {', '.join(self._models) or 'none'})")
        self._check_servable(entry)
        arrays = validate_inputs(model, entry.spec.inputs, inputs)
        wanted: list[str] | None = None
        if outputs is not None:
            wanted = list(outputs)
            unknown = [n for n in wanted if n not in entry.spec.outputs]
            if unknown or not wanted:
                raise BadInput(f"model '{model}': unknown output(s) {unknown or wanted} "
                               f"(the model's outputs: {', '.join(entry.spec.outputs)})")
        level = self.config.default_priority if priority is None else int(priority)
        trio_deadline: float | None = None
        if deadline is not None:
            remaining = float(deadline) - time.time()
            if remaining <= 0:  # submitted, and over at once (see JobTotals)
                self._totals.submitted += 1
                self._totals.deadline_exceeded += 1
                raise DeadlineExceeded(f"model '{model}': the deadline had passed "
                                       f"{-remaining:.3f} s before the job arrived")
            trio_deadline = trio.current_time() + remaining
        limit = entry.spec.queue_limit or self.config.queue_limit_per_model
        if len(entry.queue) >= limit:
            self._totals.overloaded += 1
            raise Overloaded(f"model '{model}': queue full ({len(entry.queue)} of {limit} "
                             "jobs waiting); retry later")

        job = Job(model, arrays, wanted, level, trio_deadline)
        self._jobs[job.id] = job
        entry.queue.append(job)
        self._totals.submitted += 1
        self._notify()
        self._dispatch()
        try:
            with trio.move_on_at(math.inf if trio_deadline is None else trio_deadline):
                await job.done.wait()
            if not job.done.is_set():
                where = "running" if job.id in self._running_job_ids(entry) else "queued"
                self._end(job, error=DeadlineExceeded(
                    f"model '{model}': deadline passed while the job was {where}"))
        finally:
            if not job.done.is_set():  # the caller was cancelled (or failed) while waiting
                self._end(job, error=Cancelled(f"model '{model}': the caller cancelled the job"))
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _running_job_ids(self, entry: _Model) -> set[int]:
        return {jid for i in entry.placements if i in self._devices
                for jid in self._devices[i].running}

    def _check_accepting(self) -> None:
        if self._state in (SchedulerState.NEW, SchedulerState.STARTING):
            raise Unavailable("the scheduler is not running yet")
        if self._state is not SchedulerState.RUNNING:
            raise Unavailable("the scheduler is shutting down")

    def _check_servable(self, entry: _Model) -> None:
        if entry.unloading:
            raise Unavailable(f"model '{entry.name}' is being unloaded")
        if self._model_state(entry) is ModelState.FAILED:
            raise Unavailable(f"model '{entry.name}' is not available: {self._model_error(entry)}")

    def _end(self, job: Job, result: InferResult | None = None,
             error: SchedulerError | None = None) -> bool:
        """End ``job`` (first call wins); keep queues and totals in step."""
        if not job.finish(result, error):
            return False
        self._jobs.pop(job.id, None)
        entry = self._models.get(job.model)
        if entry is not None and job in entry.queue:
            entry.queue.remove(job)
        if error is None:
            self._totals.completed += 1
        elif isinstance(error, DeadlineExceeded):
            self._totals.deadline_exceeded += 1
        elif isinstance(error, Cancelled):
            self._totals.cancelled += 1
        else:
            self._totals.failed += 1
        self._notify()
        return True

    # ------------------------------------------------------------------------------------
    # placement

    def _latency(self, entry: _Model, placement: _Placement) -> float:
        """Expected run seconds of ``entry`` on the placement's device: its EWMA, else the
        best one measured elsewhere, else the configured prior."""
        if placement.latency is not None:
            return placement.latency
        known = [p.latency for p in entry.placements.values() if p.latency is not None]
        return min(known) if known else self.config.default_latency_s

    def _dispatch(self) -> None:
        """One placement pass over every queued job (see the module docstring).

        Synchronous, so it runs atomically with respect to other trio tasks; it is called
        whenever something changes (a job arrives or ends, a load finishes, a device fails).
        """
        if self._state not in _WORKING:
            return
        now = trio.current_time()
        queued = sorted((job for m in self._models.values() for job in m.queue),
                        key=Job.sort_key)
        avail: dict[int, list[float]] = {}
        for device in self._devices.values():
            device.queue_depth = 0
            if device.healthy:
                avail[device.index] = device.slot_free_times(now)
        recheck = math.inf
        for job in queued:
            entry = self._models[job.model]
            if job.expired(now):
                self._end(job, error=DeadlineExceeded(
                    f"model '{job.model}': deadline passed while the job was queued"))
                continue
            best: tuple[tuple[float, int, int, int], _Device, _Placement, float] | None = None
            loading = False
            free_elsewhere = False
            for index, placement in entry.placements.items():
                device = self._devices.get(index)
                if device is None or not device.healthy or index in job.excluded:
                    continue
                if placement.state is PlacementState.LOADING:
                    loading = True
                    continue
                if placement.state is not PlacementState.READY or not avail[index]:
                    continue
                latency = self._latency(entry, placement)
                start = avail[index][0]
                free_elsewhere = free_elsewhere or start <= now
                key = (start + latency, device.handle.rank, len(device.running), index)
                if best is None or key < best[0]:
                    best = (key, device, placement, latency)
            if best is None:
                if loading or self._ensure_fallback(entry, job.excluded):
                    continue
                self._end(job, error=self._no_device_error(entry, job))
                continue
            _, device, placement, latency = best
            slots = avail[device.index]
            if slots[0] <= now and placement.free:
                entry.queue.remove(job)
                self._start(job, entry, placement, device, now, latency)
                slots[0] = now + latency
            else:
                device.queue_depth += 1
                if free_elsewhere:  # held by choice: look again when the slot should free
                    recheck = min(recheck, max(slots[0], now + 1e-3))
                slots[0] = max(slots[0], now) + latency
            slots.sort()
        if recheck < self._recheck_at:
            self._recheck_at = recheck
            self._notify()  # the recheck task picks up the earlier time

    def _no_device_error(self, entry: _Model, job: Job) -> SchedulerError:
        if job.excluded:
            return DeviceFailure(
                f"model '{entry.name}': {job.last_fault}; no other healthy device can run it")
        return Unavailable(f"model '{entry.name}': no healthy device can run it "
                           f"({self._model_error(entry)})")

    def _start(self, job: Job, entry: _Model, placement: _Placement, device: _Device,
               now: float, latency: float) -> None:
        executor = placement.free.pop()
        job.attempts += 1
        job.dispatched = now
        device.running[job.id] = (now, latency)
        placement.running += 1
        entry.running += 1
        assert device.nursery is not None
        device.nursery.start_soon(self._execute, job, entry, placement, device, executor)
        self._notify()

    async def _execute(self, job: Job, entry: _Model, placement: _Placement, device: _Device,
                       executor: Executor) -> None:
        """One run of ``job`` on ``device`` (a task in the device worker's nursery)."""
        assert job.dispatched is not None
        queue_seconds = job.dispatched - job.submitted
        try:
            try:
                outputs, run_seconds = await trio.to_thread.run_sync(
                    _run_blocking, device.handle, executor, job.inputs, limiter=device.limiter)
            except Exception as exc:  # classified: device fault -> failover, else INTERNAL
                self._run_failed(job, entry, device, exc)
                return
            device.runs += 1
            device.run_seconds += run_seconds
            alpha = self.config.latency_ewma_alpha
            placement.latency = (run_seconds if placement.latency is None
                                 else alpha * run_seconds + (1 - alpha) * placement.latency)
            if job.done.is_set():
                self._totals.discarded += 1  # cancelled or timed out while running
                return
            if job.expired(trio.current_time()):
                self._end(job, error=DeadlineExceeded(
                    f"model '{job.model}': the run on device {device.index} ended after "
                    "the deadline"))
                return
            names = job.outputs if job.outputs is not None else list(outputs)
            result = InferResult(
                outputs={n: outputs[n] for n in names}, device=device.handle.name,
                queue_seconds=queue_seconds, run_seconds=run_seconds,
                device_index=device.index, job_id=job.id, attempts=job.attempts)
            if self._end(job, result=result):
                device.completed += 1
        finally:
            device.running.pop(job.id, None)
            placement.running -= 1
            entry.running -= 1
            if placement.state is PlacementState.READY:
                placement.free.append(executor)
            self._notify()
            self._dispatch()

    def _run_failed(self, job: Job, entry: _Model, device: _Device, exc: Exception) -> None:
        if not is_device_fault(exc):
            log.error("model %s on device %d: run failed", entry.name, device.index,
                      exc_info=exc)
            self._end(job, error=InternalError(
                f"model '{entry.name}' on device {device.index}: {type(exc).__name__}: {exc}"))
            return
        device.faults += 1
        self._mark_unhealthy(device, exc)
        job.excluded.add(device.index)
        job.last_fault = f"device {device.index} ({device.handle.name}) failed: {exc}"
        if job.done.is_set():
            return
        if job.attempts >= 2:
            self._end(job, error=DeviceFailure(
                f"model '{entry.name}': {job.last_fault} (already a retry; not retried again)"))
            return
        self._totals.retried += 1
        log.warning("model %s: job %d moves off device %d (%s)", entry.name, job.id,
                    device.index, exc)
        entry.queue.append(job)  # keeps its id, so it sorts ahead of later arrivals

    def _mark_unhealthy(self, device: _Device, exc: BaseException) -> None:
        if not device.healthy:
            return
        device.healthy = False
        device.fault = f"{type(exc).__name__}: {exc}"
        self._totals.device_faults += 1
        log.error("device %d (%s) is unhealthy: %s; its jobs move to other devices",
                  device.index, device.handle.name, exc)
        for entry in self._models.values():
            if device.index in entry.placements and not entry.unloading:
                self._ensure_fallback(entry, set())
        self._notify()

    def _serving_devices(self, entry: _Model, excluded: set[int]) -> list[int]:
        return [i for i, p in entry.placements.items()
                if p.state is not PlacementState.FAILED and i not in excluded
                and self._healthy(i)]

    def _ensure_fallback(self, entry: _Model, excluded: set[int]) -> bool:
        """Make sure some healthy device outside ``excluded`` holds (or is loading) the
        model, loading it on the CPU on demand when the model allows; False if impossible."""
        if self._serving_devices(entry, excluded):
            return True
        if entry.unloading or self._nursery is None or self._state not in _WORKING:
            return False
        for device in self._devices.values():
            placement = entry.placements.get(device.index)
            if (device.healthy and device.handle.is_cpu and device.index not in excluded
                    and (placement is None or placement.state is PlacementState.FAILED)
                    and entry.spec.allows(device.handle, fallback=True)):
                log.warning("model %s: loading on %s on demand (no other healthy device has it)",
                            entry.name, device.handle.name)
                entry.placements[device.index] = _Placement(device.index)
                self._nursery.start_soon(self._load, entry, [device])
                return True
        return False

    # ------------------------------------------------------------------------------------
    # loading and unloading

    def _begin_placements(self, entry: _Model, indices: list[int] | None) -> list[_Device]:
        """Mark the model loading on its target devices (``indices`` or the spec's initial
        devices, healthy only) and return them; an empty list records why on the model."""
        healthy = [d for d in self._devices.values() if d.healthy]
        if indices is None:
            chosen = entry.spec.initial_devices([d.handle for d in healthy])
            targets = [self._devices[h.index] for h in chosen]
            if not targets and entry.spec.cpu_fallback:
                targets = [d for d in healthy if d.handle.is_cpu][:1]
        else:
            targets = [self._devices[i] for i in indices]
        targets = [d for d in targets if d.index not in entry.placements
                   or entry.placements[d.index].state is PlacementState.FAILED]
        for device in targets:
            entry.placements[device.index] = _Placement(device.index)
        if not targets and not entry.placements:
            entry.error = f"no healthy device allowed by its devices = {entry.spec.devices!r}"
        return targets

    async def _load(self, entry: _Model, targets: list[_Device]) -> None:
        """Load ``entry`` on ``targets`` (placements already marked loading): parse the graph
        once, then compile and warm up on every device in parallel."""
        if not targets:
            return
        try:
            assert self._load_limiter is not None
            async with self._load_limiter:
                graph = await trio.to_thread.run_sync(entry.spec.load_graph)
        except Exception as exc:  # a model that cannot be read fails alone, named in models()
            if isinstance(exc, SchedulerError):
                message = exc.message
            elif isinstance(exc, ModelFormatError):
                message = f"{entry.name}/{exc}"
            else:
                message = f"{entry.name}: reading the model failed: {type(exc).__name__}: {exc}"
            for device in targets:
                self._placement_failed(entry, device, message)
            entry.error = message
            return
        async with trio.open_nursery() as nursery:
            for device in targets:
                nursery.start_soon(self._load_on_device, entry, device, graph)

    async def _load_on_device(self, entry: _Model, device: _Device, graph: Graph) -> None:
        warmup = entry.spec.warmup if entry.spec.warmup is not None else self.config.default_warmup
        assert self._load_limiter is not None
        started = time.perf_counter()
        try:
            async with self._load_limiter:
                executors, timings, compiled = await trio.to_thread.run_sync(
                    _compile_and_warm, device.handle, graph, entry.spec, device.slots, warmup)
        except Exception as exc:  # any load failure is that placement's, named in models()
            if is_device_fault(exc):
                device.faults += 1
                self._mark_unhealthy(device, exc)
            log.error("model %s on device %d: load failed: %s", entry.name, device.index, exc)
            self._placement_failed(entry, device, f"{type(exc).__name__}: {exc}")
            return
        placement = entry.placements[device.index]
        placement.executors, placement.free = executors, list(executors)
        placement.load_seconds = time.perf_counter() - started
        placement.load_cache = "cold" if compiled else "warm"
        if timings:
            placement.latency = statistics.median(timings[1:] if len(timings) > 1 else timings)
        placement.state = PlacementState.READY
        entry.error = None
        log.info("model %s ready on device %d (%s) in %.2f s", entry.name, device.index,
                 device.handle.name, placement.load_seconds)
        self._notify()
        self._dispatch()

    def _placement_failed(self, entry: _Model, device: _Device, message: str) -> None:
        placement = entry.placements[device.index]
        placement.state, placement.error = PlacementState.FAILED, message
        self._notify()
        self._dispatch()  # jobs waiting for this load may now have nowhere to go

    async def load_model(self, name: str, devices: list[int] | None = None) -> ModelInfo:
        """(Re)read the model folder ``name`` and load it on ``devices`` (indices; default:
        the devices its config allows). Returns the model's ``models()`` entry once every
        requested load has finished; raises BadInput for a broken folder or a device the
        model does not allow, Unavailable when it loaded nowhere."""
        self._check_accepting()
        if self.repository is None:
            raise ModelNotFound(f"no model '{name}': no model repository configured")
        read = await trio.to_thread.run_sync(_read_with_fingerprint, self.repository, name)
        if read is None:
            raise ModelNotFound(f"no model folder '{name}' in {self.repository.path}")
        spec, fingerprint = read
        self._check_accepting()
        entry = self._models.get(name)
        if entry is not None and entry.unloading:
            raise Unavailable(f"model '{name}' is being unloaded; load it again afterwards")
        if spec.error:
            if entry is None:  # listed as failed, as a broken folder is at start-up
                self._models[name] = _Model(spec, error=spec.error, fingerprint=fingerprint)
                self._notify()
            elif self._model_state(entry) is ModelState.FAILED:
                entry.spec, entry.error, entry.fingerprint = spec, spec.error, fingerprint
            raise BadInput(spec.error)
        indices: list[int] | None = None
        if devices is not None:
            indices = []
            for index in devices:
                device = self._devices.get(int(index))
                if device is None:
                    raise BadInput(f"no device {index} (devices: {', '.join(map(str, self._devices))})")
                if not spec.allows(device.handle, fallback=True):
                    raise BadInput(f"model '{name}' does not allow device {index} "
                                   f"(its config.toml: devices = {spec.devices!r})")
                if not device.healthy:
                    raise Unavailable(f"device {index} is unhealthy: {device.fault}")
                indices.append(device.index)
        if entry is None:
            entry = _Model(spec, fingerprint=fingerprint)
            self._models[name] = entry
        elif all(p.state is PlacementState.FAILED for p in entry.placements.values()):
            # nothing uses the old one: pick up edits to the folder
            entry.spec, entry.fingerprint = spec, fingerprint
        targets = self._begin_placements(entry, indices)
        loaded = trio.Event()
        assert self._nursery is not None
        self._nursery.start_soon(self._load_and_signal, entry, targets, loaded)
        await loaded.wait()
        await self._wait_for(lambda: not any(p.state is PlacementState.LOADING
                                             for p in entry.placements.values()))
        if self._model_state(entry) is not ModelState.READY:
            raise Unavailable(f"model '{name}' failed to load: {self._model_error(entry)}")
        return self._model_info(entry)

    async def rescan(self) -> RescanResult:
        """Re-read the repository (SIGHUP) and follow it: load models whose folders appeared
        (or were fixed), unload those whose folders are gone, and reload those whose files
        changed (unload, then load: requests for that model see UNAVAILABLE or
        MODEL_NOT_FOUND meanwhile). Models whose folders did not change are not touched,
        so their traffic goes on. Returns what it loaded, removed, reloaded and failed
        (with why)."""
        self._check_accepting()
        if self.repository is None:
            return RescanResult(loaded=[], removed=[], reloaded=[], failed={})
        specs = await trio.to_thread.run_sync(_scan_with_fingerprints, self.repository)
        added: list[str] = []
        changed: list[str] = []
        for name, (_, fingerprint) in specs.items():
            entry = self._models.get(name)
            if entry is None or (not entry.unloading and self._model_state(entry) is ModelState.FAILED):
                added.append(name)
            elif not entry.unloading and entry.fingerprint != fingerprint:
                changed.append(name)
        removed = [name for name, entry in self._models.items()
                   if name not in specs and not entry.unloading]
        loaded: list[str] = []
        reloaded: list[str] = []
        failed: dict[str, str] = {}

        async def load(name: str, done: list[str]) -> None:
            try:
                await self.load_model(name)
            except SchedulerError as exc:
                failed[name] = exc.message
            else:
                done.append(name)

        async def reload(name: str) -> None:
            try:
                await self.unload_model(name)
            except SchedulerError as exc:
                failed[name] = exc.message
                return
            await load(name, reloaded)

        async def unload(name: str) -> None:
            try:
                await self.unload_model(name)
            except SchedulerError as exc:
                failed[name] = exc.message

        async with trio.open_nursery() as nursery:
            for name in added:
                nursery.start_soon(load, name, loaded)
            for name in changed:
                nursery.start_soon(reload, name)
            for name in removed:
                nursery.start_soon(unload, name)
        if loaded or removed or reloaded or failed:
            log.info("repository rescanned: loaded %s, removed %s, reloaded %s, failed %s",
                     sorted(loaded), sorted(removed), sorted(reloaded), sorted(failed))
        return RescanResult(loaded=sorted(loaded), removed=sorted(removed),
                            reloaded=sorted(reloaded), failed=dict(sorted(failed.items())))

    async def _load_and_signal(self, entry: _Model, targets: list[_Device],
                               loaded: trio.Event) -> None:
        try:
            await self._load(entry, targets)
        finally:
            loaded.set()

    async def unload_model(self, name: str) -> UnloadResult:
        """Stop admitting jobs for ``name``, let its queued and running jobs finish, then free
        its Plans on every device. Runs in the scheduler's nursery, so a caller that goes
        away mid-unload does not leave the model half unloaded."""
        entry = self._models.get(name)
        if entry is None:
            raise ModelNotFound(f"no model '{name}' (models: {', '.join(self._models) or 'none'})")
        if self._nursery is None or self._state not in _WORKING:
            raise Unavailable("the scheduler is not running")
        freed: list[int] = []
        if not entry.unloading:
            entry.unloading = True
            self._notify()
            self._nursery.start_soon(self._unload, entry, freed)
        await self._wait_for(lambda: self._models.get(name) is not entry)
        return UnloadResult(name, "unloaded", freed)

    async def _unload(self, entry: _Model, freed: list[int]) -> None:
        try:
            await self._wait_for(lambda: not entry.queue and entry.running == 0 and not any(
                p.state is PlacementState.LOADING for p in entry.placements.values()))
            placements = list(entry.placements.values())
            freed.extend(p.device for p in placements if p.state is PlacementState.READY)
            for placement in placements:
                placement.state = PlacementState.FAILED  # nothing may take an instance from here on
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(
                    lambda: [self._close_executors(p) for p in placements])
            log.info("model %s unloaded from device(s) %s", entry.name, freed)
        finally:
            if self._models.get(entry.name) is entry:
                del self._models[entry.name]
            self._notify()

    # ------------------------------------------------------------------------------------
    # introspection

    def _model_state(self, entry: _Model) -> ModelState:
        if entry.unloading:
            return ModelState.UNLOADING
        states = [p.state for i, p in entry.placements.items() if self._healthy(i)]
        if PlacementState.READY in states:
            return ModelState.READY
        if PlacementState.LOADING in states:
            return ModelState.LOADING
        return ModelState.FAILED

    def _model_error(self, entry: _Model) -> str:
        if entry.error:
            return entry.error
        reasons = [f"device {i}: {p.error}" for i, p in entry.placements.items() if p.error]
        reasons += [f"device {i}: unhealthy ({self._devices[i].fault})"
                    for i in entry.placements if i in self._devices and not self._devices[i].healthy]
        return "; ".join(reasons) or "not loaded on any device"

    def _healthy(self, index: int) -> bool:
        return index in self._devices and self._devices[index].healthy

    def _model_info(self, entry: _Model) -> ModelInfo:
        state = self._model_state(entry)
        return ModelInfo(
            name=entry.name,
            state=state,
            inputs={n: list(s) for n, s in entry.spec.inputs.items()},
            outputs={n: list(s) for n, s in entry.spec.outputs.items()},
            devices=sorted(i for i, p in entry.placements.items()
                           if p.state is PlacementState.READY and self._healthy(i)),
            placements=[
                PlacementInfo(device=i, state=p.state, error=p.error, healthy=self._healthy(i),
                              latency_ms=None if p.latency is None else p.latency * 1e3,
                              load_seconds=p.load_seconds, load_cache=p.load_cache,
                              in_flight=p.running)
                for i, p in sorted(entry.placements.items())
            ],
            queue_depth=len(entry.queue),
            in_flight=entry.running,
            queue_limit=entry.spec.queue_limit or self.config.queue_limit_per_model,
            precision=entry.spec.precision,
            error=self._model_error(entry) if state is ModelState.FAILED else None,
        )

    def models(self) -> list[ModelInfo]:
        """One entry per known model, by name: its state, inputs and outputs with their
        shapes, the devices where it is ready, per-device placements, queue depth, in-flight
        jobs and the error when failed."""
        return [self._model_info(entry) for _, entry in sorted(self._models.items())]

    def _device_status(self, device: _Device) -> DeviceStatus:
        held = {name: p for name, m in self._models.items()
                for i, p in m.placements.items()
                if i == device.index and p.state is PlacementState.READY}
        return DeviceStatus(
            index=device.index,
            name=device.handle.name,
            kind=device.handle.kind,
            software=device.handle.caps.is_software,
            healthy=device.healthy,
            fault=device.fault,
            slots=device.slots,
            queue_depth=device.queue_depth,
            in_flight=len(device.running),
            models=sorted(held),
            latency_ms={n: None if p.latency is None else p.latency * 1e3
                        for n, p in sorted(held.items())},
            mean_latency_ms=(device.run_seconds / device.runs * 1e3) if device.runs else None,
            runs=device.runs,
            completed=device.completed,
            faults=device.faults,
            memory=device.handle.memory_stats(),
            pipeline_cache=device.handle.cache_stats(),
        )

    def status(self) -> Status:
        """Devices (health, queue depth, in-flight jobs, models, latency; memory and
        pipeline-cache counters of an opened Vulkan device), per-model queues, job totals
        since start, and discovery's GPU problem if any."""
        return Status(
            state=self._state,
            ready=self.ready(),
            devices=[self._device_status(d) for d in self._devices.values()],
            models={name: ModelQueue(self._model_state(m), len(m.queue), m.running)
                    for name, m in sorted(self._models.items())},
            queue_depth=sum(len(m.queue) for m in self._models.values()),
            in_flight=sum(len(d.running) for d in self._devices.values()),
            totals=dataclasses.replace(self._totals),
            gpu_problem=self._gpu_problem,
        )

    # ------------------------------------------------------------------------------------
    # change notification

    def _notify(self) -> None:
        """Wake everything waiting in ``_wait_for`` (they re-check their condition)."""
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` (re-checked after every state change) is true; for the
        daemon's readiness notification and for tests: ``await s.wait_until(s.ready)``."""
        await self._wait_for(predicate)

