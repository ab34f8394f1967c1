"""Storage images and samplers, for shaders written with the dialect's image types
(`NCNN_image_shader`, `imfmt1`/`imfmt4`, `image{1,2,3}d_*` helpers).

An `Image` is a 1D, 2D or 3D VkImage of one of the four dialect formats, kept in
VK_IMAGE_LAYOUT_GENERAL so one image can be both a sampler source (texelFetch) and a
storage image (imageStore); `upload`/`download` go through a staging buffer.

Engine layers with an image implementation (Pooling) read their input from an image instead
of the arena buffer when ``VKSERVE_IMAGES=1`` (`images_wanted`; the Plan copies the blob into
a per-instance image before the dispatch): ncnn's ``use_image_storage``, opt-in because the
copy costs more than texture reads save for the engine's layers.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
from typing import Any

import numpy as np

from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.context import MemoryKind, VulkanContext, _track
from vkserve.devices.vulkan.errors import vk_errors
from vkserve.devices.vulkan.shader_options import ShaderOptions

log = logging.getLogger(__name__)


class ImageFormat(enum.Enum):
    """The formats `imfmt1`/`imfmt4` expand to: (VkFormat name, channels, numpy dtype)."""

    R32F = ("VK_FORMAT_R32_SFLOAT", 1, np.float32)
    RGBA32F = ("VK_FORMAT_R32G32B32A32_SFLOAT", 4, np.float32)
    R16F = ("VK_FORMAT_R16_SFLOAT", 1, np.float16)
    RGBA16F = ("VK_FORMAT_R16G16B16A16_SFLOAT", 4, np.float16)

    @property
    def channels(self) -> int:
        return int(self.value[1])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.value[2])

    @classmethod
    def for_storage(cls, channels: int, fp16: bool) -> ImageFormat:
        """imfmt1 (channels 1) or imfmt4 (4) with fp32 or fp16 storage."""
        table = {(1, False): cls.R32F, (4, False): cls.RGBA32F,
                 (1, True): cls.R16F, (4, True): cls.RGBA16F}
        return table[(channels, fp16)]


_TYPES = {1: ("VK_IMAGE_TYPE_1D", "VK_IMAGE_VIEW_TYPE_1D"),
          2: ("VK_IMAGE_TYPE_2D", "VK_IMAGE_VIEW_TYPE_2D"),
          3: ("VK_IMAGE_TYPE_3D", "VK_IMAGE_VIEW_TYPE_3D")}


class Image:
    """A device-local image with its memory and view, in the GENERAL layout."""

    def __init__(self, ctx: VulkanContext, extent: tuple[int, int, int], dims: int,
                 fmt: ImageFormat) -> None:
        if dims not in _TYPES:
            raise ValueError(f"image dimensions must be 1, 2 or 3, not {dims}")
        if any(e < 1 for e in extent) or (dims < 3 and extent[2] != 1) or (
                dims < 2 and extent[1] != 1):
            raise ValueError(f"extent {extent} does not fit a {dims}D image")
        vk = ctx.vk
        self.ctx, self.extent, self.dims, self.format = ctx, extent, dims, fmt
        self.handle = self.memory = self.view = None
        image_type, view_type = (getattr(vk, n) for n in _TYPES[dims])
        vk_format = getattr(vk, fmt.value[0])
        usage = (vk.VK_IMAGE_USAGE_STORAGE_BIT | vk.VK_IMAGE_USAGE_SAMPLED_BIT
                 | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT)
        try:
            info = vk.VkImageCreateInfo(
                imageType=image_type, format=vk_format,
                extent=vk.VkExtent3D(width=extent[0], height=extent[1], depth=extent[2]),
                mipLevels=1, arrayLayers=1, samples=vk.VK_SAMPLE_COUNT_1_BIT,
                tiling=vk.VK_IMAGE_TILING_OPTIMAL, usage=usage,
                sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE,
                initialLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED)
            with vk_errors(f"vkCreateImage({dims}D {extent} {fmt.name})"):
                self.handle = vk.vkCreateImage(ctx.device, info, None)
            _track("VkImage", +1)
            req = vk.vkGetImageMemoryRequirements(ctx.device, self.handle)
            type_index, _ = ctx.pick_memory_type(req.memoryTypeBits, MemoryKind.DEVICE)
            alloc = vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=type_index)
            with vk_errors(f"vkAllocateMemory({req.size} bytes, image)"):
                self.memory = vk.vkAllocateMemory(ctx.device, alloc, None)
            _track("VkDeviceMemory", +1)
            with vk_errors("vkBindImageMemory"):
                vk.vkBindImageMemory(ctx.device, self.handle, self.memory, 0)
            view = vk.VkImageViewCreateInfo(
                image=self.handle, viewType=view_type, format=vk_format,
                subresourceRange=self._range())
            with vk_errors("vkCreateImageView"):
                self.view = vk.vkCreateImageView(ctx.device, view, None)
            _track("VkImageView", +1)
            ctx.run_once(lambda cmd: self._barrier(cmd, vk.VK_IMAGE_LAYOUT_UNDEFINED))
        except BaseException:
            self.destroy()
            raise

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape of the texels: (depth, height, width, channels) trimmed to `dims`."""
        w, h, d = self.extent
        return (d, h, w)[3 - self.dims:] + (self.format.channels,)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.format.dtype.itemsize

    def _range(self) -> Any:
        vk = self.ctx.vk
        return vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0,
                                          levelCount=1, baseArrayLayer=0, layerCount=1)

    def _barrier(self, cmd: Any, old_layout: int) -> None:
        """Everything before (transfers, shaders) completes and is visible to everything after."""
        vk = self.ctx.vk
        access = vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT
        barrier = vk.VkImageMemoryBarrier(
            srcAccessMask=access, dstAccessMask=access, oldLayout=old_layout,
            newLayout=vk.VK_IMAGE_LAYOUT_GENERAL,
            srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
            dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
            image=self.handle, subresourceRange=self._range())
        stages = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
        vk.vkCmdPipelineBarrier(cmd, stages, stages, 0, 0, None, 0, None, 1, [barrier])

    def copy_region(self, buffer_offset: int = 0) -> Any:
        """The whole image as a VkBufferImageCopy of tightly packed texels from `buffer_offset`."""
        vk = self.ctx.vk
        w, h, d = self.extent
        layers = vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0,
                                             baseArrayLayer=0, layerCount=1)
        return vk.VkBufferImageCopy(bufferOffset=buffer_offset, bufferRowLength=0, bufferImageHeight=0,
                                    imageSubresource=layers,
                                    imageOffset=vk.VkOffset3D(x=0, y=0, z=0),
                                    imageExtent=vk.VkExtent3D(width=w, height=h, depth=d))

    def upload(self, texels: np.ndarray) -> None:
        """Write every texel; `texels` has `shape` (or as many elements) of the format's dtype."""
        data = np.ascontiguousarray(texels, dtype=self.format.dtype)
        if data.size * data.itemsize != self.nbytes:
            raise ValueError(f"image upload: {data.size} values for an image of shape {self.shape}")
        vk, ctx = self.ctx.vk, self.ctx
        staging = ctx.create_buffer(self.nbytes, MemoryKind.HOST)
        try:
            staging.array(np.uint8, self.nbytes)[...] = data.view(np.uint8).reshape(-1)
            staging.flush()

            def body(cmd: Any) -> None:
                vk.vkCmdCopyBufferToImage(cmd, staging.handle, self.handle,
                                          vk.VK_IMAGE_LAYOUT_GENERAL, 1, [self.copy_region()])
                self._barrier(cmd, vk.VK_IMAGE_LAYOUT_GENERAL)

            ctx.run_once(body)
        finally:
            staging.destroy()

    def download(self) -> np.ndarray:
        """Every texel, as an array of `shape`."""
        vk, ctx = self.ctx.vk, self.ctx
        staging = ctx.create_buffer(self.nbytes, MemoryKind.HOST)
        try:
            def body(cmd: Any) -> None:
                self._barrier(cmd, vk.VK_IMAGE_LAYOUT_GENERAL)
                vk.vkCmdCopyImageToBuffer(cmd, self.handle, vk.VK_IMAGE_LAYOUT_GENERAL,
                                          staging.handle, 1, [self.copy_region()])

            ctx.run_once(body)
            staging.invalidate()
            return staging.array(self.format.dtype, int(np.prod(self.shape))).copy().reshape(self.shape)
        finally:
            staging.destroy()

    def destroy(self) -> None:
        vk, dev = self.ctx.vk, self.ctx.device
        for attr, fn, kind in (("view", vk.vkDestroyImageView, "VkImageView"),
                               ("handle", vk.vkDestroyImage, "VkImage"),
                               ("memory", vk.vkFreeMemory, "VkDeviceMemory")):
            obj = getattr(self, attr)
            if obj is not None:
                fn(dev, obj, None)
                setattr(self, attr, None)
                _track(kind, -1)


