"""Pipeline-cache completeness: raw SPIR-V modules as tier-1 artifacts keyed by their hash
(created through the driver cache, no GLSL compile), and the per-driver list of broken
driver pipeline caches (cache bypassed, one WARNING, counted as op driver_bypass)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vkserve.cache.cache_file import DeviceIdentity, decode_cache_file
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan import driver_quirks
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.context import MemoryKind, VulkanContext
from vkserve.devices.vulkan.descriptors import DescriptorPool
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.pipeline import ComputePipeline

ADD = """#version 450
layout (local_size_x = 16) in;
layout (binding = 0) buffer b { float data[]; };
void main() { data[gl_GlobalInvocationID.x] += float(K); }
"""
N = 64


def run(ctx: VulkanContext, pipeline: ComputePipeline, data: np.ndarray) -> np.ndarray:
    vk = ctx.vk
    buf = ctx.create_buffer(data.nbytes, MemoryKind.DEVICE)
    pool = DescriptorPool(ctx, 1, 1)
    try:
        ctx.upload(buf, data)
        dset = pool.allocate(pipeline.set_layout, [(buf, 0, buf.size)])

        def body(cmd: Any) -> None:
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                       0, 1, [dset], 0, None)
            vk.vkCmdDispatch(cmd, data.size // 16, 1, 1)

        ctx.run_once(body)
        return ctx.download(buf, data.dtype, data.size)
    finally:
        pool.destroy()
        buf.destroy()


def test_raw_spirv_modules_are_cached_by_hash(vulkan_caps: DeviceCaps, tmp_path: Path) -> None:
    add3 = compile_glsl(ADD, caps=vulkan_caps, precision=Precision.FP32, defines={"K": 3})
    add5 = compile_glsl(ADD, caps=vulkan_caps, precision=Precision.FP32, defines={"K": 5})
    x = np.arange(N, dtype=np.float32)
    dev = VulkanDevice(vulkan_caps, tmp_path)
    try:
        assert dev.pipelines.backend.handle is not None  # pipelines go through the driver cache
        first = dev.spirv_pipeline("add", add3)
        assert dev.spirv_pipeline("add", bytes(add3)) is first  # same words: a hit
        other = dev.spirv_pipeline("add", add5)  # same name, other words: its own pipeline
        again = dev.spirv_pipeline("add", add3, local_size=(16, 1, 1))  # other request key
        assert other is not first and again is not first
        stats = dev.pipelines.stats
        assert (stats.pipeline_hits, stats.pipeline_misses, stats.glsl_compiles) == (1, 3, 0)
        np.testing.assert_array_equal(run(dev.ctx, first, x), x + 3)
        np.testing.assert_array_equal(run(dev.ctx, other, x), x + 5)
    finally:
        dev.close(save=True)
    # raw modules are not written to the SPIR-V tier (the caller holds them)
    identity = DeviceIdentity.from_caps(vulkan_caps)
    contents = decode_cache_file((tmp_path / identity.file_name()).read_bytes(), identity)
    assert contents.spirv == {}


def test_broken_driver_cache_is_bypassed(vulkan_caps: DeviceCaps, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    # fault injection: put this device's driver on the list
    entry = driver_quirks.BrokenPipelineCache(vendor_id=vulkan_caps.vendor_id,
                                             reason="injected by the test")
    monkeypatch.setattr(driver_quirks, "BROKEN_PIPELINE_CACHES", (entry,))
    x = np.linspace(-4, 4, N, dtype=np.float32)
    with caplog.at_level(logging.WARNING):
        dev = VulkanDevice(vulkan_caps, tmp_path)
    try:
        assert dev.pipelines.backend.handle is None
        assert dev.pipelines.stats.errors()["driver_bypass"] == 1
        assert any("not using the driver's pipeline cache: injected by the test" in r.message
                   for r in caplog.records)
        # pipelines still build and run, without a driver cache
        add = dev.spirv_pipeline("add", compile_glsl(ADD, caps=vulkan_caps,
                                                     precision=Precision.FP32, defines={"K": 2}))
        np.testing.assert_array_equal(run(dev.ctx, add, x), x + 2)
        dev.pipeline("relu", Precision.FP32)
    finally:
        dev.close(save=True)
    identity = DeviceIdentity.from_caps(vulkan_caps)
    contents = decode_cache_file((tmp_path / identity.file_name()).read_bytes(), identity)
    assert contents.driver_blob == b"" and contents.spirv  # GLSL's SPIR-V tier still saved


def test_broken_list_matches_by_vendor_and_api_version(vulkan_caps: DeviceCaps) -> None:
    v = driver_quirks.vk_version
    adreno = dataclasses.replace(vulkan_caps, vendor_id=0x5143, api_version=v(1, 0, 65))
    assert driver_quirks.broken_pipeline_cache(adreno) is not None
    fixed = dataclasses.replace(adreno, api_version=v(1, 0, 66))
    assert driver_quirks.broken_pipeline_cache(fixed) is None
    assert driver_quirks.broken_pipeline_cache(vulkan_caps) is None  # lavapipe: not listed
