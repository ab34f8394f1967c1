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
from vkserve.devices.vulkan.errors import check, vk_errors
from vkserve.devices.vulkan.pipeline import ComputePipeline
from vkserve.devices.vulkan.reflect import reflect

log = logging.getLogger(__name__)

# Option bits of the SPIR-V cache key (bit 0 packed, bit 1 storage, bit 2 arithmetic).
OPTION_BITS = {Precision.FP32: 0b000, Precision.FP16_PACKED: 0b001,
               Precision.FP16_STORAGE: 0b010, Precision.FP16_ARITHMETIC: 0b110}
PRECISION_OF_BITS = {bits: p for p, bits in OPTION_BITS.items()}


class VulkanPipelineBackend:
    def __init__(self, ctx: VulkanContext) -> None:
        self.ctx = ctx
        self.identity = DeviceIdentity.from_caps(ctx.caps)
        self.subgroup_size = ctx.caps.subgroup_size
        self.handle: Any = None
        # The driver cache is internally synchronised for pipeline creation and data reads;
        # the lock only keeps its destruction from racing a read.
        self._lock = threading.Lock()

    def compile(self, shader: ShaderSource, option_bits: int) -> bytes:
        return compile_glsl(shader.source, caps=self.ctx.caps,
                            precision=PRECISION_OF_BITS[option_bits],
                            name=f"{shader.shader_id}.comp")

    def create_pipeline(self, spirv: bytes, request: PipelineRequest) -> ComputePipeline:
        layout = reflect(spirv)
        return ComputePipeline(self.ctx, spirv, layout.binding_count, layout.push_constant_size,
                               request.spec_constants, request.local_size, self.handle)

    def open_driver_cache(self, initial_data: bytes) -> None:
        vk = self.ctx.vk
        data = vk.ffi.from_buffer(initial_data) if initial_data else None
        info = vk.VkPipelineCacheCreateInfo(initialDataSize=len(initial_data),
                                            pInitialData=data)
        with vk_errors("vkCreatePipelineCache"):
            self.handle = vk.vkCreatePipelineCache(self.ctx.device, info, None)
        _track("VkPipelineCache", +1)

    def driver_cache_data(self) -> bytes:
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
