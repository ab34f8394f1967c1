"""The engine's layer implemented with images (issue 17): with VKSERVE_IMAGES=1 windowed Pooling
reads its input as a 3D image (pooling.comp compiled with NCNN_image_shader, the blob copied
into a per-instance image before the dispatch), against ncnn in every mode; a whole model and a
batch give the same bits as the buffer path."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.devices.vulkan.test_vulkan_layers_compute import POOLING
from tests.support.paths import MODELS_DIR
from tests.support.vulkan_engine import MODES, check_against_ncnn, engine_device, graph_of
from vkserve.devices.capabilities import Precision
from vkserve.devices.reference import random_inputs
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.devices.vulkan.image import images_wanted
from vkserve.devices.vulkan.reflect import DescriptorKind
from vkserve.models.graph import load_model

__all__ = ["engine_device"]

WINDOWED = [case for case in POOLING if not case.startswith("global")]


def image_steps(plan: Plan) -> list[str]:
    """Labels of the steps that read an image-backed blob (checked to be bound as a sampler)."""
    found = []
    for step in plan.steps:
        for j, b in enumerate(step.bindings):
            if b.buffer == "image":
                assert step.pipeline.descriptor_kinds[j] is DescriptorKind.SAMPLED_IMAGE
                found.append(step.label)
    return found


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", WINDOWED)
def test_pooling_from_an_image_matches_ncnn(tmp_path, engine_device: VulkanDevice, monkeypatch,
                                            case: str, precision: Precision) -> None:
    monkeypatch.setenv("VKSERVE_IMAGES", "1")
    shape, params = POOLING[case]
    graph = graph_of([f"Pooling op 1 1 data out {params}"], {"data": shape})
    with Plan(engine_device, graph, None, precision) as plan:
        assert image_steps(plan) == ["op (Pooling) pooling"]
    check_against_ncnn(tmp_path, engine_device, f"Pooling op 1 1 data out {params}", {"data": shape}, precision)


LINES = [
    "Convolution c1 1 1 data a 0=8 1=3 4=1 5=1 6=216",
    "Pooling p1 1 1 a b 0=0 1=3 2=2",       # max, from an image
    "Pooling p2 1 1 b c 0=1 1=2 2=1 3=1",   # average with pads, from an image
    "Pooling p3 1 1 c out 0=1 4=1",         # global: a buffer
]


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_STORAGE], ids=lambda p: p.value)
def test_images_and_buffers_give_the_same_bits(engine_device: VulkanDevice, monkeypatch,
                                               precision: Precision) -> None:
    """A chain (a dispatch writes the blob the image is copied from, an image-read output feeds
    the next image copy) and a batch of 3 (one image per item): the same bits as buffers."""
    graph = graph_of(LINES, {"data": (3, 17, 15)}, seed=3)
    batch = [random_inputs({"data": (3, 17, 15)}, seed=s) for s in range(3)]
    monkeypatch.setenv("VKSERVE_IMAGES", "0")
    with Plan(engine_device, graph, None, precision) as plan:
        assert image_steps(plan) == []
        want = [plan.run(inputs)["out"] for inputs in batch]
    monkeypatch.setenv("VKSERVE_IMAGES", "1")
    with Plan(engine_device, graph, None, precision) as plan:
        assert image_steps(plan) == ["p1 (Pooling) pooling", "p2 (Pooling) pooling"]
        alone = [plan.run(inputs)["out"] for inputs in batch]
        together = [out["out"] for out in plan.run_batch(batch)]
        with plan.acquire(batch=3) as inst:
            assert len(inst.images) == 2 * 3
    for w, a, t in zip(want, alone, together):
        np.testing.assert_array_equal(a, w)
        np.testing.assert_array_equal(t, w)
    assert not np.array_equal(want[0], want[1])


def test_a_model_with_images_gives_the_same_bits(engine_device: VulkanDevice, monkeypatch) -> None:
    shape = (3, 64, 64)
    graph = load_model(MODELS_DIR / "squeezenet.param", None, {"data": shape})
    inputs = random_inputs({"data": shape}, seed=1)
    outs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("VKSERVE_IMAGES", mode)
        with Plan(engine_device, graph, None, Precision.FP16_STORAGE) as plan:
            assert len(image_steps(plan)) == (3 if mode == "1" else 0)  # squeezenet's max pools
            outs[mode] = plan.run(inputs)
    for name in outs["0"]:
        np.testing.assert_array_equal(outs["1"][name], outs["0"][name])


def test_the_switch(engine_device: VulkanDevice, monkeypatch, caplog) -> None:
    caps = engine_device.ctx.caps
    monkeypatch.setenv("VKSERVE_IMAGES", "yes")
    with caplog.at_level(logging.WARNING):
        assert not images_wanted(caps, Precision.FP32, (8, 8, 8))
    assert "VKSERVE_IMAGES='yes'" in caplog.text
    monkeypatch.setenv("VKSERVE_IMAGES", "1")
    assert images_wanted(caps, Precision.FP32, (8, 8, 8))
    limit = int(caps.properties["maxImageDimension3D"])
    assert not images_wanted(caps, Precision.FP32, (8, 8, limit + 1))  # too many channels: buffers
    monkeypatch.delenv("VKSERVE_IMAGES")
    assert not images_wanted(caps, Precision.FP32, (8, 8, 8))