class Sampler:
    """A nearest, clamp-to-edge sampler: texelFetch ignores its filtering, but a combined
    image sampler descriptor needs one."""

    def __init__(self, ctx: VulkanContext) -> None:
        vk = ctx.vk
        self.ctx = ctx
        clamp = vk.VK_SAMPLER_ADDRESS_MODE_CLAMP_TO_EDGE
        info = vk.VkSamplerCreateInfo(
            magFilter=vk.VK_FILTER_NEAREST, minFilter=vk.VK_FILTER_NEAREST,
            mipmapMode=vk.VK_SAMPLER_MIPMAP_MODE_NEAREST, addressModeU=clamp,
            addressModeV=clamp, addressModeW=clamp, maxLod=0.0,
            borderColor=vk.VK_BORDER_COLOR_FLOAT_TRANSPARENT_BLACK)
        with vk_errors("vkCreateSampler"):
            self.handle = vk.vkCreateSampler(ctx.device, info, None)
        _track("VkSampler", +1)

    def destroy(self) -> None:
        if self.handle is not None:
            self.ctx.vk.vkDestroySampler(self.ctx.device, self.handle, None)
            self.handle = None
            _track("VkSampler", -1)


@dataclasses.dataclass(frozen=True)
class ImageBinding:
    """An image in a descriptor set: a combined image sampler when `sampler` is given
    (GLSL `uniform samplerND`), else a storage image (`uniform imageND`)."""

    image: Image
    sampler: Sampler | None = None


def images_wanted(caps: DeviceCaps, precision: Precision, extent: tuple[int, int, int]) -> bool:
    """Whether a layer with an image implementation reads an input of `extent` (w, h, c) from a
    3D image: ``VKSERVE_IMAGES=1`` (anything else but unset, ``0`` or ``auto`` is logged and
    taken as off), the image options supported by the device in this precision, and the extent
    within maxImageDimension3D."""
    mode = os.environ.get("VKSERVE_IMAGES", "0")
    if mode not in ("0", "1", "auto"):
        log.warning("VKSERVE_IMAGES=%r is not 0 or 1: taken as 0", mode)
    if mode != "1":
        return False
    options = ShaderOptions.for_precision(precision).replace(image_storage=True)
    limit = int(caps.properties.get("maxImageDimension3D", 256))
    return not options.problems(caps) and max(extent) <= limit
