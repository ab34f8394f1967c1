"""The dialect's image types (imfmt1/imfmt4/imfmtc*, unfp) and every image helper
(image{1,2,3}d_ld/st/cp{1,4,8}), compiled with NCNN_image_shader and run on real VkImages
(samplers and storage images) of the Vulkan device in fp32 and fp16 image formats, against
numpy. Inputs are multiples of 1/64 in [-8, 8]: exact in every mode."""

from pathlib import Path

import numpy as np
import pytest

from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.descriptors import DescriptorPool
from vkserve.devices.vulkan.image import Image, ImageBinding, ImageFormat, Sampler
from vkserve.devices.vulkan.pipeline import ComputePipeline
from vkserve.devices.vulkan.reflect import DescriptorKind, reflect
from vkserve.devices.vulkan.shader_options import ShaderOptions, StorageKind

SOURCE = (Path(__file__).parent / "shaders" / "dialect_images.comp").read_text()
W = 5  # 8-wide elements along x: images are 2W texels wide
EXTENTS = {1: (2 * W, 1, 1), 2: (2 * W, 3, 1), 3: (2 * W, 3, 2)}
MODES = [
    ShaderOptions(image_storage=True),
    ShaderOptions(image_storage=True, fp16_packed=True),
    ShaderOptions(image_storage=True, fp16_storage=True),
    ShaderOptions(image_storage=True, fp16_storage=True, fp16_arithmetic=True),
    ShaderOptions(image_storage=True, fp16_packed=True, fp16_arithmetic=True, fp16_uniform=True),
]
OUTPUTS = [("st1", 1), ("st4", 4), ("st8", 4), ("cp1", 1), ("cp4", 4), ("cp8", 4)]


def run_images(ctx, spirv, sources, outputs, groups):
    """Bind the images in order (sources as samplers, outputs as storage images), dispatch."""
    vk = ctx.vk
    layout = reflect(spirv)
    kinds = [layout.kind(i) for i in range(layout.binding_count)]
    assert kinds == [DescriptorKind.SAMPLED_IMAGE] * len(sources) + [
        DescriptorKind.STORAGE_IMAGE] * len(outputs)
    sampler = Sampler(ctx)
    pipeline = ComputePipeline(ctx, spirv, layout.binding_count, spec_constants=[W],
                               local_size=(1, 1, 1), descriptor_kinds=kinds)
    pool = DescriptorPool(ctx, 1, 0, max_images=len(kinds))
    try:
        dset = pool.allocate(pipeline.set_layout, [ImageBinding(i, sampler) for i in sources]
                             + [ImageBinding(i) for i in outputs])

        def body(cmd):
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                       0, 1, [dset], 0, None)
            vk.vkCmdDispatch(cmd, *groups)

        ctx.run_once(body)
    finally:
        pool.destroy()
        pipeline.destroy()
        sampler.destroy()


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("options", MODES, ids=lambda o: o.label)
def test_every_image_helper_on_real_images(vulkan_caps, vulkan_ctx, options, dims):
    assert not options.problems(vulkan_caps), options.problems(vulkan_caps)
    spirv = compile_glsl(SOURCE, caps=vulkan_caps, precision=options, defines={"DIM": dims},
                         name="dialect_images.comp")
    fp16 = options.storage is not StorageKind.FP32
    extent = EXTENTS[dims]
    rng = np.random.default_rng(dims)
    images = []
    try:
        src1 = Image(vulkan_ctx, extent, dims, ImageFormat.for_storage(1, fp16))
        images.append(src1)
        src4 = Image(vulkan_ctx, extent, dims, ImageFormat.for_storage(4, fp16))
        images.append(src4)
        a1 = rng.integers(-512, 513, src1.shape) / 64
        a4 = rng.integers(-512, 513, src4.shape) / 64
        src1.upload(a1)
        src4.upload(a4)
        outs = {}
        for name, channels in OUTPUTS:
            outs[name] = Image(vulkan_ctx, extent, dims, ImageFormat.for_storage(channels, fp16))
            images.append(outs[name])
        run_images(vulkan_ctx, spirv, [src1, src4], list(outs.values()), (W,) + extent[1:])
        got = {name: img.download().astype(np.float64) for name, img in outs.items()}
    finally:
        for img in images:
            img.destroy()

    def swap_pairs(a):  # texels 2x and 2x+1 exchanged along x
        s = a.shape
        return a.reshape(s[:-2] + (W, 2, s[-1]))[..., ::-1, :].reshape(s)

    def mirror_elements(a):  # 8-wide element x <- element W-1-x
        s = a.shape
        return a.reshape(s[:-2] + (W, 2, s[-1]))[..., ::-1, :, :].reshape(s)

    want = {"st1": a1 * 2 + 1, "st4": a4 * 2 + 1, "st8": a4 * 2 + 1,
            "cp1": swap_pairs(a1), "cp4": swap_pairs(a4), "cp8": mirror_elements(a4)}
    for name, _ in OUTPUTS:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_image_type_macros(vulkan_caps):
    from vkserve.devices.vulkan.glsl_extension import type_macros

    fp32 = type_macros(ShaderOptions(image_storage=True), vulkan_caps)
    fp16 = type_macros(ShaderOptions(image_storage=True, fp16_storage=True), vulkan_caps)
    assert (fp32["imfmt1"], fp32["imfmt4"], fp32["unfp"]) == ("r32f", "rgba32f", "highp")
    assert (fp16["imfmt1"], fp16["imfmt4"], fp16["unfp"]) == ("r16f", "rgba16f", "mediump")
    assert (fp16["imfmtc1"], fp16["imfmtc4"]) == ("r16f", "rgba16f")
