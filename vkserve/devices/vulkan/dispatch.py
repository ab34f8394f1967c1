"""Run one compiled shader once: numpy in, numpy out.

This is the test-and-debug path (one pipeline, one submit, everything created
and destroyed per call). Model execution records command buffers once and
replays them instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vkserve.devices.vulkan.context import MemoryKind, VulkanContext
from vkserve.devices.vulkan.descriptors import DescriptorPool
from vkserve.devices.vulkan.pipeline import ComputePipeline, SpecValue, pack_scalars


def dispatch(
    ctx: VulkanContext,
    spirv: bytes,
    buffers: Sequence[np.ndarray],
    *,
    global_size: tuple[int, int, int] | int,
    local_size: tuple[int, int, int] | int = (64, 1, 1),
    push_constants: bytes | Sequence[SpecValue] | np.ndarray = b"",
    spec_constants: Sequence[SpecValue] = (),
    timeout_s: float = 60.0,
) -> list[np.ndarray]:
    """Bind `buffers` as storage buffers 0..n-1, dispatch over `global_size` invocations
    (rounded up to whole workgroups) and return every buffer's contents afterwards, each
    with the dtype and shape it came in with."""
    gsize = _xyz(global_size)
    lsize = _xyz(local_size)
    if isinstance(push_constants, np.ndarray):
        push = np.ascontiguousarray(push_constants).tobytes()
    elif isinstance(push_constants, bytes):
        push = push_constants
    else:
        push = pack_scalars(push_constants)
    groups = tuple(math.ceil(g / max(l, 1)) for g, l in zip(gsize, lsize))

    vk = ctx.vk
    arrays = [np.ascontiguousarray(b) for b in buffers]
    gpu = []
    pipeline = pool = None
    try:
        for a in arrays:
            buf = ctx.create_buffer(max(a.nbytes, 4), MemoryKind.DEVICE)
            gpu.append(buf)
            if a.nbytes:
                ctx.upload(buf, a)
        pipeline = ComputePipeline(ctx, spirv, len(arrays), len(push), spec_constants, lsize)
        pool = DescriptorPool(ctx, 1, len(arrays))
        dset = pool.allocate(pipeline.set_layout, [(b, 0, b.size) for b in gpu])

        def body(cmd: object) -> None:
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                       0, 1, [dset], 0, None)
            if push:
                vk.vkCmdPushConstants(cmd, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                      len(push), vk.ffi.from_buffer(push))
            vk.vkCmdDispatch(cmd, *groups)

        ctx.run_once(body, timeout_s)
        return [ctx.download(b, a.dtype, a.size).reshape(a.shape) for a, b in zip(arrays, gpu)]
    finally:
        if pool is not None:
            pool.destroy()
        if pipeline is not None:
            pipeline.destroy()
        for b in gpu:
            b.destroy()


def _xyz(v: tuple[int, int, int] | int) -> tuple[int, int, int]:
    if isinstance(v, int):
        return (v, 1, 1)
    t = tuple(v) + (1,) * (3 - len(v))
    return (int(t[0]), int(t[1]), int(t[2]))
