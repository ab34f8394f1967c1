"""One daemon connection in-process, over a trio memory stream, with a scripted backend:
failures of the backend become answers, oversized answers, drain and idle timeouts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import trio
import trio.testing

from vkserve.client.protocol import FrameDecoder, Response, encode_frame, encode_tensors, parse_response
from vkserve.daemon.config import Config, ServerConfig
from vkserve.daemon.server import Server
from vkserve.devices.output_room import OutputRoom
from vkserve.scheduler import (
    DeviceStatus,
    InferResult,
    JobTotals,
    ModelInfo,
    ModelState,
    Overloaded,
    RescanResult,
    SchedulerState,
    Status,
    UnloadResult,
)


class ScriptedBackend:
    """Test double of the scheduler (a ``Backend``): ``infer`` does what the model name says;
    one model ``m`` on one CPU device."""

    def __init__(self) -> None:
        self.cancelled = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def aclose(self, timeout: float | None = None) -> None:
        pass

    async def infer(self, model: str, inputs: dict[str, np.ndarray], *, priority: int | None = None,
                    deadline: float | None = None, outputs: list[str] | None = None,
                    room: OutputRoom | None = None) -> InferResult:
        if model == "boom":
            raise RuntimeError("kaboom")
        if model == "busy":
            raise Overloaded("queue full")
        if model == "sleep":
            try:
                await trio.sleep(1000)
            except trio.Cancelled:
                self.cancelled += 1
                raise
        if model == "big":
            return InferResult({"y": np.zeros(10_000, np.float32)}, "test", 0.0, 0.0)
        return InferResult({"y": np.asarray(inputs["x"]) * 2}, "test", 0.0, 0.0)

    def submit(self, model: str, inputs: dict[str, np.ndarray], *, priority: int | None,
               deadline: float | None, outputs: list[str] | None, on_done: object,
               room: OutputRoom | None = None) -> None:
        if model == "submit-bug":
            raise RuntimeError("submit kaboom")
        return None  # every other request takes the awaiting path (infer above)

    def cancel(self, job: object, message: str) -> None:
        raise AssertionError("no job was submitted")

    def _model(self, devices: list[int]) -> ModelInfo:
        return ModelInfo("m", ModelState.READY, {"x": [2]}, {"y": [2]}, devices, [], 0, 0, 8, "auto",
                         None)

    async def load_model(self, name: str, devices: list[int] | None = None) -> ModelInfo:
        return self._model(devices or [])

    async def unload_model(self, name: str) -> UnloadResult:
        return UnloadResult(name, "unloaded", [0])

    async def rescan(self) -> RescanResult:
        return RescanResult([], [], [], {})

    def models(self) -> list[ModelInfo]:
        return [self._model([0])]

    def status(self) -> Status:
        cpu = DeviceStatus(index=0, name="CPU", kind="cpu", software=False, healthy=True)
        return Status(SchedulerState.RUNNING, True, [cpu], {}, 0, 0, JobTotals())

    def ready(self) -> bool:
        return True

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        pass


class Peer:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(2**30)

    async def send(self, msg: dict[str, Any]) -> None:
        await self.stream.send_all(encode_frame(msg))

    async def recv(self) -> Response | None:
        while (msg := self.decoder.next_message()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.decoder.feed(data)
        return parse_response(msg)


@asynccontextmanager
async def connected(**server_cfg: Any) -> AsyncIterator[tuple[Peer, Server, Callable[[], bool]]]:
    backend = ScriptedBackend()
    server = Server(Config(server=ServerConfig(**server_cfg)), backend, token=None)
    ours, theirs = trio.testing.memory_stream_pair()
    done = trio.Event()

    async def serve() -> None:  # as trio.serve_listeners runs a handler
        try:
            await server.handle_unix(theirs)  # type: ignore[arg-type]
        finally:
            await trio.aclose_forcefully(theirs)
            done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        yield Peer(ours), server, done.is_set
        nursery.cancel_scope.cancel()


def infer(rid: int, model: str, x: Any = (1.0, 2.0)) -> dict[str, Any]:
    return {"v": 1, "id": rid, "op": "infer", "model": model,
            "inputs": encode_tensors({"x": np.asarray(x, np.float32)})}


async def test_backend_failures_become_answers_and_the_connection_goes_on() -> None:
    async with connected() as (peer, server, _):
        await peer.send(infer(1, "boom"))
        r = await peer.recv()
        assert r is not None and r.id == 1 and r.error is not None
        assert r.error.code == "INTERNAL" and "RuntimeError: kaboom" in r.error.message
        await peer.send(infer(2, "busy"))
        r = await peer.recv()
        assert r is not None and r.error is not None and r.error.code == "OVERLOADED"
        assert r.error.message == "queue full"  # the code travels once, in error.code
        await peer.send(infer(3, "double"))
        r = await peer.recv()
        assert r is not None and r.ok and r.result["device"] == "test"
        await peer.send({"v": 1, "id": 4, "op": "list_models"})
        r = await peer.recv()
        assert r is not None and r.ok
        assert r.result["models"] == [{
            "name": "m", "state": "ready", "inputs": {"x": [2]}, "outputs": {"y": [2]}, "devices": [0],
            "placements": [], "queue_depth": 0, "in_flight": 0, "queue_limit": 8, "precision": "auto",
            "error": None, "reloading": False, "reload_error": None, "reload_failures": 0, "max_batch_size": 1,
            "device_names": []}]
        await peer.send({"v": 1, "id": 5, "op": "load_model", "name": "m", "devices": ["cpu", "0"]})
        r = await peer.recv()
        assert r is not None and r.result["name"] == "m" and r.result["devices"] == [0, 0]
        await peer.send({"v": 1, "id": 6, "op": "load_model", "name": "m", "devices": ["gpu9"]})
        r = await peer.recv()
        assert r is not None and r.error is not None and r.error.code == "BAD_REQUEST"
        await peer.send(infer(7, "submit-bug"))  # a bug in the job path: this answer only
        r = await peer.recv()
        assert r is not None and r.id == 7 and r.error is not None and r.error.code == "INTERNAL"
        assert "RuntimeError: submit kaboom" in r.error.message
        await peer.send(infer(8, "double"))
        r = await peer.recv()
        assert r is not None and r.id == 8 and r.ok
        assert server.infer_in_flight == 0


async def test_an_answer_above_the_frame_limit_is_an_error_answer() -> None:
    async with connected(max_frame_size=4096) as (peer, _, _):
        await peer.send(infer(1, "big"))
        r = await peer.recv()
        assert r is not None and r.error is not None and r.error.code == "INTERNAL"
        assert "too large" in r.error.message


async def test_eof_cancels_the_jobs_of_the_connection() -> None:
    async with connected() as (peer, server, closed):
        await peer.send(infer(1, "sleep"))
        await peer.send(infer(2, "sleep"))
        await trio.testing.wait_all_tasks_blocked()
        assert server.infer_in_flight == 2
        await peer.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert closed() and server.infer_in_flight == 0
        assert server.backend.cancelled == 2  # type: ignore[attr-defined]


async def test_drain_refuses_new_work_and_closes_when_idle() -> None:
    async with connected() as (peer, server, closed):
        await peer.send(infer(1, "sleep"))
        await trio.testing.wait_all_tasks_blocked()
        server.begin_drain()
        await peer.send(infer(2, "double"))
        r = await peer.recv()
        assert r is not None and r.id == 2 and r.error is not None and r.error.code == "UNAVAILABLE"
        assert not closed()
        await peer.send({"v": 1, "id": 3, "op": "cancel", "target": 1})
        answers = {(await peer.recv()).id for _ in range(2)}  # type: ignore[union-attr]
        assert answers == {1, 3}
        bye = await peer.recv()  # nothing in flight: the goodbye (id 0), then the close
        assert bye is not None and bye.id == 0 and bye.error is not None and bye.error.code == "UNAVAILABLE"
        await peer.send(infer(4, "double"))  # sent before the goodbye reached the peer: answered
        r = await peer.recv()
        assert r is not None and r.id == 4 and r.error is not None and r.error.code == "UNAVAILABLE"
        await peer.stream.send_eof()  # the peer's EOF ends the linger at once
        assert await peer.recv() is None
        await trio.testing.wait_all_tasks_blocked()
        assert closed()


async def test_idle_connections_close(autojump_clock: trio.testing.MockClock) -> None:
    async with connected(idle_timeout=60.0) as (peer, _, closed):
        await peer.send(infer(1, "sleep"))  # in flight: not idle, however long it takes
        with trio.move_on_after(300):
            await peer.recv()
        assert not closed()
        await peer.send({"v": 1, "id": 2, "op": "cancel", "target": 1})
        assert {(await peer.recv()).id for _ in range(2)} == {1, 2}  # type: ignore[union-attr]
        start = trio.current_time()
        assert await peer.recv() is None
        assert 59 < trio.current_time() - start < 61
        await trio.testing.wait_all_tasks_blocked()
        assert closed()
