"""Scratch a layer needs zeroed (``VulkanLayer.zeroed_scratch``: split K's tile counters in
gemm_coopmat) is filled with zeros at the start of every run, and no blob written earlier in
the run shares its bytes. Here a test layer counts with atomics in such a scratch on lavapipe:
each run must count from zero again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import vkserve.devices.vulkan.shader_registry as registry
from tests.support.vulkan_engine import engine_device, graph_of  # noqa: F401 (engine_device: a fixture)
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan, load_layer_modules
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS, Dispatch, VulkanLayer

N = 1000
#: values the counting layer writes (Crop's first 256 of N)
M = 256
#: y[i] = the count of counter i % 4 before this invocation added 1: per run, each of 0 .. M / 4
#: - 1 four times, in any order, if the counters start at zero (the scratch holds N of them: as
#: large as the blobs that die before the layer, so that a wrong lifetime would share their bytes)
COUNTERS = 4
COUNTING = """#version 450
layout (local_size_x = 64) in;
layout (binding = 0) readonly buffer x_blob { float x[]; };
layout (binding = 1) writeonly buffer y_blob { float y[]; };
layout (binding = 2) buffer count_blob { uint count[]; };
layout (push_constant) uniform parameter { int n; } p;
void main()
{
    const int i = int(gl_GlobalInvocationID.x);
    if (i < p.n)
        y[i] = float(atomicAdd(count[i % 4], 1u)) + 0.0 * x[i];
}
"""


class Counting(VulkanLayer):
    def scratch(self) -> dict[str, int]:
        return {"count": N}

    def zeroed_scratch(self) -> frozenset[str]:
        return frozenset({"count"})

    def dispatches(self) -> list[Dispatch]:
        return [Dispatch("zero_count", (self.layer.inputs[0], self.layer.outputs[0], "s:count"), (M, 1, 1),
                         push_constants=(M,))]


@pytest.fixture
def counting_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """AbsVal runs as ``Counting``, its shader beside the built-in ones."""
    load_layer_modules()
    shaders = tmp_path / "shaders"
    shaders.mkdir()
    for source in registry.SHADER_DIR.iterdir():
        (shaders / source.name).write_bytes(source.read_bytes())
    (shaders / "zero_count.comp").write_text(COUNTING)
    monkeypatch.setattr(registry, "SHADER_DIR", shaders)
    registry.builtin_shader.cache_clear()
    monkeypatch.setitem(VULKAN_LAYERS, "AbsVal", Counting)
    yield
    registry.builtin_shader.cache_clear()


def test_a_layers_zeroed_scratch_is_zero_on_every_run(engine_device: VulkanDevice,  # noqa: F811
                                                      counting_layer: None) -> None:
    # x and b die before c: without a lifetime from the run's start, the counters would take
    # their bytes (measured: the arena's first-fit placed them there) and start from b's values
    graph = graph_of(["TanH t 1 1 x a", "Sigmoid s 1 1 x b", "BinaryOp add 2 1 a b e 0=0",
                      f"Crop cr 1 1 e f -23309=1,0 -23310=1,{M} -23311=1,0", "AbsVal c 1 1 f y"], {"x": (N,)})
    feed = {"x": np.linspace(-3, 3, N, dtype=np.float32)}
    want = np.sort(np.repeat(np.arange(M // COUNTERS, dtype=np.float32), COUNTERS))
    with Plan(engine_device, graph, None, Precision.FP32) as plan:
        (offset, nbytes), = plan.zeroed_spans
        assert nbytes == N * 4
        for _ in range(3):
            np.testing.assert_array_equal(np.sort(plan.run(dict(feed))["y"]), want)
