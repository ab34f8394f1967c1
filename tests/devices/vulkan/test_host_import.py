"""Inputs in a client's shared memory read by the GPU where they lie (VK_EXT_external_memory_host,
which lavapipe offers): the region is imported on first use, bound where staging would be, and
freed once retired and no run reads it. The staging bytes are poisoned with NaN first, so an
output equal to the plain run's proves the GPU read the region. What cannot be imported (an
offset off the binding alignment, a device without the extension, a driver refusing the import)
is copied as before, counted and logged."""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.paths import MODELS_DIR
from tests.support.vulkan_engine import engine_device
from vkserve.devices.capabilities import Precision
from vkserve.devices.host_regions import REGIONS, HostRegion
from vkserve.devices.reference import random_inputs
from vkserve.devices.vulkan.context import LIVE_OBJECTS
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine import plan as plan_module
from vkserve.devices.vulkan.engine.plan import Plan, PlanInstance
from vkserve.devices.vulkan.errors import VulkanError
from vkserve.models.graph import Graph, load_model

__all__ = ["engine_device"]

SHAPE = (3, 32, 32)
SIZE = 1 << 20


@pytest.fixture(scope="module")
def graph() -> Graph:
    return load_model(MODELS_DIR / "squeezenet.param", None, {"data": SHAPE})


@pytest.fixture
def region() -> Iterator[HostRegion]:
    """A memfd mapped and registered, as the daemon does with a client's region."""
    fd = os.memfd_create("test-region")
    try:
        os.ftruncate(fd, SIZE)
        mapping = mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)
    host = REGIONS.register(mapping)
    yield host
    REGIONS.retire(host)


def put(region: HostRegion, offset: int, value: np.ndarray) -> np.ndarray:
    """``value`` written into the region at ``offset``: the view an input arrives as."""
    view = np.frombuffer(region.mapping, np.float32, value.size, offset).reshape(value.shape)
    view[...] = value
    return view


def poison_staging(inst: PlanInstance) -> None:
    for views in inst._inputs:
        for _, _, view in views:
            view[...] = np.nan


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_STORAGE])
def test_inputs_in_a_region_are_read_in_place(engine_device: VulkanDevice, graph: Graph, region: HostRegion,
                                              precision: Precision) -> None:
    """fp32 runs copy the input into the arena (a buffer copy from the region), fp16 runs cast it
    (cast_input bound to the region): both equal the staged run bit for bit; the input command
    buffer is kept for the next run from the same place. A batched instance copies (its items'
    places rarely come back together), with the same outputs."""
    batch = [random_inputs({"data": SHAPE}, seed=s) for s in range(3)]
    with Plan(engine_device, graph, precision=precision, max_instances=1) as plan:
        alone = [plan.run(inputs) for inputs in batch]
        shared = [{"data": put(region, 16384 * (i + 1), inputs["data"])} for i, inputs in enumerate(batch)]
        with plan.acquire() as inst:
            poison_staging(inst)
            for _ in range(2):
                inst.start(shared[0])
                inst.wait()
                assert_same(inst.read_outputs()[0], alone[0])
                assert (inst.inputs_in_place, inst.shared_inputs_copied) == (1, 0)
            assert len(inst._sources) == 1  # recorded once, replayed
        outputs, times = plan.run_batch_timed([shared[0], batch[1], shared[2]])
        assert (times.in_place, times.shared_copied) == (0, 2)
        for got, want in zip(outputs, alone):
            assert_same(got, want)
        assert engine_device.imports.count == 1


