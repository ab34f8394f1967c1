"""The Vulkan engine reads a job's outputs out of staging straight into its room (a
shared-memory client's slot), casting fp16 storage to fp32 on the way: the same bits as a plain
run, the returned arrays the room's bytes, an output that does not fit left to travel inline."""

from __future__ import annotations

import numpy as np
import pytest

from tests.devices.test_output_room import TWO_OUTPUTS, room_of
from tests.support.vulkan_engine import engine_device, graph_of
from vkserve.devices.capabilities import Precision
from vkserve.devices.output_room import Placed
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan

__all__ = ["engine_device"]


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_STORAGE])
def test_outputs_are_read_into_their_rooms(engine_device: VulkanDevice, precision: Precision) -> None:
    graph = graph_of(TWO_OUTPUTS, {"data": (3, 8, 8)})
    rng = np.random.default_rng(5)
    items = [{"data": rng.uniform(-1, 1, (3, 8, 8)).astype(np.float32)} for _ in range(3)]
    with Plan(engine_device, graph, None, precision, max_instances=2) as plan:
        want = [plan.run(x) for x in items]
        (small_bytes, small), (big_bytes, big) = room_of(1100), room_of(2048)
        got, _ = plan.run_batch_timed(items, rooms=[small, None, big])
        (alone_bytes, alone), = [room_of(2048)]
        (single,), _ = plan.run_batch_timed(items[:1], rooms=[alone])
    for g, w in zip([*got, single], [*want, want[0]]):
        assert g.keys() == w.keys() == {"y", "z"}
        for name in w:
            assert g[name].dtype == np.float32 and g[name].tobytes() == w[name].tobytes(), name
    assert np.shares_memory(got[0]["y"], np.frombuffer(small_bytes, np.uint8))
    assert not np.shares_memory(got[0]["z"], np.frombuffer(small_bytes, np.uint8))
    assert small.complete(got[0]) == {"y": Placed(0, 1024)}
    for room, memory, outputs in ((big, big_bytes, got[2]), (alone, alone_bytes, single)):
        assert all(np.shares_memory(outputs[n], np.frombuffer(memory, np.uint8)) for n in ("y", "z"))
        assert room.complete(outputs) == {"y": Placed(0, 1024), "z": Placed(1024, 192)}
