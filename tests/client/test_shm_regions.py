"""Shared-memory regions without sockets: the daemon's registry (sealing, limits, bounds, output
placement) and the client's pool (reuse, growth, the output room it accepts)."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pytest

from vkserve.client.messages import BadResponse, InferRequest, ShmSlot, decode_infer_result, encode_infer_result
from vkserve.client.shm import MAX_KNOWN_OUTPUTS, MAX_OUTPUT_ROOM, MIN_OUTPUT_ROOM, SharedInputs, SharedMemory
from vkserve.client.tensors import TensorError, decode_tensor
from vkserve.daemon.shm import RegionError, Regions


def sealed(size: int) -> int:
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def test_registry_limits_and_bounds() -> None:
    regions = Regions(max_regions=2, max_bytes=3 << 20)
    regions.register("a", sealed(1 << 20), 1 << 20)
    with pytest.raises(RegionError, match="is not 1 to 64 letters"):
        regions.register("../x", sealed(64), 64)
    with pytest.raises(RegionError, match="would make 5242880 bytes of regions"):
        regions.register("b", sealed(4 << 20), 4 << 20)
    regions.register("b", sealed(64), 64)
    with pytest.raises(RegionError, match="2 regions registered on this connection"):
        regions.register("c", sealed(64), 64)
    tensor = {"dtype": "float32", "shape": [4], "shm": {"region": "b", "offset": 48}}
    assert decode_tensor(tensor, regions).shape == (4,)
    with pytest.raises(TensorError, match="16 bytes at offset 56 run past the end of region 'b'"):
        decode_tensor({**tensor, "shm": {"region": "b", "offset": 56}}, regions)
    with pytest.raises(TensorError, match="needs a Unix-socket connection"):
        decode_tensor(tensor, None)
    assert regions.unregister("b") and not regions.unregister("b")


def test_outputs_that_fit_are_placed_the_others_go_inline() -> None:
    regions = Regions(4, 1 << 30)
    regions.register("r", sealed(4096), 4096)
    small, big = np.arange(10, dtype=np.float32), np.ones(2000, np.float32)
    room = regions.room(ShmSlot("r", 1024, 3072), None)
    assert room is not None and room.size == 3072
    placed = {n: ShmSlot("r", 1024 + p.offset, p.nbytes) for n, p in room.complete({"small": small, "big": big}).items()}
    assert placed == {"small": ShmSlot("r", 1024, 40)}
    np.testing.assert_array_equal(np.frombuffer(regions.view("r", 1024, 40), np.float32), small)
    result = encode_infer_result({"small": small, "big": big}, placed=placed)
    assert "data" not in result["outputs"]["small"] and "data" in result["outputs"]["big"]
    assert regions.room(ShmSlot("nope", 0, 10), None) is None
    assert regions.room(ShmSlot("r", 4000, 200), None) is None  # past the region's end


def test_the_client_pool_reuses_and_grows_regions() -> None:
    pool = SharedMemory()
    x = {"data": np.random.default_rng(0).standard_normal((3, 128, 128)).astype(np.float32)}
    request = InferRequest(1, "m", x)
    assert pool.wanted(request)
    region, new = pool.take(request)
    assert new and region.size >= x["data"].nbytes + MIN_OUTPUT_ROOM
    shared = SharedInputs(region, x)
    assert shared.placed["data"] == ShmSlot(region.name, 0, x["data"].nbytes)
    # the server writes an output into the room; the client copies it out
    out = np.arange(6, dtype=np.float32)
    room = shared.outputs
    region.map[room.offset:room.offset + out.nbytes] = out.tobytes()
    result = {"outputs": {"y": {"dtype": "float32", "shape": [6], "shm": {"region": region.name,
                                                                         "offset": room.offset}}}}
    got = decode_infer_result(result, shared)["y"]
    np.testing.assert_array_equal(got, out)
    assert got.flags.writeable  # a copy: the region is reused by the next request
    with pytest.raises(BadResponse, match="outside this request's output room"):
        decode_infer_result({"outputs": {"y": {**result["outputs"]["y"],
                                               "shm": {"region": region.name, "offset": 0}}}}, shared)
    pool.put(region)
    assert pool.take(request) == (region, False)
    bigger = InferRequest(2, "m", {"data": np.zeros(4 * region.size, np.uint8)})
    grown, new = pool.take(bigger)
    assert new and grown.size > region.size
    pool.close()


def test_the_pool_remembers_each_kind_of_requests_outputs() -> None:
    pool = SharedMemory()
    small = InferRequest(1, "m", {"x": np.ones(16, np.float32)})
    assert not pool.wanted(small) and pool.output_room(small) is None
    pool.learn(small, {"a": np.ones(10, np.float32), "b": np.ones((4, 512, 512), np.float32)})
    assert pool.output_room(small) == 64 + 4 * 512 * 512 * 4  # each output at 64 bytes
    assert pool.wanted(small)  # 4 MiB of outputs expected back
    region, new = pool.take(small)
    assert new and region.size >= 64 + pool.output_room(small)
    # the key: model, input shapes and types, outputs asked for (not the values, not the id)
    assert pool.output_room(InferRequest(9, "m", {"x": np.zeros(16, np.float32)})) is not None
    assert pool.output_room(InferRequest(1, "m", {"x": np.ones(16, np.float64)})) is None
    assert pool.output_room(InferRequest(1, "m", {"x": np.ones(17, np.float32)})) is None
    assert pool.output_room(InferRequest(1, "n", {"x": np.ones(16, np.float32)})) is None
    assert pool.output_room(InferRequest(1, "m", {"x": np.ones(16, np.float32)}, outputs=["a"])) is None
    # bounded: the room at MAX_OUTPUT_ROOM, the kinds at MAX_KNOWN_OUTPUTS (least recent out)
    huge = InferRequest(1, "huge", {"x": np.ones(1, np.float32)})
    pool.learn(huge, {"y": np.zeros(MAX_OUTPUT_ROOM + 1, np.uint8)})
    assert pool.output_room(huge) == MAX_OUTPUT_ROOM
    for i in range(MAX_KNOWN_OUTPUTS):
        pool.learn(InferRequest(1, f"k{i}", {"x": np.ones(1)}), {"y": np.ones(1)})
    assert pool.output_room(small) is None and pool.output_room(InferRequest(1, "k0", {"x": np.ones(1)})) == 64
    pool.close()
