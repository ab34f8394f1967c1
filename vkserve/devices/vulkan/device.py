"""A usable Vulkan device: its context plus its PipelineCache."""

from __future__ import annotations

from pathlib import Path

from vkserve.cache.pipeline_cache import PipelineCache, PipelineRequest
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.compiler import check_precision
from vkserve.devices.vulkan.context import VulkanContext
from vkserve.devices.vulkan.engine.pool import MemoryPool
from vkserve.devices.vulkan.pipeline import ComputePipeline, SpecValue
from vkserve.devices.vulkan.pipeline_backend import OPTION_BITS, VulkanPipelineBackend
from vkserve.devices.vulkan.shader_registry import builtin_shader


class VulkanDevice:
    def __init__(self, caps: DeviceCaps, cache_dir: Path | None,
                 pool_budget_bytes: int | None = None) -> None:
        self.caps = caps
        self.ctx = VulkanContext(caps)
        try:
            self.pipelines = PipelineCache(VulkanPipelineBackend(self.ctx), cache_dir)
        except BaseException:
            self.ctx.destroy()
            raise
        # Weights, arenas and staging buffers of the Plans on this device (engine.plan).
        self.pool = MemoryPool(self.ctx, pool_budget_bytes)

    def pipeline(self, shader_id: str, precision: Precision,
                 local_size: tuple[int, int, int] = (64, 1, 1),
                 spec_constants: tuple[SpecValue, ...] = ()) -> ComputePipeline:
        """A built-in shader's pipeline from the cache (built on first use)."""
        check_precision(self.caps, precision)
        request = PipelineRequest(builtin_shader(shader_id), OPTION_BITS[Precision(precision)],
                                  local_size, tuple(spec_constants))
        return self.pipelines.pipeline(request)  # type: ignore[return-value]

    def close(self, save: bool = True) -> None:
        try:
            if save:
                self.pipelines.save()
        finally:
            self.pool.close()
            self.pipelines.close()
            self.ctx.destroy()

    def __enter__(self) -> "VulkanDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
