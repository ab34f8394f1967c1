"""The Vulkan side of a PipelineCache: GLSL compiles, pipeline creation and the
driver's VkPipelineCache object (cache/ stays free of Vulkan)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from vkserve.cache.cache_file import DeviceIdentity, driver_blob_problem
from vkserve.cache.pipeline_cache import PipelineRequest, ShaderSource
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.context import VulkanContext, _track
from vkserve.devices.vulkan.driver_quirks import broken_pipeline_cache
from vkserve.devices.vulkan.errors import check, vk_errors
from vkserve.devices.vulkan.pipeline import ComputePipeline
from vkserve.devices.vulkan.reflect import reflect
from vkserve.devices.vulkan.shader_options import ShaderOptions

log = logging.getLogger(__name__)

# Option bits of the SPIR-V cache key of each mode (ShaderOptions.bits).
OPTION_BITS = {p: ShaderOptions.for_precision(p).bits for p in Precision}


class VulkanPipelineBackend:
    def __init__(self, ctx: VulkanContext) -> None:
        self.ctx = ctx
        self.identity = DeviceIdentity.from_caps(ctx.caps)
        self.subgroup_size = ctx.caps.subgroup_size
        self.handle: Any = None
        # Set on a driver whose pipeline cache is known broken: then no VkPipelineCache.
        self.driver_cache_bypass = broken_pipeline_cache(ctx.caps)
        # The driver cache is internally synchronised for pipeline creation and data reads;
        # the lock only keeps its destruction from racing a read.
        self._lock = threading.Lock()

    def compile(self, shader: ShaderSource, option_bits: int) -> bytes:
        return compile_glsl(shader.source, caps=self.ctx.caps,
                            precision=ShaderOptions.from_bits(option_bits),
                            name=f"{shader.shader_id}.comp")

    def create_pipeline(self, spirv: bytes, request: PipelineRequest) -> ComputePipeline:
        layout = reflect(spirv)
        return ComputePipeline(self.ctx, spirv, layout.binding_count, layout.push_constant_size,
                               request.spec_constants, request.local_size, self.handle,
                               [layout.kind(i) for i in range(layout.binding_count)])

    def open_driver_cache(self, initial_data: bytes) -> None:
        if self.driver_cache_bypass is not None:
            log.warning("device %d (%s): not using the driver's pipeline cache: %s "
                        "(metric vkserve_pipeline_cache_errors_total{op=\"driver_bypass\"})",
                        self.ctx.caps.index, self.ctx.caps.name, self.driver_cache_bypass.reason)
            return
        vk = self.ctx.vk
        data = vk.ffi.from_buffer(initial_data) if initial_data else None
        info = vk.VkPipelineCacheCreateInfo(initialDataSize=len(initial_data),
                                            pInitialData=data)
        with vk_errors("vkCreatePipelineCache"):
            self.handle = vk.vkCreatePipelineCache(self.ctx.device, info, None)
        _track("VkPipelineCache", +1)

    def driver_cache_data(self) -> bytes:
        if self.handle is None:  # bypassed (or closed): nothing to save
            return b""
        vk = self.ctx.vk
        ffi, lib = vk.ffi, vk.lib
        size = ffi.new("size_t*")
        with self._lock:
            check(lib.vkGetPipelineCacheData(self.ctx.device, self.handle, size, ffi.NULL),
                  "vkGetPipelineCacheData")
            buf = ffi.new("char[]", size[0])
            check(lib.vkGetPipelineCacheData(self.ctx.device, self.handle, size, buf),
                  "vkGetPipelineCacheData")
        blob = bytes(ffi.buffer(buf, size[0]))
        problem = driver_blob_problem(blob, self.identity)
        if problem:
            log.warning("device %d: not saving the driver's pipeline cache: %s",
                        self.ctx.caps.index, problem)
            return b""
        return blob

    def close_driver_cache(self) -> None:
        with self._lock:
            if self.handle is not None:
                self.ctx.vk.vkDestroyPipelineCache(self.ctx.device, self.handle, None)
                self.handle = None
                _track("VkPipelineCache", -1)
