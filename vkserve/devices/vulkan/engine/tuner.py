"""The local-size tuner (after Compute Library's CLTuner; the table it fills and the lookup
Plans use are engine.tuning).

Measurement: unlike CLTuner (one run each, no warm-up), each candidate runs `warmup + runs`
times, interleaved round-robin with the others inside one command buffer so that clock
changes hit all alike; each timed run sits between a barrier and two timestamps, and the
median counts. The default local size is the baseline; a candidate replaces it only when its
median is faster by more than `margin` (a fraction), so noise does not churn the table, and
then again in a head-to-head rerun against the default (the fastest of hundreds of noisy
medians is biased low; on an H100 without the rerun nearly every dispatch "improved").
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from vkserve.devices.progress import ProgressFn
from vkserve.devices.vulkan.descriptors import DescriptorPool
from vkserve.devices.vulkan.engine.plan import Plan, PlanInstance, Step
from vkserve.devices.vulkan.engine.profile import DispatchProfiler
from vkserve.devices.vulkan.engine.tuning import (
    LocalSize,
    TunedEntry,
    TuningKey,
    TuningTable,
    candidates,
    limits_for,
    tunable,
)
from vkserve.devices.vulkan.layers.base import Dispatch

CONFIRM_RUNS = 4  # the finalist's head-to-head against the default: this many times `runs`


@dataclasses.dataclass
class DispatchResult:
    """One distinct dispatch: where it first occurs in the Plan and what tuning found."""

    step: int
    label: str
    shader: str
    global_size: LocalSize
    default_local_size: LocalSize
    best_local_size: LocalSize
    default_ms: float
    best_ms: float
    candidates: int
    occurrences: int

    @property
    def improved(self) -> bool:
        return self.best_local_size != self.default_local_size


def _measure(plan: Plan, instance: PlanInstance, step: Step, dispatch: Dispatch,
             sizes: list[LocalSize], runs: int, warmup: int) -> list[float]:
    """Median GPU time (ms) of `dispatch` with each local size, on the plan's real buffers."""
    device, ctx = plan.device, plan.ctx
    vk = ctx.vk
    workers = max(1, min(8, os.cpu_count() or 1, len(sizes)))
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        pipelines = list(ex.map(lambda ls: device.pipeline(
            dispatch.shader, plan.precision, ls, tuple(dispatch.spec_constants)), sizes))
    buffers = {"weights": plan.weights, "arena": instance.arena, "staging": instance.staging}
    bufs = [(buffers[b.buffer], b.offset, b.size) for b in step.bindings]
    pool = DescriptorPool(ctx, len(sizes), len(sizes) * max(1, len(bufs)))
    timed = len(sizes) * runs
    profiler = DispatchProfiler(ctx, 2 * timed)
    try:
        sets = [pool.allocate(p.set_layout, bufs[:p.binding_count]) for p in pipelines]
        groups = [tuple(-(-g // s) for g, s in zip(dispatch.global_size, ls)) for ls in sizes]
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        access = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
        slot: list[list[int]] = [[] for _ in sizes]  # profiler step index of each timed run

        def record(cmd: Any) -> None:
            profiler.record_start(cmd)
            mark = 0
            for r in range(warmup + runs):
                for c, (pipe, dset) in enumerate(zip(pipelines, sets)):
                    mb = vk.VkMemoryBarrier(srcAccessMask=access, dstAccessMask=access)
                    vk.vkCmdPipelineBarrier(cmd, compute, compute, 0, 1, [mb], 0, None, 0, None)
                    if r >= warmup:
                        profiler.record_step(cmd, mark)
                    vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.handle)
                    vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                               pipe.layout, 0, 1, [dset], 0, None)
                    push = step.push[:pipe.push_constant_size]
                    if push:
                        vk.vkCmdPushConstants(cmd, pipe.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                              0, len(push), vk.ffi.from_buffer(push))
                    vk.vkCmdDispatch(cmd, *groups[c])
                    if r >= warmup:
                        profiler.record_step(cmd, mark + 1)
                        slot[c].append(mark + 1)  # durations[k] = t[k+1] - t[k]
                        mark += 2

        ctx.run_once(record, timeout_s=600.0)
        durations = profiler.durations_ms()
    finally:
        profiler.destroy()
        pool.destroy()
    return [float(statistics.median(durations[k] for k in ks)) for ks in slot]


def tune_plan(plan: Plan, inputs: Mapping[str, np.ndarray], table: TuningTable,
              mode: str = "normal", runs: int = 5, warmup: int = 1, margin: float = 0.03,
              progress: ProgressFn | None = None) -> list[DispatchResult]:
    """Tune every distinct tunable dispatch of `plan` and record the winners in `table`.

    The plan's inputs are run once first so the buffers hold realistic values. A candidate
    wins only when its median beats the default's by more than `margin` (fraction), first
    among all candidates and then again head to head with the default; the entry is stored
    either way (so a tuned default is known to be the best).

    The candidate pipelines stay alive in the device's PipelineCache until the device closes,
    and many live pipelines slow every dispatch on some drivers (3.7x on an H100 with 600):
    tune on a device of its own and close it with save=False (`vkserve tune` does).
    ``progress`` hears of each distinct dispatch tuned."""
    if runs < 1 or warmup < 0 or margin < 0:
        raise ValueError("runs >= 1, warmup >= 0 and margin >= 0 required")
    limits = limits_for(plan.device)
    groups: dict[TuningKey, list[int]] = {}
    for k, step in enumerate(plan.steps):
        d = step.dispatch
        if d is not None and tunable(d):
            groups.setdefault(TuningKey.of(d, plan.precision), []).append(k)
    results = []
    with plan.acquire() as inst:
        inst.run(inputs)
        for key, ks in groups.items():
            step = plan.steps[ks[0]]
            d: Dispatch = step.dispatch
            default = tuple(d.local_size)
            sizes = [default] + [c for c in candidates(d.global_size, limits, mode) if c != default]
            times = _measure(plan, inst, step, d, sizes, runs, warmup)  # type: ignore[arg-type]
            best = min(range(len(sizes)), key=lambda i: times[i])
            default_ms, best_ms = times[0], times[best]
            if best and best_ms < default_ms * (1.0 - margin):
                # The minimum of many noisy medians is biased low (the winner's curse): the
                # finalist must beat the default again, head to head, with more runs.
                default_ms, best_ms = _measure(plan, inst, step, d,  # type: ignore[arg-type]
                                               [default, sizes[best]], CONFIRM_RUNS * runs, warmup)
            if not (best and best_ms < default_ms * (1.0 - margin)):
                best, best_ms = 0, default_ms
            table.put(key, TunedEntry(sizes[best], round(default_ms, 6), round(best_ms, 6)))
            result = DispatchResult(ks[0], step.label, d.shader, tuple(d.global_size),  # type: ignore[arg-type]
                                    default, sizes[best], default_ms, best_ms, len(sizes),
                                    len(ks))
            results.append(result)
            if progress is not None:
                progress(len(results), len(groups), step.label)
    return results


def summarize(results: Iterable[DispatchResult]) -> dict[str, Any]:
    """Totals weighted by how often each dispatch occurs in the plan."""
    rs = list(results)
    return {"dispatches_measured": len(rs), "dispatches_improved": sum(r.improved for r in rs),
            "default_ms": sum(r.default_ms * r.occurrences for r in rs),
            "best_ms": sum(r.best_ms * r.occurrences for r in rs)}
