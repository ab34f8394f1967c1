"""A Plan instance of batch N runs N inputs in one submission (the items recorded layer by layer
in one command buffer, the convolution GEMMs one dispatch for the whole batch): every item's
outputs equal a batch-1 run of the same input, bit for bit, on a model with a host tail
(detection), one with in-place and aliased blobs and one with residual sums folded into its
convolutions."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.paths import MODELS_DIR
from tests.support.vulkan_engine import engine_device
from vkserve.devices.capabilities import Precision
from vkserve.devices.reference import random_inputs
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.graph import load_model

__all__ = ["engine_device"]


@pytest.mark.parametrize(("model", "shape"), [("squeezenet", (3, 64, 64)), ("yolov4-tiny", (3, 96, 96)),
                                              ("mobilenet_v2", (3, 64, 64))])
@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_STORAGE])
def test_a_batch_equals_its_items_run_alone(engine_device: VulkanDevice, model: str,
                                            shape: tuple[int, ...], precision: Precision) -> None:
    graph = load_model(MODELS_DIR / f"{model}.param", None, {"data": shape})
    batch = [random_inputs({"data": shape}, seed=s) for s in range(3)]
    with Plan(engine_device, graph, precision=precision, max_instances=1) as plan:
        alone = [plan.run(inputs) for inputs in batch]
        together = plan.run_batch(batch)
        gemms = [k for k, step in enumerate(plan.steps) if step.shader in ("conv_gemm", "conv_coopmat")]
        assert gemms and all(plan.steps[k].batched for k in gemms)
        with plan.acquire(batch=3) as inst:  # the GEMMs once for the batch, the rest per item
            assert all(len(inst.sets[k]) == 1 for k in gemms)
            assert inst.dispatch_count == 3 * len(plan.steps) - 2 * len(gemms)
        again = plan.run_batch(batch)  # the instance is kept and replayed
        assert plan.run_batch(batch[:1])[0].keys() == alone[0].keys()
    for a, b, c in zip(alone, together, again):
        for name in a:
            np.testing.assert_array_equal(b[name], a[name])
            np.testing.assert_array_equal(c[name], a[name])
    # the items differ (so a mixed-up item would be seen)
    first = next(iter(alone[0]))
    assert not np.array_equal(alone[0][first], alone[1][first])


def test_a_batch_too_wide_for_one_binding_runs_per_item(engine_device: VulkanDevice,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the items' arenas together exceed maxStorageBufferRange, the batched shaders are
    dispatched once per item (each binding then one item's), with the same results."""
    shape = (3, 64, 64)
    graph = load_model(MODELS_DIR / "squeezenet.param", None, {"data": shape})
    batch = [random_inputs({"data": shape}, seed=s) for s in range(3)]
    with Plan(engine_device, graph, precision=Precision.FP32, max_instances=1) as plan:
        alone = [plan.run(inputs) for inputs in batch]
        monkeypatch.setitem(engine_device.ctx.caps.properties, "maxStorageBufferRange", plan.arena_stride)
        with plan.acquire(batch=3) as inst:
            assert inst.dispatch_count == 3 * len(plan.steps)
            together = inst.run_batch(batch)
    for a, b in zip(alone, together):
        for name in a:
            np.testing.assert_array_equal(b[name], a[name])