def test_a_region_retired_during_a_run_is_freed_when_the_run_ends(engine_device: VulkanDevice, graph: Graph,
                                                                  region: HostRegion) -> None:
    inputs = random_inputs({"data": SHAPE}, seed=7)
    with Plan(engine_device, graph, precision=Precision.FP16_STORAGE, max_instances=1) as plan:
        want = plan.run(inputs)
        view = put(region, 0, inputs["data"])
        with plan.acquire() as inst:
            inst.start({"data": view})
            REGIONS.retire(region)  # the client unregisters it while the GPU reads it
            assert engine_device.imports.count == 1
            memory = LIVE_OBJECTS["VkDeviceMemory"]
            inst.wait()
            assert engine_device.imports.count == 0  # freed once the run was over
            assert LIVE_OBJECTS["VkDeviceMemory"] == memory - 1
            assert_same(inst.read_outputs()[0], want)
            inst.start({"data": view})  # the same bytes, no longer registered: copied as any array
            inst.wait()
            assert_same(inst.read_outputs()[0], want)
            assert (inst.inputs_in_place, inst.shared_inputs_copied) == (0, 0)
            assert not inst._sources  # the command buffer over the freed import went with it


@pytest.mark.parametrize(("case", "precision", "offset"), [
    ("an offset off the cast's binding alignment", Precision.FP16_STORAGE, 4),
    ("a device without the extension", Precision.FP32, 0)])
def test_what_cannot_be_imported_is_copied(engine_device: VulkanDevice, graph: Graph, region: HostRegion,
                                           monkeypatch: pytest.MonkeyPatch, case: str, precision: Precision,
                                           offset: int) -> None:
    if case == "a device without the extension":
        monkeypatch.setattr(engine_device.imports, "alignment", 0)
    inputs = random_inputs({"data": SHAPE}, seed=8)
    with Plan(engine_device, graph, precision=precision, max_instances=1) as plan:
        want = plan.run(inputs)
        outputs, times = plan.run_batch_timed([{"data": put(region, offset, inputs["data"])}])
    assert (times.in_place, times.shared_copied) == (0, 1)
    assert_same(outputs[0], want)
    assert engine_device.imports.count == 0


def test_a_refused_import_is_logged_once_and_copied(engine_device: VulkanDevice, graph: Graph, region: HostRegion,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A driver refusing the import (injected: the one mocked Vulkan call here): the VkResult
    is logged once for the region, its inputs are copied, and it is not tried again."""
    calls = []

    def refuse(address: int, size: int) -> None:
        calls.append((address, size))
        raise VulkanError("vkAllocateMemory(imported host memory)", "VK_ERROR_INVALID_EXTERNAL_HANDLE")

    monkeypatch.setattr(engine_device.ctx, "import_host", refuse)
    inputs = random_inputs({"data": SHAPE}, seed=10)
    caplog.set_level(logging.WARNING, "vkserve.devices.vulkan.host_import")
    with Plan(engine_device, graph, precision=Precision.FP16_STORAGE, max_instances=1) as plan:
        want = plan.run(inputs)
        for _ in range(3):
            outputs, times = plan.run_batch_timed([{"data": put(region, 0, inputs["data"])}])
            assert (times.in_place, times.shared_copied) == (0, 1)
            assert_same(outputs[0], want)
    assert calls == [(region.address, SIZE)]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and "VK_ERROR_INVALID_EXTERNAL_HANDLE" in logged[0], logged


def test_places_beyond_the_instance_s_command_buffers_are_copied(engine_device: VulkanDevice, graph: Graph,
                                                                 region: HostRegion,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An instance records input command buffers for its first places only (recording holds
    the GIL, copying does not): a later place is copied, the kept ones still read in place."""
    monkeypatch.setattr(plan_module, "MAX_INPUT_SOURCES", 2)
    inputs = [random_inputs({"data": SHAPE}, seed=s) for s in range(3)]
    with Plan(engine_device, graph, precision=Precision.FP16_STORAGE, max_instances=1) as plan:
        want = [plan.run(x) for x in inputs]
        views = [{"data": put(region, 16384 * i, x["data"])} for i, x in enumerate(inputs)]
        with plan.acquire() as inst:
            for i in (0, 1, 2, 0, 1, 2):
                inst.start(views[i])
                inst.wait()
                assert_same(inst.read_outputs()[0], want[i])
                assert (inst.inputs_in_place, inst.shared_inputs_copied) == ((0, 1) if i == 2 else (1, 0))
            assert len(inst._sources) == 2
