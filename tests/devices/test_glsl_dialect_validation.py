"""VKSERVE_VALIDATION=1: the validation layer on the process's instance, NCNN_LOGE printing
through debug printf into the log; without the layer a clear message and no NCNN_LOGE.
Each case runs in its own process: the VkInstance is process-wide."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER_JSON = Path("/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json")

SCRIPT = """
import logging, sys
import numpy as np
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
from vkserve.devices.capabilities import DeviceKind
from vkserve.devices.discovery import discover_devices
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.context import VulkanContext
from vkserve.devices.vulkan.dispatch import dispatch
from vkserve.devices.vulkan.shader_options import ShaderOptions
caps = next(d for d in discover_devices() if d.kind is DeviceKind.VULKAN)
ctx = VulkanContext(caps)
options = ShaderOptions(debug_printf=ctx.instance.validation)
source = open(sys.argv[1]).read()
spirv = compile_glsl(source, caps=caps, precision=options, name="dialect_printf.comp")
(out,) = dispatch(ctx, spirv, [np.zeros(4, np.int32)], global_size=4, local_size=4)
print("validation", int(ctx.instance.validation), "out", *out.tolist())
ctx.destroy()
"""


def run(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VKSERVE_VALIDATION": "1", **env_extra}
    return subprocess.run([sys.executable, "-c", SCRIPT,
                           str(ROOT / "tests/devices/shaders/dialect_printf.comp")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_ncnn_loge_prints_into_the_log_through_the_validation_layer():
    if not LAYER_JSON.exists():
        pytest.fail("vulkan-validationlayers is expected to be installed (deploy/dev.sh)")
    proc = run({})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["validation", "1", "out", "1", "8", "15", "22"]
    printed = [line for line in proc.stderr.splitlines() if "NCNN_LOGE:" in line]
    for gx in range(4):
        assert any(f"vkserve probe gx = {gx * 7}" in line for line in printed), proc.stderr[-4000:]
    assert all(line.startswith("WARNING vkserve.vulkan.validation") for line in printed)
    # the layer found nothing wrong with the device setup, the pipeline or the dispatch
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    assert not errors, errors


def test_missing_layer_is_named_and_shaders_run_without_printf(tmp_path):
    proc = run({"VK_LAYER_PATH": str(tmp_path)})  # the loader looks for explicit layers only there
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["validation", "0", "out", "0", "7", "14", "21"]
    assert ("VKSERVE_VALIDATION=1 but the Vulkan validation layer VK_LAYER_KHRONOS_validation "
            "is not installed") in proc.stderr
    assert "apt install vulkan-validationlayers" in proc.stderr
    assert "NCNN_LOGE:" not in proc.stderr
