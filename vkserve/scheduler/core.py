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
  busier) and keeps waiting. The cost is batch-aware: jobs held for a busy device join the
  batch they would run in there (same model and input shapes, up to ``max_batch_size``), so a
  held job adds the batch's growth (measured per batch size, interpolated between sizes), not a
  whole run; a fast device whose next batch ends soonest takes a burst rather than it spilling
  to a slow free one, and load beyond one device keeps every device busy. The reservations are
  the per-device ``queue_depth`` in ``status()``.
- **Workers**: each device has one long-lived thread per slot (``SlotThreads``); a run (one
  job, or a batch) is handed to them with its Plan instance (one instance per slot; Plans are
  not re-entrant) and its outcome comes back to the loop as a callback that ends its jobs
  (``_run_done``), with no task or thread hand-off per run in between. A run expected to take
  under ``inline_run_ms`` while nothing else is in flight runs on the loop's own thread
  instead (``_run_inline``): the two hand-offs cost more than such a run.
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

import contextlib
import dataclasses
import functools
import heapq
import logging
import math
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import outcome
import trio

from vkserve.devices import heap
from vkserve.devices.discovery import GpuProblem
from vkserve.devices.output_room import OutputRoom
from vkserve.devices.progress import ProgressFn
from vkserve.devices.timing import StageTimes
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph, Layer, build_graph
from vkserve.scheduler.config import SchedulerConfig
from vkserve.scheduler.devices import DeviceHandle, discover_handles
from vkserve.scheduler.engine import (
    BatchRun,
    Executor,
    after_warm_up,
    close_executor,
    executors_nbytes,
    is_device_fault,
    load_executors,
    prepare_device,
    vulkan_engine_available,
)
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
from vkserve.scheduler.jobs import InferResult, Job, client_batch, validate_inputs
from vkserve.scheduler.plans import BuildState, ShapePlans, ShapeSlots
from vkserve.scheduler.processing import (
    explain_now,
    explain_result,
    explains_in_a_thread,
    needs_preparing,
    prepare_request,
)
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
from vkserve.scheduler.shapes import ShapeKey, format_key
from vkserve.scheduler.slot_threads import SlotThreads, Stopped

log = logging.getLogger(__name__)

__all__ = ["Scheduler"]

_EPS = 1e-6  # seconds; keeps "busy" slot-free times strictly after now
#: States in which admitted jobs are placed and run (closing: draining them).
_WORKING = (SchedulerState.RUNNING, SchedulerState.CLOSING)


@dataclasses.dataclass(eq=False)
class _Placement:
    """One model on one device: its Plan instances per input shape, state and measured
    latency. READY means loaded (the shapes config.toml names are built and warmed); other
    shapes are built on first use (``plans``)."""

    device: int
    plans: ShapePlans
    state: PlacementState = PlacementState.LOADING
    error: str | None = None
    latency: float | None = None  # EWMA of run seconds (one job)
    batch_latency: dict[int, float] = dataclasses.field(default_factory=dict)  # EWMA per batch size
    running: int = 0
    load_seconds: float | None = None
    load_cache: Literal["cold", "warm"] | None = None  # cold: the load compiled GLSL
    progress: str | None = None  # while loading: what is building (models() shows it)


@dataclasses.dataclass(eq=False)
class _Model:
    spec: ModelSpec
    placements: dict[int, _Placement] = dataclasses.field(default_factory=dict)
    queue: list[Job] = dataclasses.field(default_factory=list)
    running: int = 0
    unloading: bool = False
    error: str | None = None  # why the model as a whole is unusable (bad folder, no device)
    fingerprint: tuple[Any, ...] = ()  # the folder's files when read (rescan: changed?)
    reload_error: str | None = None  # why the last reload failed (this version still serves)
    retired: bool = False  # replaced by a reloaded version: finishes its jobs, then is freed
    layers: list[Layer] | None = None  # parsed with weights, once loaded: Graphs per shape
    #: loads and builds using the layers' weights right now; at 0 they are released
    weight_users: int = 0
    #: the layers' weights were dropped once every Plan had taken its own copy (bf16 panels,
    #: device buffers): builds after that read them again from the model's files
    weights_released: bool = False
    #: the cancel scopes of its loads in progress (an unload cancels them)
    load_scopes: set[trio.CancelScope] = dataclasses.field(default_factory=set)
    #: shape key -> None (the graph takes it) or why not; checked once per key at admission
    shape_checks: dict[ShapeKey, str | None] = dataclasses.field(default_factory=dict)

    def placement(self, device: int) -> _Placement:
        """A new placement on ``device`` (loading), with the spec's Plan-cache bounds."""
        placement = _Placement(device, ShapePlans(self.spec.plan_cache_shapes,
                                                  self.spec.plan_cache_mb << 20))
        self.placements[device] = placement
        return placement

    def graph(self, key: ShapeKey) -> Graph:
        """The model's graph for input shapes ``key`` (ModelFormatError when it cannot take
        them); the layers and their weights are shared by every shape."""
        assert self.layers is not None
        return build_graph(self.layers, self.spec.param_path.name, dict(zip(self.spec.inputs, key)))

    def graph_with_weights(self, key: ShapeKey, repository: ModelRepository | None) -> Graph:
        """Blocking (a worker thread): ``graph(key)`` with weights, read again from the
        model's files (or regenerated from its seed) once they were released; refused when
        the files changed since the model was read (a rescan loads that as a new version)."""
        if not self.weights_released:
            return self.graph(key)
        if repository is not None and repository.fingerprint(self.spec) != self.fingerprint:
            raise RuntimeError(f"model '{self.name}': its files changed on disk since it was "
                               "loaded; rescan (SIGHUP or `vkserve rescan`) to load them")
        layers = self.spec.load_layers()
        return build_graph(layers, self.spec.param_path.name, dict(zip(self.spec.inputs, key)))

    @property
    def name(self) -> str:
        return self.spec.name


@dataclasses.dataclass(eq=False)
class _Device:
    handle: DeviceHandle
    slots: int
    threads: SlotThreads[tuple[BatchRun, float]]
    healthy: bool = True
    fault: str | None = None
    running: dict[int, tuple[float, float]] = dataclasses.field(
        default_factory=dict)  # run (its first job's id) -> (start, expected seconds)
    members: dict[int, tuple[int, ...]] = dataclasses.field(
        default_factory=dict)  # run -> the ids of the jobs it runs (a batch: several)
    queue_depth: int = 0  # jobs waiting for this device in the last placement pass
    runs: int = 0
    inline_runs: int = 0  # of ``runs``, those run on the loop's thread (``_run_inline``)
    #: inputs in clients' shared memory: read by the GPU where they lay, and copied instead
    inputs_in_place: int = 0
    shared_inputs_copied: int = 0
    run_seconds: float = 0.0
    completed: int = 0
    faults: int = 0
    #: set once ``prepare_device`` has run (the CPU's kernels compiled): Plans are built after
    prepared: trio.Event = dataclasses.field(default_factory=trio.Event)
    prepare_error: str | None = None

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


@dataclasses.dataclass
class _HeldBatch:
    """Placement's view of jobs held for a busy device: they would run there together, as
    one batch in the slot that frees at ``start``, which the batch keeps until ``end``."""

    start: float
    size: int
    end: float


def _scan_with_fingerprints(repository: ModelRepository
                            ) -> dict[str, tuple[ModelSpec, tuple[Any, ...]]]:
    """Blocking: every folder's spec and content fingerprint (``ModelRepository.fingerprint``),
    so a rescan sees edited weights, config.toml or graph, and not a plain ``touch``."""
    return {name: (spec, repository.fingerprint(spec))
            for name, spec in repository.scan().items()}


