"""Descriptor pools and sets for storage-buffer bindings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vkserve.devices.vulkan.context import Buffer, VulkanContext, _track
from vkserve.devices.vulkan.errors import vk_errors


class DescriptorPool:
    """A pool sized for `max_sets` sets of up to `max_buffers` storage buffers in total."""

    def __init__(self, ctx: VulkanContext, max_sets: int, max_buffers: int) -> None:
        vk = ctx.vk
        self.ctx = ctx
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       descriptorCount=max(max_buffers, 1))
        info = vk.VkDescriptorPoolCreateInfo(maxSets=max_sets, poolSizeCount=1, pPoolSizes=[size])
        with vk_errors("vkCreateDescriptorPool"):
            self.handle = vk.vkCreateDescriptorPool(ctx.device, info, None)
        _track("VkDescriptorPool", +1)

    def allocate(self, set_layout: Any, buffers: Sequence[tuple[Buffer, int, int]]) -> Any:
        """Allocate one set and point binding i at buffers[i] = (buffer, offset, range)."""
        vk = self.ctx.vk
        info = vk.VkDescriptorSetAllocateInfo(descriptorPool=self.handle, descriptorSetCount=1,
                                              pSetLayouts=[set_layout])
        with vk_errors("vkAllocateDescriptorSets"):
            dset = vk.vkAllocateDescriptorSets(self.ctx.device, info)[0]
        writes = [
            vk.VkWriteDescriptorSet(
                dstSet=dset, dstBinding=i, descriptorCount=1,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=buf.handle, offset=offset,
                                                       range=size)])
            for i, (buf, offset, size) in enumerate(buffers)
        ]
        if writes:
            vk.vkUpdateDescriptorSets(self.ctx.device, len(writes), writes, 0, None)
        return dset

    def destroy(self) -> None:
        if self.handle is not None:
            self.ctx.vk.vkDestroyDescriptorPool(self.ctx.device, self.handle, None)
            self.handle = None
            _track("VkDescriptorPool", -1)
