"""A compute pipeline and its layout objects, built from SPIR-V.

Bindings 0..n-1 are storage buffers unless `descriptor_kinds` names a binding's kind
(the dialect's samplers and storage images, from `reflect`); specialization constants
0..k-1 come from the caller and 233/234/235 carry the local size (the compiler injects
`local_size_{x,y,z}_id` for them, see devices.vulkan.compiler).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from vkserve.devices.vulkan.context import VulkanContext, _track
from vkserve.devices.vulkan.errors import vk_errors
from vkserve.devices.vulkan.reflect import DescriptorKind

LOCAL_SIZE_IDS = (233, 234, 235)

SpecValue = int | float

DESCRIPTOR_TYPES = {DescriptorKind.STORAGE_BUFFER: "VK_DESCRIPTOR_TYPE_STORAGE_BUFFER",
                    DescriptorKind.SAMPLED_IMAGE: "VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER",
                    DescriptorKind.STORAGE_IMAGE: "VK_DESCRIPTOR_TYPE_STORAGE_IMAGE"}


def descriptor_type(vk: Any, kind: DescriptorKind) -> int:
    return int(getattr(vk, DESCRIPTOR_TYPES[kind]))


def pack_scalars(values: Sequence[SpecValue]) -> bytes:
    """Pack ints as int32 (uint32 when too large) and floats as float32, 4 bytes each."""
    out = bytearray()
    for v in values:
        if isinstance(v, bool) or isinstance(v, int):
            out += struct.pack("<I" if v > 0x7FFFFFFF else "<i", int(v))
        else:
            out += struct.pack("<f", float(v))
    return bytes(out)


class ComputePipeline:
    def __init__(
        self,
        ctx: VulkanContext,
        spirv: bytes,
        binding_count: int,
        push_constant_size: int = 0,
        spec_constants: Sequence[SpecValue] = (),
        local_size: tuple[int, int, int] = (64, 1, 1),
        vk_pipeline_cache: Any = None,
        descriptor_kinds: Sequence[DescriptorKind] = (),
    ) -> None:
        vk = ctx.vk
        self.ctx = ctx
        self.binding_count = binding_count
        self.descriptor_kinds = tuple(
            descriptor_kinds[i] if i < len(descriptor_kinds) else DescriptorKind.STORAGE_BUFFER
            for i in range(binding_count))
        self.push_constant_size = push_constant_size
        self.local_size = local_size
        self.shader_module = self.set_layout = self.layout = self.handle = None
        try:
            with vk_errors("vkCreateShaderModule"):
                self.shader_module = vk.vkCreateShaderModule(
                    ctx.device, vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv), None)
            _track("VkShaderModule", +1)
            bindings = [
                vk.VkDescriptorSetLayoutBinding(
                    binding=i, descriptorType=descriptor_type(vk, kind),
                    descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                for i, kind in enumerate(self.descriptor_kinds)
            ]
            with vk_errors("vkCreateDescriptorSetLayout"):
                self.set_layout = vk.vkCreateDescriptorSetLayout(
                    ctx.device, vk.VkDescriptorSetLayoutCreateInfo(
                        bindingCount=len(bindings), pBindings=bindings or None), None)
            _track("VkDescriptorSetLayout", +1)
            ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                             offset=0, size=push_constant_size)]
            with vk_errors("vkCreatePipelineLayout"):
                self.layout = vk.vkCreatePipelineLayout(ctx.device, vk.VkPipelineLayoutCreateInfo(
                    setLayoutCount=1, pSetLayouts=[self.set_layout],
                    pushConstantRangeCount=1 if push_constant_size else 0,
                    pPushConstantRanges=ranges if push_constant_size else None), None)
            _track("VkPipelineLayout", +1)

            ids = list(range(len(spec_constants))) + list(LOCAL_SIZE_IDS)
            data = pack_scalars(list(spec_constants) + list(local_size))
            entries = [vk.VkSpecializationMapEntry(constantID=cid, offset=4 * i, size=4)
                       for i, cid in enumerate(ids)]
            spec = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries,
                                           dataSize=len(data), pData=vk.ffi.from_buffer(data))
            stage = vk.VkPipelineShaderStageCreateInfo(
                stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.shader_module, pName="main",
                pSpecializationInfo=spec)
            info = vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)
            with vk_errors("vkCreateComputePipelines"):
                self.handle = vk.vkCreateComputePipelines(
                    ctx.device, vk_pipeline_cache or vk.VK_NULL_HANDLE, 1, [info], None)[0]
            _track("VkPipeline", +1)
        except BaseException:
            self.destroy()
            raise

    def destroy(self) -> None:
        vk, dev = self.ctx.vk, self.ctx.device
        for attr, fn, kind in (("handle", vk.vkDestroyPipeline, "VkPipeline"),
                               ("layout", vk.vkDestroyPipelineLayout, "VkPipelineLayout"),
                               ("set_layout", vk.vkDestroyDescriptorSetLayout,
                                "VkDescriptorSetLayout"),
                               ("shader_module", vk.vkDestroyShaderModule, "VkShaderModule")):
            obj = getattr(self, attr)
            if obj is not None:
                fn(dev, obj, None)
                setattr(self, attr, None)
                _track(kind, -1)