def _read_with_fingerprint(repository: ModelRepository, name: str
                           ) -> tuple[ModelSpec, tuple[Any, ...]] | None:
    spec = repository.spec(name)
    return None if spec is None else (spec, repository.fingerprint(spec))


#: shape keys whose admission check is remembered per model (a bound on client-chosen keys)
_SHAPE_CHECKS = 256


def _same_io(old: ModelSpec, new: ModelSpec) -> bool:
    """Can a job admitted for ``old`` (inputs validated, outputs chosen) run on ``new``?"""
    return dict(old.inputs) == dict(new.inputs) and dict(old.outputs) == dict(new.outputs)


def _run_blocking(handle: DeviceHandle, executor: Executor,
                  batch: Sequence[Mapping[str, np.ndarray]], rooms: Sequence[OutputRoom | None],
                  between_waits: Callable[[], None]) -> tuple[BatchRun, float]:
    """Worker thread: one run (of a batch, in one execution) with the device's test hooks;
    returns the outputs per item with the stage times, and the seconds of the whole run.
    ``rooms``: where each item's outputs go (or None). ``between_waits`` runs between the
    slices of blocking waits and may raise to abandon them."""
    handle.wait_gate(between_waits)
    start = time.perf_counter()
    handle.apply_hooks(between_waits)
    result = executor.run_batch(batch, between_waits, rooms)
    return result, time.perf_counter() - start


def _compile_and_warm(handle: DeviceHandle, graph: Graph, spec: ModelSpec, instances: int,
                      warmup: int, progress: ProgressFn | None = None
                      ) -> tuple[list[Executor], list[float], bool]:
    """Worker thread: compile ``instances`` Plans of ``graph`` (built for one shape key) and
    run each ``warmup`` times; also returns whether GLSL was compiled meanwhile (a cold
    pipeline cache; a load running in parallel on the same device may be counted too).
    ``progress`` hears of each Vulkan pipeline built.

    Warm-up runs go through the device hooks like jobs do, so an injected delay seeds the
    latency estimate and an injected fault fails the load the way a lost device would.

    A cancelled load (the daemon stopping, the model unloaded) stops at its next pipeline or
    warm-up run: ``trio.from_thread.check_cancelled`` raises there, and what was built is
    freed; a vgg16 load on lavapipe used to hold a SIGTERM for its whole 10 s.
    """
    executors: list[Executor] = []
    timings: list[float] = []
    rng = np.random.default_rng(spec.seed)
    inputs = {n: rng.standard_normal(graph.blob_shapes[n]).astype(np.float32) for n in spec.inputs}
    compiles = handle.glsl_compiles()

    load_thread = threading.get_ident()

    def built(done: int, total: int, what: str) -> None:
        if threading.get_ident() == load_thread:  # (pipelines may be built on helper threads)
            trio.from_thread.check_cancelled()
        if progress is not None:
            progress(done, total, what)

    try:
        executors = load_executors(handle, graph, spec, instances, built)
        compiled = handle.glsl_compiles() > compiles
        if compiled:
            handle.save_pipeline_cache()  # a crash later still finds this load's pipelines
        for executor in executors:
            for _ in range(warmup):
                trio.from_thread.check_cancelled()
                timings.append(_run_blocking(handle, executor, [inputs], [None],
                                             trio.from_thread.check_cancelled)[1])
        after_warm_up(handle)
    except BaseException:
        for executor in executors:
            close_executor(executor)
        raise
    return executors, timings, compiled


