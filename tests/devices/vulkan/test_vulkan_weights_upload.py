"""A Vulkan Plan uploads its weights a layer and a window at a time: the values land where the
shaders read them (windows smaller than one weight, weights straddling windows, zeros between),
in the fp32 mode and through the GPU's fp16 conversion; and the upload holds one layer's weights
at a time, not the model's."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import vkserve.devices.vulkan.engine.plan as plan_module
from tests.conftest import vulkan_caps  # noqa: F401 (a fixture)
from tests.support.params import big_fc_model
from tests.support.vulkan_engine import (  # noqa: F401 (engine_device: a fixture)
    assert_near_cpu_kernels,
    engine_device,
    graph_of,
    run_plan,
)
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.graph import load_model

NET = [
    "Convolution c1 1 1 x a 0=24 1=3 4=1 5=1 6=3240 9=1",
    "InnerProduct fc1 1 1 a b 0=70 1=1 2=282240 9=1",
    "InnerProduct fc2 1 1 b out 0=10 1=1 2=700",
]


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_STORAGE], ids=lambda p: p.value)
@pytest.mark.parametrize("window", [1000, 4096, plan_module.UPLOAD_WINDOW], ids=lambda w: f"window{w}")
def test_weights_land_where_the_shaders_read_them(engine_device, monkeypatch, precision, window):  # noqa: F811
    monkeypatch.setattr(plan_module, "UPLOAD_WINDOW", window)
    shapes = {"x": (15, 12, 14)}
    graph = graph_of(NET, shapes, seed=3)
    feed = {"x": np.random.default_rng(1).uniform(-1, 1, shapes["x"]).astype(np.float32)}
    got, _, _ = run_plan(engine_device, graph, feed, precision, ["out"])
    assert_near_cpu_kernels(got, graph, feed, precision)


def test_the_upload_holds_one_layers_weights_at_a_time(engine_device, tmp_path):  # noqa: F811
    """Three 16 MiB fp32 weights: the upload once held an fp32 blob of the whole model beside
    every layer's layout (101 MiB of numpy peak), then the layouts alone (49 MiB); now one
    layer's values at a time (16 MiB measured)."""
    param, binf = big_fc_model(tmp_path, seed=2)
    tracemalloc.start()  # numpy's arrays are traced
    try:
        graph = load_model(param, binf)
        plan = Plan(engine_device, graph, None, Precision.FP32, outputs=["out"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    with plan:
        fp32 = sum(layer.weight_elements() for layer in graph.layers) * 4
        assert plan.weight_bytes >= fp32 > 48 * 2**20
        assert peak < fp32 // 3 + 8 * 2**20, (peak, fp32)  # one layer's 16 MiB, not three
        x = np.random.default_rng(0).uniform(-1, 1, 2048).astype(np.float32)
        got = plan.run({"data": x})
    assert_near_cpu_kernels(got, graph, {"data": x}, Precision.FP32)
