import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vkserve.devices import discovery
from vkserve.devices.capabilities import DeviceKind
from vkserve.devices.vulkan.context import LIVE_OBJECTS, MemoryKind, VulkanContext
from vkserve.devices.vulkan.errors import VulkanError

REQUIRED_KEYS = {
    "device": str, "kind": str, "name": str, "type": str, "vendor_id": int, "device_id": int,
    "driver_version": int, "api_version": str, "pipeline_cache_uuid": str, "fp16_storage": bool,
    "fp16_arithmetic": bool, "subgroup_size": int, "heaps": list,
}


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vkserve", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


def test_devices_json_schema():
    out = run_cli("devices", "--json")
    assert out.returncode == 0, out.stderr
    devices = json.loads(out.stdout)
    # one name per device: vulkan:N in the loader's order, then cpu
    assert [d["device"] for d in devices] == [f"vulkan:{k}" for k in range(len(devices) - 1)] + ["cpu"]
    for d in devices:
        for key, typ in REQUIRED_KEYS.items():
            assert isinstance(d[key], typ), (key, d[key])
        assert all(isinstance(h["size"], int) and h["size"] > 0 for h in d["heaps"])
    kinds = [d["kind"] for d in devices]
    assert kinds[-1] == "cpu" and kinds.count("cpu") == 1
    gpu = devices[0]
    assert gpu["kind"] == "vulkan", "lavapipe must be enumerated"
    assert len(bytes.fromhex(gpu["pipeline_cache_uuid"])) == 16
    assert gpu["subgroup_size"] >= 1
    assert gpu["api_version"].count(".") == 2


def test_devices_table_lists_every_device():
    devices = json.loads(run_cli("devices", "--json").stdout)
    out = run_cli("devices")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["device", "kind", "name"]
    rows = lines[1:1 + len(devices)]
    for row, d in zip(rows, devices, strict=True):
        assert row.split()[:2] == [d["device"], d["kind"]] and d["name"] in row


@pytest.mark.parametrize("env", [
    {"VK_DRIVER_FILES": "{empty}", "VK_ICD_FILENAMES": "{empty}"},  # no ICD
    {"LD_LIBRARY_PATH": "{empty}", "VKSERVE_TEST_HIDE_LOADER": "1"},  # no loader at all
])
def test_no_vulkan_yields_cpu_only_with_reason(tmp_path, env):
    env = {k: v.format(empty=tmp_path) for k, v in env.items()}
    args = ["devices", "--json"]
    if "VKSERVE_TEST_HIDE_LOADER" in env:
        # Make `import vulkan` fail the way a missing libvulkan.so.1 does.
        code = ("import builtins, sys; real = builtins.__import__\n"
                "def imp(name, *a, **k):\n"
                "    if name == 'vulkan': raise OSError('cannot load library libvulkan.so.1')\n"
                "    return real(name, *a, **k)\n"
                "builtins.__import__ = imp\n"
                "from vkserve.cli.main import main; sys.exit(main(sys.argv[1:]))")
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=120)
    else:
        out = run_cli(*args, env=env)
    assert out.returncode == 0, out.stderr
    devices = json.loads(out.stdout)
    assert [d["kind"] for d in devices] == ["cpu"]
    reasons = [line for line in out.stderr.splitlines() if "no Vulkan GPU" in line]
    assert len(reasons) == 1, out.stderr
    assert ("VK_ERROR_INCOMPATIBLE_DRIVER" in reasons[0] or "libvulkan" in reasons[0])


def test_failing_driver_query_yields_cpu_only(monkeypatch, caplog):
    import vkserve.devices.vulkan.caps as caps_mod

    def broken(instance, index):
        raise VulkanError("vkGetPhysicalDeviceProperties2", "VK_ERROR_DEVICE_LOST")

    monkeypatch.setattr(caps_mod, "read_caps", broken)
    with caplog.at_level(logging.WARNING):
        devices = discovery.discover_devices()
    assert [d.kind for d in devices] == [DeviceKind.CPU]
    assert any("VK_ERROR_DEVICE_LOST" in r.getMessage() for r in caplog.records)


def test_capabilities_of_lavapipe(vulkan_caps):
    c = vulkan_caps
    assert c.is_software and c.type == "cpu"
    assert c.compute_queue_family >= 0
    assert c.properties["maxComputeWorkGroupInvocations"] >= 128
    assert c.properties["subgroupSize"] == c.subgroup_size
    assert c.extensions.get("VK_KHR_16bit_storage", 0) >= 1
    assert c.fp16_storage == bool(c.features["storageBuffer16BitAccess"])
    assert [p.value for p in c.supported_precisions()][:2] == ["fp32", "fp16p"]


@pytest.mark.parametrize("kind", list(MemoryKind))
def test_buffer_roundtrip(vulkan_ctx, kind):
    data = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    buf = vulkan_ctx.create_buffer(data.nbytes, kind)
    try:
        vulkan_ctx.upload(buf, data)
        np.testing.assert_array_equal(vulkan_ctx.download(buf, np.float32, data.size), data)
        # device-side copy into a host buffer, read through the mapping
        host = vulkan_ctx.create_buffer(data.nbytes, MemoryKind.HOST)
        try:
            vulkan_ctx.copy(buf, host, data.nbytes)
            host.invalidate()
            np.testing.assert_array_equal(host.array(np.float32), data)
        finally:
            host.destroy()
    finally:
        buf.destroy()


def test_vulkan_errors_name_the_result(vulkan_ctx):
    with pytest.raises(VulkanError) as err:
        vulkan_ctx.create_buffer(1 << 50, MemoryKind.DEVICE)
    assert err.value.result.startswith("VK_ERROR_")
    assert err.value.result in str(err.value)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


FILL = (Path(__file__).parent / "shaders" / "fill.comp").read_text()


def test_context_teardown_leaks_nothing(vulkan_caps):
    from vkserve.devices.capabilities import Precision
    from vkserve.devices.vulkan.compiler import compile_glsl
    from vkserve.devices.vulkan.dispatch import dispatch

    spirv = compile_glsl(FILL, caps=vulkan_caps, precision=Precision.FP32, name="fill")
    baseline = dict(LIVE_OBJECTS)
    rss = []
    for i in range(100):
        ctx = VulkanContext(vulkan_caps)
        buf = ctx.create_buffer(1 << 20, MemoryKind.DEVICE)
        ctx.upload(buf, np.full(256, i, dtype=np.float32))
        assert ctx.download(buf, np.float32, 1)[0] == i
        buf.destroy()
        (out,) = dispatch(ctx, spirv, [np.zeros(64, np.float32)], global_size=64,
                          push_constants=[float(i)])
        assert np.all(out == i)
        ctx.destroy()
        assert {k: v for k, v in LIVE_OBJECTS.items() if v != baseline.get(k, 0)} == {}
        if i in (10, 99):
            rss.append(_rss_bytes())
    # every object type we create was exercised and came back to the baseline
    for kind in ("VkDevice", "VkCommandPool", "VkBuffer", "VkDeviceMemory", "VkCommandBuffer",
                 "VkFence", "VkShaderModule", "VkPipeline", "VkPipelineLayout",
                 "VkDescriptorSetLayout", "VkDescriptorPool"):
        assert kind in LIVE_OBJECTS
        assert LIVE_OBJECTS[kind] == baseline.get(kind, 0)
    # and the process did not grow with the iterations (allocator noise is well below this)
    assert rss[1] - rss[0] < 16 << 20, f"RSS grew by {(rss[1] - rss[0]) >> 20} MiB over 89 contexts"