def _explained(spec: ModelSpec, on_done: Callable[[Job], None], job: Job) -> None:
    """A submitted job's end: its result's meanings (``spec.postprocess``), then ``on_done``.
    Explaining fails the job (BAD_REQUEST, or INTERNAL for a bug) rather than its answer."""
    if job.result is not None:
        try:
            explain_now(spec, job.result, job.inputs, None, one_item=True)
        except SchedulerError as exc:
            job.result, job.error = None, exc
        except Exception as exc:  # noqa: BLE001 (a bug explaining: this job's INTERNAL, the answer still goes)
            log.exception("explaining the result of job %d (%s) failed", job.id, job.model)
            job.result, job.error = None, InternalError(f"explaining the result failed: {type(exc).__name__}: {exc}")
    on_done(job)


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
        # the run ``_start`` handed to the loop's own thread (``_run_inline``): its device, work
        # and end; at most one, since it is only chosen while nothing else is in flight
        self._inline: tuple[_Device, Callable[[], tuple[BatchRun, float]],
                            Callable[[outcome.Outcome[tuple[BatchRun, float]]], None]] | None = None
        self._inline_lot = trio.lowlevel.ParkingLot()
        # reloads (load-new-then-swap, see ``rescan``): new versions still loading, by name,
        # and replaced versions finishing their jobs before they are freed
        self._pending: dict[str, _Model] = {}
        self._retiring: list[_Model] = []
        self._reload_failures: dict[str, int] = {}
        self._rescan_lock = trio.Lock()
        self._state = SchedulerState.NEW
        self._startup_pending = True
        self._nursery: trio.Nursery | None = None
        # deadlines of the jobs `submit` admitted (nobody awaits them): (trio time, job id);
        # ids only, so that ended jobs (their inputs and outputs) are not kept until then
        self._deadlines: list[tuple[float, int]] = []
        self._deadlines_changed = trio.Event()
        self._load_limiter: trio.CapacityLimiter | None = None
        self._changed = trio.Event()
        self._recheck_at = math.inf  # when to re-run placement for jobs held by choice
        self._recheck_scope: trio.CancelScope | None = None  # its timer (deadline: _recheck_at)
        self._placement_stale = False  # admission skipped a pass (``_pass_needed``)
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
                    slots = self.config.cpu_instances if handle.is_cpu else self.config.instances_per_device
                    self._devices[handle.index] = _Device(
                        handle, slots, SlotThreads(handle.id, slots))
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
                         ", ".join(f"{d.handle.id} ({d.handle.name})" for d in self._devices.values()))
                task_status.started()
                for device in self._devices.values():
                    nursery.start_soon(self._prepare, device)
                nursery.start_soon(self._recheck_placement)
                nursery.start_soon(self._watch_deadlines)
                nursery.start_soon(self._run_inline)
                nursery.start_soon(self._startup_loads, startup)
                await self._stop.wait()
                self._state = SchedulerState.STOPPING
                nursery.cancel_scope.cancel()
        finally:
            self._state = SchedulerState.STOPPING
            for job in list(self._jobs.values()):
                self._end(job, error=Unavailable("the scheduler stopped before the job ran"))
            with trio.CancelScope(shield=True):
                for device in self._devices.values():  # no run may touch a Plan being freed
                    await device.threads.stop()
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

    async def _recheck_placement(self) -> None:
        """Re-run placement when jobs wait for a busy device although another one is free:
        if the busy device does not free up when estimated, they may be better off moving.
        (Every other reason to place jobs is an event that calls ``_dispatch`` itself.) A
        timer only: ``_dispatch`` moves its deadline, nothing else wakes it."""
        while True:
            with trio.CancelScope(deadline=self._recheck_at) as self._recheck_scope:
                await trio.sleep_forever()
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
        for model in [*self._models.values(), *self._pending.values(), *self._retiring]:
            for placement in model.placements.values():
                self._close_executors(placement)
        for device in self._devices.values():
            try:
                device.handle.close()
            except Exception:  # one device failing to close must not leak the others
                log.exception("closing device %s failed", device.handle.id)

    @staticmethod
    def _close_executors(placement: _Placement) -> None:
        Scheduler._close_list(placement.device, placement.plans.take_all())

    @staticmethod
    def _close_list(device: int, executors: list[Executor]) -> None:
        for executor in executors:
            try:
                close_executor(executor)
            except Exception:  # a lost device may fail to free; keep freeing the rest
                log.exception("freeing a plan on device %d failed", device)

    # ------------------------------------------------------------------------------------
    # inference

    async def infer(self, model: str, inputs: dict[str, np.ndarray], *,
                    priority: int | None = None, deadline: float | None = None,
                    outputs: list[str] | None = None, room: OutputRoom | None = None) -> InferResult:
        """Run ``model`` on ``inputs`` and return its outputs.

        ``priority``: higher runs first (default ``config.default_priority``). ``deadline``:
        absolute ``time.time()`` by which the answer must be ready, or DeadlineExceeded.
        ``outputs``: a subset of the model's outputs to return. ``room``: where the engine
        writes them (a shared-memory client's slot; not used for a client's batch, whose
        outputs are stacked). Cancelling the calling task cancels the job. Raises a SchedulerError subclass on every failure.

        Inputs with one leading dimension more than the model's (every input of a model whose
        inputs have a known rank) are a client's batch: one job per item, admitted together
        (or refused together when the queue cannot take them all) so they run batched; the
        outputs are stacked along a new leading dimension, and the first failure cancels the
        other items.

        A model with ``[preprocess]`` also takes images for that input (uint8; converted in a
        worker thread first); with ``[postprocess]`` the result carries ``meanings``.
        """
        entry = self._models.get(model)
        if entry is None or (entry.spec.preprocess is None and entry.spec.postprocess is None):
            return await self._infer_tensors(model, inputs, priority=priority, deadline=deadline,
                                             outputs=outputs, room=room)
        spec = entry.spec
        tensors, geometries = await prepare_request(spec, inputs)
        result = await self._infer_tensors(model, tensors, priority=priority, deadline=deadline,
                                           outputs=outputs, room=room)
        return await explain_result(spec, result, tensors, geometries)

    def submit(self, model: str, inputs: dict[str, np.ndarray], *, priority: int | None,
               deadline: float | None, outputs: list[str] | None,
               on_done: Callable[[Job], None], room: OutputRoom | None = None) -> Job | None:
        """`infer` without a task per request: the job is admitted (or a SchedulerError
        raised, as `infer` would) and ``on_done(job)`` runs in the loop when it ends
        (``job.result`` or ``job.error``; at its deadline, DeadlineExceeded from
        `_watch_deadlines`). None, with nothing admitted, where the request needs `infer`
        instead: work in a thread around the run (an image to preprocess, a segmentation mask
        to explain) or a client's batch (one job per item). Other meanings (``[postprocess]``:
        top-k, boxes) are computed as the job ends, before ``on_done``."""
        entry = self._models.get(model)
        spec = entry.spec if entry is not None else None
        if spec is not None and (needs_preparing(spec, inputs) or explains_in_a_thread(spec)):
            return None
        admitted = self._admit(model, inputs, priority=priority, deadline=deadline, outputs=outputs,
                               single_only=True, room=room)
        if admitted is None:
            return None
        job = admitted[1][0]
        job.on_done = (on_done if spec is None or spec.postprocess is None
                       else functools.partial(_explained, spec, on_done))
        if job.deadline is not None:
            if not self._deadlines or job.deadline < self._deadlines[0][0]:
                self._deadlines_changed.set()  # the watcher sleeps until a later one
            heapq.heappush(self._deadlines, (job.deadline, job.id))
        return job

    async def _run_inline(self) -> None:
        """Execute the runs ``_start`` keeps on the loop's thread, one loop round after it: a
        job's end is never delivered inside ``submit``, and a wake-up here is a task switch,
        not a system call. The loop waits for the run (under ``inline_run_ms``, by the rule)."""
        while True:
            if self._inline is None:
                await self._inline_lot.park()
                continue
            device, work, done = self._inline
            self._inline = None
            ran = outcome.capture(work)
            if isinstance(ran, outcome.Value):  # counted as ``runs`` is: the runs that ended well
                device.inline_runs += 1
            done(ran)

    async def _watch_deadlines(self) -> None:
        """End `submit`'s jobs whose deadline passed (as `_wait` does for `infer`'s)."""
        while True:
            self._deadlines_changed = trio.Event()
            wake_at = self._deadlines[0][0] if self._deadlines else math.inf
            with trio.move_on_at(wake_at):
                await self._deadlines_changed.wait()
            now = trio.current_time()
            while self._deadlines and self._deadlines[0][0] <= now:
                job = self._jobs.get(heapq.heappop(self._deadlines)[1])
                if job is not None and not job.done.is_set():
                    entry = self._models.get(job.model)
                    where = ("running" if entry is not None and job.id in self._running_job_ids(entry)
                             else "queued")
                    self._end(job, error=DeadlineExceeded(
                        f"model '{job.model}': deadline passed while the job was {where}"))

    def cancel(self, job: Job, message: str) -> None:
        """End a job admitted by `submit` as cancelled (no-op once it ended); a run in progress
        finishes and its result is discarded."""
        self._end(job, error=Cancelled(f"model '{job.model}': {message}"))

    async def _infer_tensors(self, model: str, inputs: dict[str, np.ndarray], *,
                             priority: int | None, deadline: float | None,
                             outputs: list[str] | None, room: OutputRoom | None) -> InferResult:
        admitted = self._admit(model, inputs, priority=priority, deadline=deadline, outputs=outputs,
                               room=room)
        assert admitted is not None
        entry, jobs, batched = admitted
        if not batched:
            return await self._wait(jobs[0], entry)
        results: list[InferResult] = []
        failures: list[SchedulerError] = []

        async def wait(job: Job, scope: trio.CancelScope) -> None:
            try:
                results.append(await self._wait(job, entry))
            except SchedulerError as exc:  # the first failure is the batch's; the rest cancel
                failures.append(exc)
                scope.cancel()

        async with trio.open_nursery() as nursery:
            for job in jobs:
                nursery.start_soon(wait, job, nursery.cancel_scope)
        if failures:
            raise failures[0]
        results.sort(key=lambda r: r.job_id)  # the items' order (ids grow with admission)
        first = results[0]
        return InferResult(
            outputs={n: np.stack([r.outputs[n] for r in results]) for n in first.outputs},
            device=", ".join(dict.fromkeys(r.device for r in results)),
            queue_seconds=max(r.queue_seconds for r in results),
            run_seconds=max(r.run_seconds for r in results), device_index=first.device_index,
            job_id=first.job_id, attempts=max(r.attempts for r in results),
            batch_size=max(r.batch_size for r in results))

    def _admit(self, model: str, inputs: dict[str, np.ndarray], *, priority: int | None,
               deadline: float | None, outputs: list[str] | None,
               single_only: bool = False, room: OutputRoom | None = None
               ) -> tuple[_Model, list[Job], bool] | None:
        """Validate and queue a request's jobs (one, or one per item of a client's batch: the
        bool); None, with nothing queued, for a client's batch when ``single_only``. ``room``
        goes to a lone job (a client's batch's outputs are stacked after the run)."""
        self._check_accepting()
        entry = self._models.get(model)
        if entry is None:
            raise ModelNotFound(f"no model '{model}' (models: {', '.join(self._models) or 'none'})")
        self._check_servable(entry)
        items = client_batch(model, entry.spec.inputs, inputs, entry.spec.max_batch_size)
        if items is not None and single_only:
            return None
        arrays = [validate_inputs(model, entry.spec.inputs, item) for item in (items or [inputs])]
        for key in dict.fromkeys(tuple(a[n].shape for n in entry.spec.inputs) for a in arrays):
            problem = self._shape_problem(entry, key)
            if problem is not None:
                raise BadInput(f"model '{model}': input shapes "
                               f"{format_key(entry.spec.inputs, key)}: {problem}")
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
                self._totals.submitted += len(arrays)
                self._totals.deadline_exceeded += len(arrays)
                raise DeadlineExceeded(f"model '{model}': the deadline had passed "
                                       f"{-remaining:.3f} s before the job arrived")
            trio_deadline = trio.current_time() + remaining
        limit = entry.spec.queue_limit or self.config.queue_limit_per_model
        if len(entry.queue) + len(arrays) > limit:
            self._totals.overloaded += 1
            adds = f", the batch adds {len(arrays)}" if items is not None else ""
            raise Overloaded(f"model '{model}': queue full ({len(entry.queue)} of {limit} "
                             f"jobs waiting{adds}); retry later")

        jobs = [Job(model, a, wanted, level, trio_deadline,
                    tuple(a[n].shape for n in entry.spec.inputs), room if items is None else None)
                for a in arrays]
        for job in jobs:
            self._jobs[job.id] = job
            entry.queue.append(job)
        self._totals.submitted += len(jobs)
        self._notify()
        if self._pass_needed(entry, jobs[0].key):
            self._dispatch()
        else:
            self._placement_stale = True  # status() runs the pass for its queue depths
        return entry, jobs, items is not None

    async def _wait(self, job: Job, entry: _Model) -> InferResult:
        """Wait for an admitted job to end, under its deadline; a cancelled caller ends it."""
        try:
            if job.deadline is None:
                await job.done.wait()
            else:
                with trio.move_on_at(job.deadline):
                    await job.done.wait()
            if not job.done.is_set():
                where = "running" if job.id in self._running_job_ids(entry) else "queued"
                self._end(job, error=DeadlineExceeded(
                    f"model '{job.model}': deadline passed while the job was {where}"))
        except trio.Cancelled:
            if job.done.is_set() and job.error is None:
                # The job finished in the same instant the caller was cancelled: its result is
                # never delivered, so it counts as the caller saw it (cancelled), not completed.
                self._totals.completed -= 1
                self._totals.cancelled += 1
            raise
        finally:
            if not job.done.is_set():  # the caller was cancelled (or failed) while waiting
                self._end(job, error=Cancelled(f"model '{job.model}': the caller cancelled the job"))
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    @staticmethod
    def _shape_problem(entry: _Model, key: ShapeKey) -> str | None:
        """Why the model's graph cannot take input shapes ``key`` (shape inference names the
        layer), or None; remembered per key. Before the model's layers are read nothing is
        known: a failing build then ends the job with the same message."""
        if key in entry.spec.prebuilt or entry.layers is None:
            return None
        if key not in entry.shape_checks:
            if len(entry.shape_checks) >= _SHAPE_CHECKS:
                del entry.shape_checks[next(iter(entry.shape_checks))]
            try:
                entry.graph(key)
                entry.shape_checks[key] = None
            except ModelFormatError as exc:
                entry.shape_checks[key] = str(exc)
        return entry.shape_checks[key]

    def _running_job_ids(self, entry: _Model) -> set[int]:
        return {jid for i in entry.placements if i in self._devices
                for run in self._devices[i].members.values() for jid in run}

    def _entries(self) -> list[_Model]:
        """Every version that may hold jobs: the current ones and those retiring after a
        reload (still running, or queued ones the new version cannot take)."""
        return [*self._models.values(), *self._retiring]

    def _versions(self, name: str) -> list[_Model]:
        """The current version of ``name`` (if any) and its retiring ones."""
        current = self._models.get(name)
        return [*([current] if current is not None else []),
                *(m for m in self._retiring if m.name == name)]

    def _check_accepting(self) -> None:
        if self._state in (SchedulerState.NEW, SchedulerState.STARTING):
            raise Unavailable("the scheduler is not running yet")
        if self._state is not SchedulerState.RUNNING:
            raise Unavailable("the scheduler is shutting down")

    def _check_servable(self, entry: _Model) -> None:
        if entry.unloading:
            raise Unavailable(f"model '{entry.name}' is being unloaded")
        for index, placement in entry.placements.items():  # (the usual case, per request)
            if placement.state is PlacementState.READY and self._healthy(index):
                return
        if self._model_state(entry) is ModelState.FAILED:
            raise Unavailable(f"model '{entry.name}' is not available: {self._model_error(entry)}")

    def _end(self, job: Job, result: InferResult | None = None,
             error: SchedulerError | None = None) -> bool:
        """End ``job`` (first call wins); keep queues and totals in step."""
        if not job.finish(result, error):
            return False
        self._jobs.pop(job.id, None)
        for entry in self._entries():
            if entry.name == job.model and job in entry.queue:
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
        if job.on_done is not None:
            try:
                job.on_done(job)
            except Exception:  # the submitter's bug: the scheduler goes on
                log.exception("the end-of-job callback of job %d (%s) failed", job.id, job.model)
        return True

    # ------------------------------------------------------------------------------------
    # placement

    def _latency(self, entry: _Model, placement: _Placement, batch: int = 1) -> float:
        """Expected run seconds of ``entry`` on the placement's device: its EWMA, else the
        best one measured elsewhere, else the configured prior. A batch of n: its own EWMA,
        else interpolated between the measured sizes around n (one job's latency is size 1);
        past the largest measured size, that size's cost per job (so no gain is assumed
        while only single jobs were measured)."""
        if batch > 1 and batch in placement.batch_latency:
            return placement.batch_latency[batch]
        single = placement.latency
        if single is None:
            known = [p.latency for p in entry.placements.values() if p.latency is not None]
            single = min(known) if known else self.config.default_latency_s
        if batch == 1:
            return single
        measured = {1: single, **placement.batch_latency}
        low = max(n for n in measured if n < batch)
        high = min((n for n in measured if n > batch), default=None)
        if high is None:
            return measured[low] * batch / low
        step = (measured[high] - measured[low]) / (high - low)
        return measured[low] + step * (batch - low)

    def _pass_needed(self, entry: _Model, key: ShapeKey) -> bool:
        """Can a placement pass do anything for a job of ``entry`` with input shapes ``key``
        just admitted? Not while every healthy device holding the model is ready, has the
        key's Plans and no slot free: the job then waits, and the pass that follows the next
        run's end places it (a saturated daemon admits most jobs that way, so admission skips
        a pass over the whole queue). Anything else (a free slot, Plans to build, a load, no
        device) needs the pass."""
        held = False
        for index, placement in entry.placements.items():
            device = self._devices.get(index)
            if device is None or not device.healthy:
                continue
            shape = placement.plans.get(key)
            if (placement.state is not PlacementState.READY or shape is None
                    or shape.state is not BuildState.READY
                    or (len(device.running) < device.slots and shape.free)):
                return True
            held = True
        return not held

    def _dispatch(self) -> None:
        """One placement pass over every queued job (see the module docstring).

        Synchronous, so it runs atomically with respect to other trio tasks; it is called
        whenever something changes (a job arrives or ends, a load finishes, a device fails).
        """
        if self._state not in _WORKING:
            return
        self._placement_stale = False
        if not any(m.queue for m in self._entries()):  # nothing waits (a run just ended, say)
            for device in self._devices.values():
                device.queue_depth = 0
            return
        now = trio.current_time()
        queued = sorted(((job, m) for m in self._entries() for job in m.queue),
                        key=lambda jm: Job.sort_key(jm[0]))
        avail: dict[int, list[float]] = {}
        for device in self._devices.values():
            device.queue_depth = 0
            if device.healthy:
                avail[device.index] = device.slot_free_times(now)
        recheck = math.inf
        # jobs held for a device, grouped as they would run there: one batch per (device,
        # model version, input shapes) up to max_batch_size, so a held job costs a busy
        # device its share of a batch rather than a whole run of its own
        groups: dict[tuple[int, int, ShapeKey], _HeldBatch] = {}
        for job, entry in queued:
            if job not in entry.queue:  # started as part of a batch earlier in this pass
                continue
            if job.expired(now):
                self._end(job, error=DeadlineExceeded(
                    f"model '{job.model}': deadline passed while the job was queued"))
                continue
            best: tuple[tuple[float, int, int, int], _Device, _Placement, ShapeSlots,
                        _HeldBatch | None] | None = None
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
                shape = placement.plans.get(job.key)
                if shape is None or shape.state is BuildState.BUILDING:
                    # a new shape waits for its Plans (built on every device holding the
                    # model); other shapes go on meanwhile
                    loading = loading or shape is not None or self._build_shape(
                        entry, placement, device, job.key)
                    continue
                start = avail[index][0]
                free_elsewhere = free_elsewhere or start <= now
                group = groups.get((index, id(entry), job.key))
                # joins the held batch while it has room and nothing is held behind it
                if (group is not None and group.size < entry.spec.max_batch_size
                        and group.end in avail[index]):
                    finish = group.start + self._latency(entry, placement, group.size + 1)
                else:
                    group = None
                    finish = max(start, now) + self._latency(entry, placement)
                key = (finish, device.handle.rank, len(device.running), index)
                if best is None or key < best[0]:
                    best = (key, device, placement, shape, group)
            if best is None:
                if loading or self._ensure_fallback(entry, job.excluded):
                    continue
                self._end(job, error=self._no_device_error(entry, job))
                continue
            (finish, *_), device, placement, shape, group = best
            slots = avail[device.index]
            if slots[0] <= now and shape.free:
                batch, hold_until = self._form_batch(job, entry, placement, device.index, now)
                if not batch:  # waiting (max_queue_delay_ms) for the batch to fill
                    recheck = min(recheck, hold_until)
                    continue
                latency = self._latency(entry, placement, len(batch))
                for member in batch:
                    entry.queue.remove(member)
                self._start(batch, entry, placement, shape, device, now, latency)
                slots[0] = now + latency
            else:
                device.queue_depth += 1
                if group is None:  # the first of a batch that runs when the slot frees
                    group = _HeldBatch(max(slots[0], now), 0, slots[0])
                    groups[(device.index, id(entry), job.key)] = group
                if free_elsewhere:  # held by choice: look again when the slot should free
                    recheck = min(recheck, max(group.start, now + 1e-3))
                slots[slots.index(group.end)] = finish  # the batch's slot, now ending later
                group.size, group.end = group.size + 1, finish
            slots.sort()
        if recheck < self._recheck_at:
            self._recheck_at = recheck
            if self._recheck_scope is not None:
                self._recheck_scope.deadline = recheck

    def _no_device_error(self, entry: _Model, job: Job) -> SchedulerError:
        if job.excluded:
            return DeviceFailure(
                f"model '{entry.name}': {job.last_fault}; no other healthy device can run it")
        return Unavailable(f"model '{entry.name}': no healthy device can run it "
                           f"({self._model_error(entry)})")

    def _form_batch(self, lead: Job, entry: _Model, placement: _Placement, device: int,
                    now: float) -> tuple[list[Job], float]:
        """The jobs to run with ``lead`` in one execution, highest priority first (Triton's
        dynamic batcher): queued jobs of the same model and input shapes that may run on the
        device, up to ``max_batch_size``, cut to the largest preferred size it reaches. No job
        joins if the batch would make it miss a deadline it meets alone. With
        ``max_queue_delay_ms`` a short batch waits for more jobs until the lead has waited that
        long: then ``([], when to look again)``."""
        spec = entry.spec
        batch = [lead]
        if spec.max_batch_size > 1:
            batch += sorted((j for j in entry.queue if j is not lead and j.key == lead.key
                             and device not in j.excluded and not j.expired(now)),
                            key=Job.sort_key)[:spec.max_batch_size - 1]
        full = max(spec.preferred_batch_sizes, default=spec.max_batch_size)
        hold_until = lead.submitted + spec.max_queue_delay_ms / 1e3
        if len(batch) < full and now < hold_until:
            return [], hold_until
        fitting = [p for p in spec.preferred_batch_sizes if p <= len(batch)]
        batch = batch[:max(fitting, default=len(batch))]
        alone = self._latency(entry, placement, 1)
        while len(batch) > 1:
            together = self._latency(entry, placement, len(batch))
            late = [j for j in batch if j.deadline is not None
                    and now + alone <= j.deadline < now + together]
            if not late:
                break
            batch = batch[:-1] if lead in late else [j for j in batch if j not in late]
        return batch, now

    def _start(self, batch: list[Job], entry: _Model, placement: _Placement, shape: ShapeSlots,
               device: _Device, now: float, latency: float) -> None:
        placement.plans.use(shape.key)
        executor = shape.free.pop()
        for job in batch:
            job.attempts += 1
            job.dispatched = now
        run = batch[0].id
        device.running[run] = (now, latency)
        device.members[run] = tuple(j.id for j in batch)
        placement.running += len(batch)
        entry.running += len(batch)
        work = functools.partial(_run_blocking, device.handle, executor, [j.inputs for j in batch],
                                 [j.room for j in batch], device.threads.check_stopped)
        done = functools.partial(self._run_done, batch, entry, placement, shape, device, executor)
        if self._inline is None and self._runs_inline(batch, device, placement, latency):
            self._inline = (device, work, done)
            self._inline_lot.unpark()
        else:
            device.threads.submit(work, done)
        self._notify()

    def _runs_inline(self, batch: list[Job], device: _Device, placement: _Placement,
                     latency: float) -> bool:
        """Does this run go to the loop's own thread? When it is all there is to do (no other
        job queued or running anywhere), its expected latency, measured on this device, is
        under ``inline_run_ms`` and the device has no test hook set. Two thread
        hand-offs (a queue put waking a run thread, its outcome waking the loop) cost 0.15-0.2
        ms of a sequential request (RESULTS, issue 14): about as much as such a run."""
        return (placement.latency is not None and latency < self.config.inline_run_ms / 1e3
                and len(self._jobs) == len(batch) and len(device.running) == 1
                and not device.handle.hooked())

    def _run_done(self, batch: list[Job], entry: _Model, placement: _Placement,
                  shape: ShapeSlots, device: _Device, executor: Executor,
                  ran: outcome.Outcome[tuple[BatchRun, float]]) -> None:
        """On the loop, when a run of a batch of jobs on ``device`` ended: deliver or fail
        its jobs, give its Plan instance back and place what waits."""
        run = batch[0].id
        try:
            try:
                done, run_seconds = ran.unwrap()
            except Stopped:  # the scheduler stopped under it: its jobs have ended already
                return
            except Exception as exc:  # classified: device fault -> failover, else INTERNAL
                self._run_failed(batch, entry, device, exc)
                return
            device.runs += 1
            device.inputs_in_place += done.stages.in_place
            device.shared_inputs_copied += done.stages.shared_copied
            device.run_seconds += run_seconds
            self._observe_latency(placement, len(batch), run_seconds)
            for job, outputs in zip(batch, done.outputs):
                if self._finish_job(job, outputs, device, run_seconds, len(batch), done.stages):
                    device.completed += 1
        finally:
            device.running.pop(run, None)
            device.members.pop(run, None)
            placement.running -= len(batch)
            entry.running -= len(batch)
            if placement.state is PlacementState.READY and placement.plans.get(shape.key) is shape:
                shape.free.append(executor)
            self._notify()
            self._dispatch()

    def _observe_latency(self, placement: _Placement, size: int, seconds: float) -> None:
        alpha = self.config.latency_ewma_alpha
        if size == 1:
            old = placement.latency
            placement.latency = seconds if old is None else alpha * seconds + (1 - alpha) * old
        else:
            old = placement.batch_latency.get(size)
            placement.batch_latency[size] = (seconds if old is None
                                             else alpha * seconds + (1 - alpha) * old)

    def _finish_job(self, job: Job, outputs: dict[str, np.ndarray], device: _Device,
                    run_seconds: float, batch_size: int, stages: StageTimes) -> bool:
        """Deliver one job's outputs; False when it had ended meanwhile (discarded) or the
        answer came after its deadline."""
        assert job.dispatched is not None
        if job.done.is_set():
            self._totals.discarded += 1  # cancelled or timed out while running
            return False
        if job.expired(trio.current_time()):
            self._end(job, error=DeadlineExceeded(
                f"model '{job.model}': the run on {device.handle.id} ended after the deadline"))
            return False
        names = job.outputs if job.outputs is not None else list(outputs)
        return self._end(job, result=InferResult(
            outputs={n: outputs[n] for n in names}, device=device.handle.id,
            queue_seconds=job.dispatched - job.submitted, run_seconds=run_seconds,
            device_index=device.index, job_id=job.id, attempts=job.attempts,
            batch_size=batch_size, stages=stages))

    def _run_failed(self, batch: list[Job], entry: _Model, device: _Device, exc: Exception) -> None:
        """A run failed: a device fault moves its jobs elsewhere, anything else fails them."""
        if not is_device_fault(exc):
            log.error("model %s on %s: run of %d job(s) failed", entry.name, device.handle.id,
                      len(batch), exc_info=exc)
            for job in batch:
                self._end(job, error=InternalError(
                    f"model '{entry.name}' on {device.handle.id}: {type(exc).__name__}: {exc}"))
            return
        device.faults += 1
        self._mark_unhealthy(device, exc)
        for job in batch:
            self._retry_elsewhere(job, entry, device, exc)

    def _retry_elsewhere(self, job: Job, entry: _Model, device: _Device, exc: Exception) -> None:
        job.excluded.add(device.index)
        job.last_fault = f"{device.handle.id} ({device.handle.name}) failed: {exc}"
        if job.done.is_set():
            return
        if job.attempts >= 2:
            self._end(job, error=DeviceFailure(
                f"model '{entry.name}': {job.last_fault} (already a retry; not retried again)"))
            return
        self._totals.retried += 1
        log.warning("model %s: job %d moves off %s (%s)", entry.name, job.id,
                    device.handle.id, exc)
        # keeps its id, so it sorts ahead of later arrivals; a job of a version replaced by a
        # reload goes to the new one when that takes the same inputs
        successor = self._models.get(entry.name)
        if entry.retired and successor is not None and _same_io(entry.spec, successor.spec):
            entry = successor
        entry.queue.append(job)

    def _mark_unhealthy(self, device: _Device, exc: BaseException) -> None:
        if not device.healthy:
            return
        device.healthy = False
        device.fault = f"{type(exc).__name__}: {exc}"
        self._totals.device_faults += 1
        log.error("%s (%s) is unhealthy: %s; its jobs move to other devices",
                  device.handle.id, device.handle.name, exc)
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
            # not where its load already failed: loading it again on every dispatch while
            # jobs wait would never end (and load_model would wait for it forever)
            if (device.healthy and device.handle.is_cpu and device.index not in excluded
                    and placement is None
                    and entry.spec.allows(device.handle, fallback=True)):
                log.warning("model %s: loading on %s on demand (no other healthy device has it)",
                            entry.name, device.handle.id)
                entry.placement(device.index)
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
            entry.placement(device.index)
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
            if entry.layers is None:  # read once; later loads (fallback, load_model) reuse them
                async with self._load_limiter:
                    entry.layers = await trio.to_thread.run_sync(entry.spec.load_layers)
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
                nursery.start_soon(self._load_on_device, entry, device)

    async def _load_on_device(self, entry: _Model, device: _Device) -> None:
        """Build and warm the Plans of every prebuilt shape key on ``device``; a model with
        none (dynamic inputs, no shapes in config.toml) is ready at once and builds on use.
        An unload of the model cancels it (at its next pipeline or warm-up run)."""
        with trio.CancelScope() as scope:
            entry.load_scopes.add(scope)
            if entry.unloading:  # the unload came first (before this task ran): nothing to build
                scope.cancel()
            try:
                await self._build_placement(entry, device)
            finally:
                entry.load_scopes.discard(scope)
        if scope.cancelled_caught:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close_executors, entry.placements[device.index])
            self._placement_failed(entry, device, "unloaded while loading")

    async def _prepare(self, device: _Device) -> None:
        """What ``device`` needs once before its first Plan (``prepare_device``: the CPU's
        kernels compiled for this machine, minutes on a first start, or loaded from numba's
        cache), beside the other devices' loads: the daemon answers, and the GPUs serve,
        meanwhile. A failure fails the device's Plans with its reason."""
        try:
            done = await prepare_device(device.handle)
        except Exception as exc:  # the device's loads fail with this reason, logged there
            device.prepare_error = f"preparing {device.handle.id} failed: {type(exc).__name__}: {exc}"
            log.error("%s", device.prepare_error)
        else:
            if done is not None:
                log.info("%s", done)
        finally:
            device.prepared.set()

    async def _prepared(self, device: _Device, placement: _Placement | None = None) -> None:
        """Wait for ``_prepare`` of ``device`` (``placement`` shows it meanwhile); raise its
        failure."""
        if not device.prepared.is_set():
            if placement is not None:
                placement.progress = (f"waiting for {device.handle.id}'s kernels to be compiled for "
                                      "this machine (a first start: minutes)")
            await device.prepared.wait()
        if device.prepare_error is not None:
            raise RuntimeError(device.prepare_error)

    async def _build_placement(self, entry: _Model, device: _Device) -> None:
        warmup = entry.spec.warmup if entry.spec.warmup is not None else self.config.default_warmup
        assert self._load_limiter is not None
        placement = entry.placements[device.index]
        started = time.perf_counter()
        timings: list[float] = []
        compiled = False
        keys = entry.spec.prebuilt
        try:
            await self._prepared(device, placement)
            for k, key in enumerate(keys, 1):
                building = (f"building Plans for {format_key(entry.spec.inputs, key)} "
                            f"({k} of {len(keys)})")
                placement.progress = building
                log.info("model %s on %s: %s", entry.name, device.handle.id, building)

                def built(done: int, total: int, what: str, building: str = building) -> None:
                    # a worker thread: one str assignment, read by models()
                    placement.progress = f"{building}: {done} of {total} pipelines"

                placement.plans.building(key, pinned=True)
                async with self._load_limiter, self._using_weights(entry):
                    executors, key_timings, key_compiled = await trio.to_thread.run_sync(
                        lambda key=key, built=built: _compile_and_warm(
                            device.handle, entry.graph_with_weights(key, self.repository),
                            entry.spec, device.slots, warmup, built))
                placement.plans.ready(key, executors, executors_nbytes(executors))
                timings += key_timings
                compiled = compiled or key_compiled
        except Exception as exc:  # any load failure is that placement's, named in models()
            if is_device_fault(exc):
                device.faults += 1
                self._mark_unhealthy(device, exc)
            log.error("model %s on %s: load failed: %s", entry.name, device.handle.id, exc)
            placement.progress = None
            await trio.to_thread.run_sync(self._close_executors, placement)
            self._placement_failed(entry, device, f"{type(exc).__name__}: {exc}")
            return
        placement.progress = None
        placement.load_seconds = time.perf_counter() - started
        placement.load_cache = "cold" if compiled else "warm"
        if timings:
            placement.latency = statistics.median(timings[1:] if len(timings) > 1 else timings)
        placement.state = PlacementState.READY
        entry.error = None
        self._release_weights(entry)
        log.info("model %s ready on device %s (%s) in %.2f s", entry.name, device.handle.id,
                 device.handle.name, placement.load_seconds)
        self._notify()
        self._dispatch()

    @contextlib.asynccontextmanager
    async def _using_weights(self, entry: _Model) -> AsyncIterator[None]:
        """Around a load or build that reads ``entry``'s weights. When the last one ends and
        the model serves somewhere, the weights are dropped: every Plan holds its own copy
        (bf16 panels, device buffers). Weights from a .bin are read per layer as Plans are
        built and never held (``models.binfile``); generated ones (``random_weights``) are
        fp32 arrays in memory, freed here. A later build reads or generates them again."""
        entry.weight_users += 1
        try:
            yield
        finally:
            entry.weight_users -= 1
            self._release_weights(entry)

    def _release_weights(self, entry: _Model) -> None:
        """Drop ``entry``'s parsed weights when nothing is reading them and it serves."""
        if (entry.weight_users == 0 and entry.layers is not None and not entry.weights_released
                and any(p.state is PlacementState.READY for p in entry.placements.values())):
            for layer in entry.layers:
                layer.weights = []
            entry.weights_released = True
            log.debug("model %s: weights released (its Plans hold their own)", entry.name)
            if self._nursery is not None and self._state in _WORKING:  # pages back, off the loop
                self._nursery.start_soon(trio.to_thread.run_sync, heap.trim)

    def _build_shape(self, entry: _Model, placement: _Placement, device: _Device,
                     key: ShapeKey) -> bool:
        """Start building the Plans of input shapes ``key`` on a ready placement (False when
        that cannot start: the scheduler is stopping, or the model's layers are not read)."""
        if self._nursery is None or self._state not in _WORKING or entry.layers is None:
            return False
        placement.plans.building(key)
        self._nursery.start_soon(self._build, entry, placement, device, key)
        self._notify()
        return True

    async def _build(self, entry: _Model, placement: _Placement, device: _Device,
                     key: ShapeKey) -> None:
        """Build (and warm) one shape key's Plans; then evict past the Plan-cache bounds."""
        warmup = entry.spec.warmup if entry.spec.warmup is not None else self.config.default_warmup
        shapes = format_key(entry.spec.inputs, key)
        assert self._load_limiter is not None
        started = time.perf_counter()
        try:
            await self._prepared(device)
            async with self._load_limiter, self._using_weights(entry):
                executors, _, compiled = await trio.to_thread.run_sync(
                    lambda: _compile_and_warm(
                        device.handle, entry.graph_with_weights(key, self.repository),
                        entry.spec, device.slots, warmup))
        except Exception as exc:  # the jobs waiting for this shape get the reason
            placement.plans.discard(key)
            if is_device_fault(exc):
                device.faults += 1
                self._mark_unhealthy(device, exc)
            log.error("model %s on %s: building Plans for %s failed: %s", entry.name,
                      device.handle.id, shapes, exc)
            error: SchedulerError = (
                BadInput(f"model '{entry.name}': input shapes {shapes}: {exc}")
                if isinstance(exc, ModelFormatError) else InternalError(
                    f"model '{entry.name}': building Plans for input shapes {shapes} on "
                    f"{device.handle.id} failed: {type(exc).__name__}: {exc}"))
            self._shape_failed(entry, key, error)
            self._dispatch()
            return
        if placement.state is not PlacementState.READY or placement.plans.get(key) is None:
            with trio.CancelScope(shield=True):  # unloaded meanwhile: free what was built
                await trio.to_thread.run_sync(self._close_list, device.index, executors)
            return
        placement.plans.ready(key, executors, executors_nbytes(executors))
        log.info("model %s on %s: Plans for %s built in %.2f s%s", entry.name,
                 device.handle.id, shapes, time.perf_counter() - started,
                 " (GLSL compiled)" if compiled else "")
        evicted = placement.plans.evict({job.key for job in entry.queue})
        if evicted:
            log.info("model %s on %s: evicted the Plans of %s (plan cache bounds)",
                     entry.name, device.handle.id,
                     "; ".join(format_key(entry.spec.inputs, e.key) for e in evicted))
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(
                    self._close_list, device.index, [x for e in evicted for x in e.executors])
        self._notify()
        self._dispatch()

    def _shape_failed(self, entry: _Model, key: ShapeKey, error: SchedulerError) -> None:
        """End the queued jobs of input shapes ``key`` that no other device has or builds."""
        elsewhere = any(p.plans.get(key) is not None for i, p in entry.placements.items()
                        if p.state is PlacementState.READY and self._healthy(i))
        if not elsewhere:
            for job in [j for j in entry.queue if j.key == key]:
                self._end(job, error=error)

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
        changed in content (``ModelRepository.fingerprint``: a plain ``touch`` is no change).
        Models whose folders did not change are not touched, so their traffic goes on.

        A reload is load-new-then-swap (``_reload``): the serving version keeps taking jobs
        while the new one loads and warms up on its devices; once it is ready on one of them,
        new and queued jobs go to it and the old version is freed when its running jobs have
        ended (they finish on it). So a model being reloaded is never MODEL_NOT_FOUND nor
        UNAVAILABLE because of the reload. Both versions are resident meanwhile: for a
        moment the model needs its memory twice. A new version that cannot serve (a broken
        folder, unreadable weights, a load failure on every device) is not swapped in: the
        old one keeps serving, the model's ``reload_error`` says why (``models()``,
        ``status()``), a warning naming the folder and the reason is logged and
        ``reload_failures`` counts it. The next rescan tries again; one that finds the files
        back to the serving version clears the error.

        Rescans run one at a time (a second waits for the first). Returns what it loaded,
        removed, reloaded and failed (with why)."""
        self._check_accepting()
        if self.repository is None:
            return RescanResult(loaded=[], removed=[], reloaded=[], failed={})
        async with self._rescan_lock:
            self._check_accepting()
            return await self._rescan(self.repository)

    async def _rescan(self, repository: ModelRepository) -> RescanResult:
        specs = await trio.to_thread.run_sync(_scan_with_fingerprints, repository)
        added: list[str] = []
        changed: list[tuple[_Model, ModelSpec, tuple[Any, ...]]] = []
        for name, (spec, fingerprint) in specs.items():
            entry = self._models.get(name)
            if entry is None or (not entry.unloading and self._model_state(entry) is ModelState.FAILED):
                added.append(name)
            elif entry.unloading:
                continue
            elif entry.fingerprint != fingerprint:
                changed.append((entry, spec, fingerprint))
            elif entry.reload_error is not None:
                log.info("model %s: its files are the serving version's again; reload error "
                         "cleared", name)
                entry.reload_error = None
                self._notify()
        removed = [name for name, entry in self._models.items()
                   if name not in specs and not entry.unloading]
        loaded: list[str] = []
        reloaded: list[str] = []
        failed: dict[str, str] = {}

        async def load(name: str) -> None:
            try:
                await self.load_model(name)
            except SchedulerError as exc:
                failed[name] = exc.message
            else:
                loaded.append(name)

        async def reload(entry: _Model, spec: ModelSpec, fingerprint: tuple[Any, ...]) -> None:
            error = await self._reload(entry, spec, fingerprint)
            if error is None:
                reloaded.append(entry.name)
            else:
                failed[entry.name] = error

        async def unload(name: str) -> None:
            try:
                await self.unload_model(name)
            except SchedulerError as exc:
                failed[name] = exc.message

        async with trio.open_nursery() as nursery:
            for name in added:
                nursery.start_soon(load, name)
            for entry, spec, fingerprint in changed:
                nursery.start_soon(reload, entry, spec, fingerprint)
            for name in removed:
                nursery.start_soon(unload, name)
        if loaded or removed or reloaded or failed:
            log.info("repository rescanned: loaded %s, removed %s, reloaded %s, failed %s",
                     sorted(loaded), sorted(removed), sorted(reloaded), sorted(failed))
        return RescanResult(loaded=sorted(loaded), removed=sorted(removed),
                            reloaded=sorted(reloaded), failed=dict(sorted(failed.items())))

    async def _reload(self, old: _Model, spec: ModelSpec, fingerprint: tuple[Any, ...]
                      ) -> str | None:
        """Load ``spec`` as a new version of ``old`` beside it and swap it in once ready
        (see ``rescan``); None on success, else why not (``old`` keeps serving). The work
        runs in the scheduler's nursery, so a caller that goes away does not leave a new
        version half loaded."""
        assert self._nursery is not None
        outcome: list[str | None] = []
        done = trio.Event()

        async def task() -> None:
            try:
                outcome.append(await self._load_new_version(old, spec, fingerprint))
            finally:
                done.set()

        self._nursery.start_soon(task)
        await done.wait()
        return outcome[0] if outcome else "the scheduler stopped during the reload"

    async def _load_new_version(self, old: _Model, spec: ModelSpec,
                                fingerprint: tuple[Any, ...]) -> str | None:
        name = old.name
        if spec.error:
            self._reload_failed(old, spec, spec.error)
            return spec.error
        new = _Model(spec, fingerprint=fingerprint)
        self._pending[name] = new  # until swapped in or freed; at stop, freed with the rest
        self._notify()
        log.info("model %s: loading the new version beside the serving one", name)
        await self._load(new, self._begin_placements(new, None))
        serving = sorted(i for i, p in new.placements.items()
                         if p.state is PlacementState.READY and self._healthy(i))
        if self._models.get(name) is not old or old.unloading or self._state not in _WORKING:
            await self._free_version(new)
            return f"model '{name}' was unloaded (or the scheduler stopped) during its reload"
        if not serving:
            error = self._model_error(new)
            await self._free_version(new)
            self._reload_failed(old, spec, error)
            return error
        # the swap: one synchronous step, so no job sees the model missing or unservable
        moved = len(old.queue) if _same_io(old.spec, new.spec) else 0
        if moved:
            new.queue.extend(old.queue)
            old.queue.clear()
        old.retired = True
        self._models[name] = new
        self._retiring.append(old)
        del self._pending[name]
        log.info("model %s: reloaded; the new version serves on device(s) %s (%d queued "
                 "job(s) moved to it); the previous one is freed once its %d running job(s) "
                 "end", name, serving, moved, old.running)
        self._nursery.start_soon(self._retire, old)  # type: ignore[union-attr]
        self._notify()
        self._dispatch()
        return None

    def _reload_failed(self, old: _Model, spec: ModelSpec, error: str) -> None:
        old.reload_error = error
        self._reload_failures[old.name] = self._reload_failures.get(old.name, 0) + 1
        log.warning("model %s: reload of %s failed; the previous version keeps serving: %s",
                    old.name, spec.path, error)
        self._notify()

    async def _free_version(self, entry: _Model) -> None:
        """Free a version that never served (a failed or abandoned reload)."""
        placements = list(entry.placements.values())
        for placement in placements:
            placement.state = PlacementState.FAILED
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: [self._close_executors(p) for p in placements])
        if self._pending.get(entry.name) is entry:
            del self._pending[entry.name]
        self._notify()

    async def _retire(self, old: _Model) -> None:
        """Free a version replaced by a reload once its jobs have ended. Cancelled at stop,
        it stays in ``_retiring`` and is freed with everything else."""
        await self._wait_for(lambda: not old.queue and old.running == 0 and not any(
            p.state is PlacementState.LOADING for p in old.placements.values()))
        placements = list(old.placements.values())
        freed = [p.device for p in placements if p.state is PlacementState.READY]
        for placement in placements:
            placement.state = PlacementState.FAILED  # nothing may take an instance from here on
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: [self._close_executors(p) for p in placements])
        self._retiring.remove(old)
        log.info("model %s: previous version freed from device(s) %s", old.name, freed)
        self._notify()

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
            for scope in entry.load_scopes:  # a load in progress stops: nothing will use it
                scope.cancel()
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
            inputs={n: s.dims() for n, s in entry.spec.inputs.items()},
            outputs={n: list(s) for n, s in entry.spec.outputs.items()},
            devices=(ready := sorted(i for i, p in entry.placements.items()
                                     if p.state is PlacementState.READY and self._healthy(i))),
            device_names=[self._devices[i].handle.id for i in ready],
            placements=[
                PlacementInfo(device=i, state=p.state, error=p.error, healthy=self._healthy(i),
                              latency_ms=None if p.latency is None else p.latency * 1e3,
                              load_seconds=p.load_seconds, load_cache=p.load_cache,
                              in_flight=p.running,
                              shapes=[format_key(entry.spec.inputs, k) for k in p.plans.ready_keys()],
                              progress=p.progress, name=self._devices[i].handle.id)
                for i, p in sorted(entry.placements.items())
            ],
            queue_depth=sum(len(m.queue) for m in self._versions(entry.name)),
            in_flight=sum(m.running for m in self._versions(entry.name)),
            queue_limit=entry.spec.queue_limit or self.config.queue_limit_per_model,
            precision=entry.spec.precision,
            error=self._model_error(entry) if state is ModelState.FAILED else None,
            reloading=entry.name in self._pending,
            reload_error=entry.reload_error,
            reload_failures=self._reload_failures.get(entry.name, 0),
            max_batch_size=entry.spec.max_batch_size,
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
            in_flight=sum(map(len, device.members.values())),
            models=sorted(held),
            latency_ms={n: None if p.latency is None else p.latency * 1e3
                        for n, p in sorted(held.items())},
            mean_latency_ms=(device.run_seconds / device.runs * 1e3) if device.runs else None,
            runs=device.runs,
            inline_runs=device.inline_runs,
            inputs_in_place=device.inputs_in_place,
            shared_inputs_copied=device.shared_inputs_copied,
            completed=device.completed,
            faults=device.faults,
            memory=device.handle.memory_stats(),
            pipeline_cache=device.handle.cache_stats(),
        )

    def status(self) -> Status:
        """Devices (health, queue depth, in-flight jobs, models, latency; memory and
        pipeline-cache counters of an opened Vulkan device), per-model queues, job totals
        since start, and discovery's GPU problem if any."""
        if self._placement_stale:
            self._dispatch()  # the per-device queue depths of every job admitted so far
        return Status(
            state=self._state,
            ready=self.ready(),
            devices=[self._device_status(d) for d in self._devices.values()],
            models={name: ModelQueue(self._model_state(m),
                                     sum(len(v.queue) for v in self._versions(name)),
                                     sum(v.running for v in self._versions(name)),
                                     reload_error=m.reload_error,
                                     reload_failures=self._reload_failures.get(name, 0))
                    for name, m in sorted(self._models.items())},
            queue_depth=sum(len(m.queue) for m in self._entries()),
            in_flight=sum(len(m) for d in self._devices.values() for m in d.members.values()),
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

