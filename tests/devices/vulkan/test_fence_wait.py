"""Fence waits: polled first on GPUs (NVIDIA's blocking wait returned 45-115 us late on an H200),
blocking at once on CPU devices (lavapipe's own threads need the cores) and for all but one
waiting thread; ``VKSERVE_FENCE_POLL_US`` overrides. Real fences on lavapipe."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import numpy as np
import pytest

from vkserve.devices.vulkan.context import FENCE_POLL_US, MemoryKind, VulkanContext, fence_poll_seconds
from vkserve.devices.vulkan.errors import VulkanError


def test_gpus_poll_cpu_devices_block(vulkan_caps):
    gpu = dataclasses.replace(vulkan_caps, type="discrete-gpu")
    assert fence_poll_seconds(gpu, {}) == FENCE_POLL_US / 1e6 > 0
    assert fence_poll_seconds(vulkan_caps, {}) == 0.0  # lavapipe: type "cpu"
    assert fence_poll_seconds(gpu, {"VKSERVE_FENCE_POLL_US": "0"}) == 0.0
    assert fence_poll_seconds(vulkan_caps, {"VKSERVE_FENCE_POLL_US": "500"}) == 0.0005


@pytest.mark.parametrize("raw", ["-1", "fast", "1.5"])
def test_a_bad_setting_is_named_and_the_default_kept(vulkan_caps, caplog, raw):
    gpu = dataclasses.replace(vulkan_caps, type="integrated-gpu")
    with caplog.at_level(logging.WARNING, logger="vkserve.devices.vulkan.context"):
        assert fence_poll_seconds(gpu, {"VKSERVE_FENCE_POLL_US": raw}) == FENCE_POLL_US / 1e6
    assert f"VKSERVE_FENCE_POLL_US={raw!r}" in caplog.text


@pytest.fixture
def polling_ctx(vulkan_caps, monkeypatch):
    monkeypatch.setenv("VKSERVE_FENCE_POLL_US", "200000")
    ctx = VulkanContext(vulkan_caps)
    assert ctx.fence_poll_s == 0.2
    yield ctx
    ctx.destroy()


def test_polled_waits_see_the_work_done(polling_ctx):
    """A copy's wait returns once the copy has run, through the polling path."""
    data = np.arange(1 << 16, dtype=np.float32)
    src = polling_ctx.create_buffer(data.nbytes, MemoryKind.HOST)
    dst = polling_ctx.create_buffer(data.nbytes, MemoryKind.HOST)
    try:
        src.array(np.float32)[:] = data
        src.flush()
        for _ in range(5):
            polling_ctx.copy(src, dst, data.nbytes)
            dst.invalidate()
            np.testing.assert_array_equal(dst.array(np.float32), data)
    finally:
        src.destroy()
        dst.destroy()


def test_polling_gives_up_after_its_time(polling_ctx):
    """A fence nothing will signal: the poll returns False after its budget, and a bounded
    wait then fails naming VK_TIMEOUT."""
    fence = polling_ctx.create_fence()
    try:
        t0 = time.perf_counter()
        assert polling_ctx._poll_fence(fence, 0.02) is False
        assert 0.02 <= time.perf_counter() - t0 < 1.0
        with pytest.raises(VulkanError, match="VK_TIMEOUT"):
            polling_ctx.wait_fence(fence, timeout_s=0.05)
    finally:
        polling_ctx.destroy_fence(fence)


def test_one_thread_polls_the_others_block(polling_ctx):
    """While one wait holds the poll, another thread's wait blocks in the driver and still
    returns when its fence signals."""
    held = polling_ctx._poll_lock.acquire(blocking=False)
    assert held
    try:
        done = threading.Event()
        src = polling_ctx.create_buffer(4096, MemoryKind.HOST)
        dst = polling_ctx.create_buffer(4096, MemoryKind.HOST)
        try:
            worker = threading.Thread(target=lambda: (polling_ctx.copy(src, dst, 4096), done.set()))
            worker.start()
            worker.join(30)
            assert done.is_set()
        finally:
            src.destroy()
            dst.destroy()
    finally:
        polling_ctx._poll_lock.release()
