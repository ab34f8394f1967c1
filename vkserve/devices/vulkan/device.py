"""A usable Vulkan device: its context plus its PipelineCache."""

from __future__ import annotations

from pathlib import Path

from vkserve.cache.pipeline_cache import PipelineCache, PipelineRequest, SpirvModule
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.compiler import check_options
from vkserve.devices.vulkan.context import VulkanContext
from vkserve.devices.vulkan.engine.pool import MemoryPool
from vkserve.devices.vulkan.host_import import HostImports
from vkserve.devices.vulkan.pipeline import ComputePipeline, SpecValue
from vkserve.devices.vulkan.pipeline_backend import VulkanPipelineBackend
from vkserve.devices.vulkan.shader_options import ShaderOptions
from vkserve.devices.vulkan.shader_registry import builtin_shader


class VulkanDevice:
    def __init__(self, caps: DeviceCaps, cache_dir: Path | None,
                 pool_budget_bytes: int | None = None) -> None:
        self.caps = caps
        self.ctx = VulkanContext(caps)
        try:
            backend = VulkanPipelineBackend(self.ctx)
            self.pipelines = PipelineCache(backend, cache_dir)
            if backend.driver_cache_bypass is not None:  # the backend logged it
                self.pipelines.count_error("driver_bypass")
        except BaseException:
            self.ctx.destroy()
            raise
        # Weights, arenas and staging buffers of the Plans on this device (engine.plan).
        self.pool = MemoryPool(self.ctx, pool_budget_bytes)
        # Clients' shared-memory regions the Plans' runs read in place.
        self.imports = HostImports(self.ctx)

    def pipeline(self, shader_id: str, precision: Precision | ShaderOptions,
                 local_size: tuple[int, int, int] = (64, 1, 1),
                 spec_constants: tuple[SpecValue, ...] = ()) -> ComputePipeline:
        """A built-in shader's pipeline from the cache (built on first use), in a precision
        mode or any combination of option bits the device supports."""
        options = check_options(self.caps, precision).replace(
            debug_printf=self.ctx.instance.validation)
        request = PipelineRequest(builtin_shader(shader_id), options.bits,
                                  local_size, tuple(spec_constants))
        return self.pipelines.pipeline(request)  # type: ignore[return-value]

    def spirv_pipeline(self, name: str, code: bytes,
                       local_size: tuple[int, int, int] = (64, 1, 1),
                       spec_constants: tuple[SpecValue, ...] = ()) -> ComputePipeline:
        """A raw SPIR-V module's pipeline from the cache, keyed by the module's hash (created
        through the driver cache on first use; the SPIR-V itself is not stored)."""
        request = PipelineRequest(SpirvModule(name, code), 0, local_size, tuple(spec_constants))
        return self.pipelines.pipeline(request)  # type: ignore[return-value]

    def close(self, save: bool = True) -> None:
        try:
            if save:
                self.pipelines.save()
        finally:
            self.imports.close()
            self.pool.close()
            self.pipelines.close()
            self.ctx.destroy()

    def __enter__(self) -> "VulkanDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
