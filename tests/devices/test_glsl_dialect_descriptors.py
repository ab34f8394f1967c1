"""Descriptor update templates: storage-buffer sets written through
vkUpdateDescriptorSetWithTemplate bind the same buffers as vkUpdateDescriptorSets (the
shader reads and writes every binding), one template per set layout, none left behind."""

import numpy as np
import pytest

from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.context import LIVE_OBJECTS, MemoryKind
from vkserve.devices.vulkan.descriptors import DescriptorPool
from vkserve.devices.vulkan.pipeline import ComputePipeline

BINDINGS = 6
SOURCE = "#version 450\nlayout (local_size_x = 16) in;\n" + "".join(
    f"layout (binding = {i}) buffer b{i} {{ float d{i}[]; }};\n" for i in range(BINDINGS)
) + "void main() {\n    uint g = gl_GlobalInvocationID.x;\n" + "".join(
    f"    d{i}[g] = d{i}[g] * 2.0 + d{(i + 1) % BINDINGS}[g];\n" for i in range(BINDINGS - 1)
) + "}\n"
N = 32


@pytest.mark.parametrize("templates", [True, False])
def test_template_writes_bind_the_same_buffers(vulkan_caps, vulkan_ctx, templates):
    ctx, vk = vulkan_ctx, vulkan_ctx.vk
    spirv = compile_glsl(SOURCE, caps=vulkan_caps, precision=Precision.FP32, name="bindings")
    data = [np.arange(N, dtype=np.float32) * (i + 1) for i in range(BINDINGS)]
    # each binding at its own offset inside one buffer: offsets and ranges matter too
    stride = 256
    buf = ctx.create_buffer(stride * BINDINGS, MemoryKind.DEVICE)
    before = LIVE_OBJECTS["VkDescriptorUpdateTemplate"]
    pipeline = ComputePipeline(ctx, spirv, BINDINGS, local_size=(16, 1, 1))
    pool = DescriptorPool(ctx, 2, 2 * BINDINGS, use_templates=templates)
    try:
        assert pool.use_templates is templates  # lavapipe is Vulkan 1.3
        for i, d in enumerate(data):
            ctx.upload(buf, d, offset=i * stride)
        ranges = [(buf, i * stride, N * 4) for i in range(BINDINGS)]
        sets = [pool.allocate(pipeline.set_layout, ranges) for _ in range(2)]
        made = LIVE_OBJECTS["VkDescriptorUpdateTemplate"] - before
        assert made == (1 if templates else 0)  # one per layout, reused by the second set

        def body(cmd):
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                       0, 1, [sets[1]], 0, None)
            vk.vkCmdDispatch(cmd, N // 16, 1, 1)

        ctx.run_once(body)
        got = [ctx.download(buf, np.float32, N, offset=i * stride) for i in range(BINDINGS)]
    finally:
        pool.destroy()
        pipeline.destroy()
        buf.destroy()
    assert LIVE_OBJECTS["VkDescriptorUpdateTemplate"] == before
    for i in range(BINDINGS - 1):
        np.testing.assert_array_equal(got[i], data[i] * 2 + data[i + 1])
    np.testing.assert_array_equal(got[-1], data[-1])
