"""A job's output room (a shared-memory client's slot): outputs placed one after the other at
64-byte boundaries, those that do not fit or are not wanted left out; an engine's write is
waited for by ``close`` and refused after it; the daemon completes what the engine did not
place. The CPU engine widens its outputs straight into the room, with the bits of a plain run."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.support.vulkan_engine import graph_of
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.output_room import OutputRoom, Placed

#: two outputs of different sizes: y (4 x 8 x 8 = 1 KiB in fp32) and z (3 x 4 x 4 = 192 B)
TWO_OUTPUTS = ["Split split 1 2 data a b",
               "Convolution conv 1 1 a y 0=4 1=3 4=1 5=1 6=108",
               "Pooling pool 1 1 b z 0=1 1=2 2=2"]


def room_of(size: int, wanted: list[str] | None = None) -> tuple[bytearray, OutputRoom]:
    memory = bytearray(size)
    return memory, OutputRoom(memoryview(memory), wanted)


def test_outputs_are_placed_in_order_at_64_byte_boundaries() -> None:
    memory, room = room_of(256, ["a", "c", "d"])
    with room.writing() as writable:
        assert writable
        a = room.place("a", (3,))
        assert room.place("b", (2,)) is None  # not wanted
        assert room.place("c", (100,)) is None  # 400 bytes: no room left after a
        d = room.place("d", (2, 2), np.dtype(np.float16))
    assert a is not None and d is not None and d.dtype == np.float16
    a[...] = [1, 2, 3]
    d[...] = 5
    assert np.frombuffer(memory, np.float32, 3).tolist() == [1, 2, 3]
    assert np.frombuffer(memory, np.float16, 4, 64).tolist() == [5] * 4
    c = np.arange(4, dtype=np.float32)
    placed = room.complete({"a": a, "c": c, "d": d})
    assert placed == {"a": Placed(0, 12), "d": Placed(64, 8), "c": Placed(128, 16)}
    np.testing.assert_array_equal(np.frombuffer(memory, np.float32, 4, 128), c)


def test_what_the_engine_placed_is_not_copied_again_and_a_replaced_output_is() -> None:
    memory, room = room_of(256)
    with room.writing():
        y = room.place("y", (4,))
    assert y is not None
    y[...] = 7
    assert room.complete({"y": y}) == {"y": Placed(0, 16)}
    replaced = np.full(4, 9, np.float32)  # the host replaced the output after the engine's write
    assert room.complete({"y": replaced}) == {"y": Placed(0, 16)}
    np.testing.assert_array_equal(np.frombuffer(memory, np.float32, 4), replaced)
    other = np.full(2, 3, np.float32)  # of another shape: placed anew
    assert room.complete({"y": other}) == {"y": Placed(64, 8)}
    np.testing.assert_array_equal(np.frombuffer(memory, np.float32, 2, 64), other)


def test_a_retried_run_places_afresh() -> None:
    _, room = room_of(256)
    with room.writing():
        first = room.place("y", (4,))
    with room.writing():
        again = room.place("y", (4,))
    assert first is not None and again is not None and np.shares_memory(first, again)
    assert room.complete({"y": again}) == {"y": Placed(0, 16)}


def test_close_waits_for_a_write_under_way_and_refuses_later_ones() -> None:
    memory, room = room_of(64)
    started, closed = threading.Event(), threading.Event()

    def engine() -> None:
        with room.writing() as writable:
            assert writable
            started.set()
            time.sleep(0.2)
            dest = room.place("y", (4,))
            assert dest is not None
            dest[...] = 1
            assert not closed.is_set()  # close waited for this write

    worker = threading.Thread(target=engine)
    worker.start()
    started.wait()
    room.close()
    closed.set()
    worker.join()
    assert np.frombuffer(memory, np.float32, 4).tolist() == [1] * 4
    with room.writing() as writable:
        assert not writable  # the job ended: the engine writes nothing
    memory[:] = bytes(64)
    assert room.complete({"y": np.ones(4, np.float32)}) == {"y": Placed(0, 16)}  # the daemon's own write


def test_a_read_only_room_is_refused() -> None:
    with pytest.raises(ValueError, match="writable"):
        OutputRoom(memoryview(bytes(64)))


def test_the_cpu_engine_widens_outputs_into_the_room() -> None:
    """Item 0 has room for y only (z does not fit after it), item 1 none, item 2 room for both:
    the outputs in the rooms are the returned arrays, with the bits of plain runs."""
    graph = graph_of(TWO_OUTPUTS, {"data": (3, 8, 8)})
    plan = Plan(graph).sibling(batch=3)
    rng = np.random.default_rng(3)
    items = [{"data": rng.uniform(-1, 1, (3, 8, 8)).astype(np.float32)} for _ in range(3)]
    want = [Plan(graph).run(x) for x in items]
    (small_bytes, small), (big_bytes, big) = room_of(1100), room_of(2048)
    got, _ = plan.run_batch_timed(items, [small, None, big])
    for g, w in zip(got, want):
        assert g.keys() == w.keys() == {"y", "z"}
        for name in w:
            assert g[name].tobytes() == w[name].tobytes(), name
    assert np.shares_memory(got[0]["y"], np.frombuffer(small_bytes, np.uint8))
    assert not np.shares_memory(got[0]["z"], np.frombuffer(small_bytes, np.uint8))
    assert all(np.shares_memory(got[2][n], np.frombuffer(big_bytes, np.uint8)) for n in ("y", "z"))
    assert small.complete(got[0]) == {"y": Placed(0, 1024)}  # z travels inline
    assert big.complete(got[2]) == {"y": Placed(0, 1024), "z": Placed(1024, 192)}
    assert np.frombuffer(big_bytes, np.float32, 48, 1024).tobytes() == want[2]["z"].tobytes()
