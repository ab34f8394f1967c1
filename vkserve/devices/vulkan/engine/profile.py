"""Per-dispatch GPU time of a Plan, from timestamp queries (vkCmdWriteTimestamp).

A profiling PlanInstance records one timestamp before the first dispatch and one after each
dispatch (compute-shader stage), so step k's time is t[k+1] - t[k]: its own execution plus
any wait its barrier imposed. The tuner and `vkserve profile` use it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from vkserve.devices.vulkan.context import VulkanContext, _track
from vkserve.devices.vulkan.engine.plan import Plan, PlanInstance
from vkserve.devices.vulkan.errors import check, vk_errors


class DispatchProfiler:
    """A timestamp query pool for `steps` dispatches."""

    def __init__(self, ctx: VulkanContext, steps: int) -> None:
        if not ctx.caps.timestamp_period_ns:
            raise RuntimeError(f"device {ctx.caps.index} ({ctx.caps.name}) has no timestamps "
                               "on its compute queue")
        vk = ctx.vk
        self.ctx = ctx
        self.count = steps + 1
        info = vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                                        queryCount=self.count)
        with vk_errors("vkCreateQueryPool"):
            self.pool = vk.vkCreateQueryPool(ctx.device, info, None)
        _track("VkQueryPool", +1)

    def record_start(self, cmd: Any) -> None:
        vk = self.ctx.vk
        vk.vkCmdResetQueryPool(cmd, self.pool, 0, self.count)
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self.pool, 0)

    def record_step(self, cmd: Any, k: int) -> None:
        vk = self.ctx.vk
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, self.pool, k + 1)

    def durations_ms(self) -> np.ndarray:
        """Step times of the last completed submission, in milliseconds."""
        vk = self.ctx.vk
        ffi = vk.ffi
        data = ffi.new("uint64_t[]", self.count)
        check(vk.lib.vkGetQueryPoolResults(self.ctx.device, self.pool, 0, self.count,
                                           8 * self.count, data, 8,
                                           vk.VK_QUERY_RESULT_64_BIT
                                           | vk.VK_QUERY_RESULT_WAIT_BIT),
              "vkGetQueryPoolResults")
        ticks = np.frombuffer(ffi.buffer(data, 8 * self.count), dtype=np.uint64).astype(np.int64)
        return np.diff(ticks) * self.ctx.caps.timestamp_period_ns / 1e6

    def destroy(self) -> None:
        if self.pool is not None:
            self.ctx.vk.vkDestroyQueryPool(self.ctx.device, self.pool, None)
            self.pool = None
            _track("VkQueryPool", -1)


@dataclasses.dataclass
class StepTime:
    index: int
    label: str  # "<layer name> (<type>) <shader>"
    shader: str
    groups: tuple[int, int, int]
    ms: float  # median over the runs


def profile_plan(plan: Plan, inputs: Mapping[str, np.ndarray], runs: int = 10,
                 warmup: int = 3) -> tuple[list[StepTime], float]:
    """Median per-dispatch GPU time over `runs` replays, and the median sum."""
    profiler = DispatchProfiler(plan.ctx, len(plan.steps))
    instance = PlanInstance(plan, profiler)
    try:
        samples = []
        for i in range(warmup + runs):
            instance.run(inputs)
            if i >= warmup:
                samples.append(profiler.durations_ms())
    finally:
        instance.destroy()
        profiler.destroy()
    per_step = np.median(np.stack(samples), axis=0)
    total = float(statistics.median(float(s.sum()) for s in samples))
    steps = [StepTime(k, step.label, step.shader, step.groups, float(ms))
             for k, (step, ms) in enumerate(zip(plan.steps, per_step))]
    return steps, total
