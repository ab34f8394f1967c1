"""Descriptor pools and sets: storage buffers, and the dialect's samplers and storage images.

Sets of storage buffers only (every built-in shader's) are written with a descriptor update
template (Vulkan 1.1 core; one per set layout and binding count, made on first use and
destroyed with the pool): one vkUpdateDescriptorSetWithTemplate from a packed array of
VkDescriptorBufferInfo instead of a VkWriteDescriptorSet per binding. Sets with images, and
devices or instances below Vulkan 1.1, use vkUpdateDescriptorSets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vkserve.devices.vulkan.context import Buffer, VulkanContext, _track
from vkserve.devices.vulkan.errors import vk_errors
from vkserve.devices.vulkan.image import ImageBinding

# A binding's resource: (buffer, offset, range) or an image (with a sampler: combined).
Resource = tuple[Buffer, int, int] | ImageBinding


class DescriptorPool:
    """A pool sized for `max_sets` sets of up to `max_buffers` storage buffers and
    `max_images` images of each kind in total."""

    def __init__(self, ctx: VulkanContext, max_sets: int, max_buffers: int,
                 max_images: int = 0, use_templates: bool | None = None) -> None:
        vk = ctx.vk
        self.ctx = ctx
        v11 = vk.VK_MAKE_VERSION(1, 1, 0)
        supported = ctx.caps.api_version >= v11 and ctx.instance.api_version >= v11
        # None: whenever supported; False: never (benchmarks compare the two)
        self.use_templates = supported if use_templates is None else use_templates and supported
        self._templates: dict[tuple[int, int], Any] = {}
        sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                         descriptorCount=max(max_buffers, 1))]
        if max_images:
            sizes += [vk.VkDescriptorPoolSize(type=t, descriptorCount=max_images)
                      for t in (vk.VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER,
                                vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE)]
        info = vk.VkDescriptorPoolCreateInfo(maxSets=max_sets, poolSizeCount=len(sizes),
                                             pPoolSizes=sizes)
        with vk_errors("vkCreateDescriptorPool"):
            self.handle = vk.vkCreateDescriptorPool(ctx.device, info, None)
        _track("VkDescriptorPool", +1)

    def allocate(self, set_layout: Any, resources: Sequence[Resource]) -> Any:
        """Allocate one set and point binding i at resources[i]."""
        vk = self.ctx.vk
        info = vk.VkDescriptorSetAllocateInfo(descriptorPool=self.handle, descriptorSetCount=1,
                                              pSetLayouts=[set_layout])
        with vk_errors("vkAllocateDescriptorSets"):
            dset = vk.vkAllocateDescriptorSets(self.ctx.device, info)[0]
        if self.use_templates and resources and not any(
                isinstance(r, ImageBinding) for r in resources):
            self._update_with_template(set_layout, dset, resources)  # type: ignore[arg-type]
            return dset
        writes = [self._write(vk, dset, i, r) for i, r in enumerate(resources)]
        if writes:
            vk.vkUpdateDescriptorSets(self.ctx.device, len(writes), writes, 0, None)
        return dset

    def _template(self, set_layout: Any, count: int) -> Any:
        vk = self.ctx.vk
        key = (int(vk.ffi.cast("uintptr_t", set_layout)), count)
        template = self._templates.get(key)
        if template is None:
            stride = vk.ffi.sizeof("VkDescriptorBufferInfo")
            entries = [vk.VkDescriptorUpdateTemplateEntry(
                dstBinding=i, dstArrayElement=0, descriptorCount=1,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, offset=i * stride,
                stride=stride) for i in range(count)]
            info = vk.VkDescriptorUpdateTemplateCreateInfo(
                pDescriptorUpdateEntries=entries,
                templateType=vk.VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_DESCRIPTOR_SET,
                descriptorSetLayout=set_layout)
            with vk_errors("vkCreateDescriptorUpdateTemplate"):
                template = vk.vkCreateDescriptorUpdateTemplate(self.ctx.device, info, None)
            _track("VkDescriptorUpdateTemplate", +1)
            self._templates[key] = template
        return template

    def _update_with_template(self, set_layout: Any, dset: Any,
                              buffers: Sequence[tuple[Buffer, int, int]]) -> None:
        vk = self.ctx.vk
        data = vk.ffi.new("VkDescriptorBufferInfo[]", len(buffers))
        for i, (buf, offset, size) in enumerate(buffers):
            data[i].buffer, data[i].offset, data[i].range = buf.handle, offset, size
        vk.lib.vkUpdateDescriptorSetWithTemplate(
            self.ctx.device, dset, self._template(set_layout, len(buffers)), data)

    @staticmethod
    def _write(vk: Any, dset: Any, binding: int, resource: Resource) -> Any:
        if isinstance(resource, ImageBinding):
            sampler = resource.sampler
            info = vk.VkDescriptorImageInfo(
                sampler=sampler.handle if sampler is not None else vk.VK_NULL_HANDLE,
                imageView=resource.image.view, imageLayout=vk.VK_IMAGE_LAYOUT_GENERAL)
            kind = (vk.VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER if sampler is not None
                    else vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE)
            return vk.VkWriteDescriptorSet(dstSet=dset, dstBinding=binding, descriptorCount=1,
                                           descriptorType=kind, pImageInfo=[info])
        buf, offset, size = resource
        return vk.VkWriteDescriptorSet(
            dstSet=dset, dstBinding=binding, descriptorCount=1,
            descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=buf.handle, offset=offset, range=size)])

    def destroy(self) -> None:
        for template in self._templates.values():
            self.ctx.vk.vkDestroyDescriptorUpdateTemplate(self.ctx.device, template, None)
            _track("VkDescriptorUpdateTemplate", -1)
        self._templates.clear()
        if self.handle is not None:
            self.ctx.vk.vkDestroyDescriptorPool(self.ctx.device, self.handle, None)
            self.handle = None
            _track("VkDescriptorPool", -1)
