"""Sync and trio clients against an in-test fake server built on the sans-I/O layer.

No daemon is involved: ``FakeServer`` turns received bytes into response bytes, and thin
drivers run it over a real socketpair (thread) or trio socket stream.
"""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

import vkserve.client.connection
from vkserve.client import (
    Client,
    ConnectionClosed,
    DeadlineExceeded,
    DeviceError,
    NotFound,
    Overloaded,
    RequestCancelled,
    ServerError,
    TrioClient,
    Unauthenticated,
)
from vkserve.client.protocol import (
    CONNECTION_ERROR_ID,
    AuthRequest,
    BadRequest,
    CancelRequest,
    ErrorCode,
    FrameDecoder,
    InferRequest,
    ListModelsRequest,
    LoadModelRequest,
    PingRequest,
    Response,
    ShmRegisterRequest,
    StatusRequest,
    UnloadModelRequest,
    encode_frame,
    encode_infer_result,
    parse_request,
)


class FakeServer:
    """A scripted server. Infer semantics by model name:

    ``double``: y = 2*x, held until ``hold`` such requests arrived, then all answered in
    descending id order (proves clients match responses by id; threads may send their
    requests in any order, so arrival order is not id order); ``hang``: never answered until
    cancelled; ``error:CODE``: fails with CODE.
    """

    def __init__(self, hold: int = 1, token: str | None = None) -> None:
        self.decoder = FrameDecoder()
        self.hold = hold
        self.held: list[InferRequest] = []
        self.hanging: dict[int, InferRequest] = {}
        self.hung_ids: list[int] = []
        self.cancels: list[int] = []
        self.answer_order: list[int] = []
        self.token = token
        self.authed = token is None
        self.hung = threading.Event()  # set once a "hang" request arrived

    def receive(self, data: bytes) -> bytes:
        self.decoder.feed(data)
        out: list[Response] = []
        for msg in self.decoder:
            out += self.handle(msg)
        return b"".join(encode_frame(r.to_message()) for r in out)

    def handle(self, msg: dict) -> list[Response]:
        try:
            req = parse_request(msg)
        except BadRequest as exc:
            return [Response.failure(exc.request_id or CONNECTION_ERROR_ID, ErrorCode.BAD_REQUEST, str(exc))]
        if not self.authed:
            if isinstance(req, AuthRequest) and req.token == self.token:
                self.authed = True
                return [Response.success(req.id)]
            return [Response.failure(req.id, ErrorCode.UNAUTHENTICATED, "bad or missing token")]
        match req:
            case InferRequest(model="hang"):
                self.hanging[req.id] = req
                self.hung_ids.append(req.id)
                self.hung.set()
                return []
            case InferRequest(model=model) if model.startswith("error:"):
                code = ErrorCode(model.removeprefix("error:"))
                return [Response.failure(req.id, code, f"scripted {model}")]
            case InferRequest():
                self.held.append(req)
                if len(self.held) < self.hold:
                    return []
                answers, self.held = sorted(self.held, key=lambda r: r.id, reverse=True), []
                self.answer_order += [r.id for r in answers]
                return [
                    Response.success(r.id, encode_infer_result({"y": r.inputs["x"] * 2}, device="fake"))
                    for r in answers
                ]
            case CancelRequest(target=target):
                self.cancels.append(target)
                out = [Response.success(req.id, {"cancelled": target in self.hanging})]
                if self.hanging.pop(target, None) is not None:
                    out.append(Response.failure(target, ErrorCode.CANCELLED, "cancelled by client"))
                return out
            case ListModelsRequest():
                return [Response.success(req.id, {"models": [{"name": "double", "state": "ready"}]})]
            case StatusRequest():
                return [Response.success(req.id, {"devices": [{"name": "cpu", "healthy": True}]})]
            case PingRequest() | AuthRequest():
                return [Response.success(req.id)]
            case LoadModelRequest(name=name, devices=devices):
                if name == "nope":
                    return [Response.failure(req.id, ErrorCode.NOT_FOUND, "no model 'nope'")]
                return [Response.success(req.id, {"name": name, "devices": devices})]
            case UnloadModelRequest(name=name):
                return [Response.success(req.id, {"name": name})]
            case ShmRegisterRequest():  # a daemon that refuses shared memory: the clients go inline
                return [Response.failure(req.id, ErrorCode.BAD_REQUEST, "this server keeps tensors inline")]
        raise AssertionError(f"unhandled {req!r}")


# ============================================================================ sync client


def serve_blocking(sock: socket.socket, server: FakeServer) -> None:
    with sock:
        while data := sock.recv(65536):
            if out := server.receive(data):
                sock.sendall(out)


@pytest.fixture
def no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vkserve.client.connection, "DEADLINE_GRACE", 0.05)


def sync_pair(server: FakeServer) -> tuple[Client, threading.Thread, socket.socket]:
    a, b = socket.socketpair()
    thread = threading.Thread(target=serve_blocking, args=(b, server), daemon=True)
    thread.start()
    return Client(a), thread, b


@pytest.fixture
def sync_server() -> Iterator[tuple[Client, FakeServer]]:
    server = FakeServer(hold=8)
    c, thread, _ = sync_pair(server)
    with c:
        yield c, server
    thread.join(5)
    assert not thread.is_alive()


def test_sync_many_threads_multiplexed_out_of_order(sync_server: tuple[Client, FakeServer]) -> None:
    c, server = sync_server
    results: dict[int, np.ndarray] = {}

    def worker(i: int) -> None:
        results[i] = c.infer("double", {"x": np.full(3, i, dtype=np.float32)})["y"]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == list(range(8))
    for i, y in results.items():
        np.testing.assert_array_equal(y, np.full(3, 2 * i, dtype=np.float32))
    assert server.answer_order == sorted(server.answer_order, reverse=True)  # really out of order


def test_sync_other_ops(sync_server: tuple[Client, FakeServer]) -> None:
    c, _ = sync_server
    assert c.models() == [{"name": "double", "state": "ready"}]
    assert c.status()["devices"][0]["healthy"] is True
    assert c.load_model("m", devices=["cpu"]) == {"name": "m", "devices": ["cpu"]}
    assert c.unload_model("m") == {"name": "m"}
    assert c.ping() >= 0
    with pytest.raises(NotFound) as info:
        c.load_model("nope")
    assert info.value.code is ErrorCode.NOT_FOUND and "nope" in info.value.message


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (ErrorCode.OVERLOADED, Overloaded),
        (ErrorCode.DEADLINE_EXCEEDED, DeadlineExceeded),
        (ErrorCode.NOT_FOUND, NotFound),
        (ErrorCode.DEVICE_ERROR, DeviceError),
        (ErrorCode.CANCELLED, RequestCancelled),
    ],
)
def test_sync_error_mapping(sync_server: tuple[Client, FakeServer], code: ErrorCode, cls: type) -> None:
    c, _ = sync_server
    with pytest.raises(cls) as info:
        c.infer(f"error:{code}", {"x": np.zeros(1)})
    assert isinstance(info.value, ServerError)
    assert info.value.code is code and info.value.message == f"scripted error:{code}"


def test_sync_deadline_without_answer_cancels(sync_server: tuple[Client, FakeServer], no_grace: None) -> None:
    c, server = sync_server
    with pytest.raises(DeadlineExceeded, match="no answer"):
        c.infer("hang", {"x": np.zeros(1)}, timeout=0.05)
    c.ping()  # connection still usable; the cancel op has been processed by now
    assert server.cancels == server.hung_ids and len(server.hung_ids) == 1
    assert server.hanging == {}


def test_sync_connection_loss_fails_waiters() -> None:
    server = FakeServer(hold=100)
    c, thread, server_sock = sync_pair(server)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            c.infer("double", {"x": np.zeros(1)})
        except ConnectionClosed as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    while len(server.held) < 3:
        threading.Event().wait(0.01)
    server_sock.shutdown(socket.SHUT_RDWR)
    for t in threads:
        t.join(5)
    assert len(errors) == 3
    with pytest.raises(ConnectionClosed):
        c.ping()
    c.close()
    thread.join(5)


def test_sync_connection_error_frame_fails_waiters() -> None:
    a, b = socket.socketpair()
    c = Client(a)
    with b, c:
        error = Response.failure(CONNECTION_ERROR_ID, ErrorCode.BAD_REQUEST, "frame too large")
        b.sendall(encode_frame(error.to_message()))
        with pytest.raises(ConnectionClosed, match="frame too large"):
            c.ping()


def test_sync_garbage_from_server_closes_connection() -> None:
    a, b = socket.socketpair()
    c = Client(a)
    with b, c:
        b.sendall(b"\xff\xff\xff\xff")  # a 4 GiB frame header
        with pytest.raises(ConnectionClosed, match="protocol error"):
            c.ping()


def test_sync_connect_unix_path(tmp_path: Path) -> None:
    path = tmp_path / "vk.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()

    def accept_one() -> None:
        conn, _ = listener.accept()
        serve_blocking(conn, FakeServer())

    thread = threading.Thread(target=accept_one, daemon=True)
    thread.start()
    with listener, Client.connect(path) as c:
        y = c.infer("double", {"x": np.arange(5, dtype=np.int64)})["y"]
        np.testing.assert_array_equal(y, np.arange(5) * 2)
    thread.join(5)


@pytest.mark.parametrize("token", ["right", "wrong", None])
def test_sync_connect_tcp_with_token(token: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VKSERVE_TOKEN", raising=False)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept_one() -> None:
        conn, _ = listener.accept()
        serve_blocking(conn, FakeServer(token="right"))

    thread = threading.Thread(target=accept_one, daemon=True)
    thread.start()
    with listener:
        if token == "wrong":
            with pytest.raises(Unauthenticated):
                Client.connect(f"tcp://127.0.0.1:{port}", token=token)
        else:
            with Client.connect(f"127.0.0.1:{port}", token=token) as c:
                if token is None:
                    with pytest.raises(Unauthenticated):
                        c.ping()
                else:
                    assert c.ping() >= 0
    thread.join(5)


# ============================================================================ trio client


async def serve_trio(
    stream: trio.SocketStream,
    server: FakeServer,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until EOF; cancelling the scope handed to ``task_status`` hangs up on the client."""
    async with stream:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while data := await stream.receive_some(65536):
                if out := server.receive(data):
                    await stream.send_all(out)


async def trio_pair(nursery: trio.Nursery, server: FakeServer) -> tuple[trio.SocketStream, trio.CancelScope]:
    a, b = trio.socket.socketpair()
    hang_up = await nursery.start(serve_trio, trio.SocketStream(b), server)
    return trio.SocketStream(a), hang_up


async def test_trio_many_tasks_multiplexed_out_of_order(nursery: trio.Nursery) -> None:
    server = FakeServer(hold=16)
    stream, _ = await trio_pair(nursery, server)
    results: dict[int, np.ndarray] = {}
    async with TrioClient.open(stream) as c:

        async def one(i: int) -> None:
            results[i] = (await c.infer("double", {"x": np.full((2, 2), i, dtype=np.int32)}))["y"]

        async with trio.open_nursery() as inner:
            for i in range(16):
                inner.start_soon(one, i)
    assert sorted(results) == list(range(16))
    for i, y in results.items():
        np.testing.assert_array_equal(y, np.full((2, 2), 2 * i, dtype=np.int32))
    assert server.answer_order == sorted(server.answer_order, reverse=True)


async def test_trio_large_tensor_and_other_ops(nursery: trio.Nursery) -> None:
    stream, _ = await trio_pair(nursery, FakeServer())
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    async with TrioClient.open(stream) as c:
        out = await c.infer("double", {"x": x.T})
        np.testing.assert_array_equal(out["y"], x.T * 2)
        assert c._shm is None  # the server refused the region: inline from then on
        assert await c.models() == [{"name": "double", "state": "ready"}]
        assert (await c.status())["devices"][0]["name"] == "cpu"
        assert await c.load_model("m") == {"name": "m", "devices": None}
        assert await c.unload_model("m") == {"name": "m"}
        assert await c.ping() >= 0


@pytest.mark.parametrize(
    ("code", "cls"), [(ErrorCode.OVERLOADED, Overloaded), (ErrorCode.NOT_FOUND, NotFound)]
)
async def test_trio_error_mapping(nursery: trio.Nursery, code: ErrorCode, cls: type) -> None:
    stream, _ = await trio_pair(nursery, FakeServer())
    async with TrioClient.open(stream) as c:
        with pytest.raises(cls) as info:
            await c.infer(f"error:{code}", {"x": np.zeros(1)})
        assert info.value.code is code


async def test_trio_cancel_sends_cancel_op(nursery: trio.Nursery) -> None:
    server = FakeServer()
    stream, _ = await trio_pair(nursery, server)
    async with TrioClient.open(stream) as c:
        with trio.move_on_after(5) as scope:
            async with trio.open_nursery() as inner:
                inner.start_soon(c.infer, "hang", {"x": np.zeros(1)})
                while not server.hung.is_set():
                    await trio.sleep(0.001)
                inner.cancel_scope.cancel()
        assert not scope.cancelled_caught
        await c.ping()  # the cancel frame went out before this ping: the server has seen it
        assert server.cancels == server.hung_ids and len(server.hung_ids) == 1
        assert server.hanging == {}
        np.testing.assert_array_equal((await c.infer("double", {"x": np.ones(2)}))["y"], [2, 2])


async def test_trio_deadline_without_answer_cancels(nursery: trio.Nursery, no_grace: None) -> None:
    server = FakeServer()
    stream, _ = await trio_pair(nursery, server)
    async with TrioClient.open(stream) as c:
        with pytest.raises(DeadlineExceeded, match="no answer"):
            await c.infer("hang", {"x": np.zeros(1)}, timeout=0.05)
        await c.ping()
        assert server.cancels == server.hung_ids and len(server.hung_ids) == 1
        assert server.hanging == {}


async def test_trio_connection_loss_fails_waiters(nursery: trio.Nursery) -> None:
    server = FakeServer(hold=100)
    stream, hang_up = await trio_pair(nursery, server)
    failures: list[BaseException] = []
    async with TrioClient.open(stream) as c:

        async def one() -> None:
            try:
                await c.infer("double", {"x": np.zeros(1)})
            except ConnectionClosed as exc:
                failures.append(exc)

        async with trio.open_nursery() as inner:
            for _ in range(3):
                inner.start_soon(one)
            while len(server.held) < 3:
                await trio.sleep(0.001)
            hang_up.cancel()
        assert len(failures) == 3
        with pytest.raises(ConnectionClosed):
            await c.ping()


async def test_trio_connect_unix_and_tcp_token(tmp_path: Path, nursery: trio.Nursery) -> None:
    path = tmp_path / "vk.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    unix_listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    nursery.start_soon(trio.serve_listeners, lambda s: serve_trio(s, FakeServer()), [unix_listener])
    async with TrioClient.connect(str(path)) as c:
        assert await c.ping() >= 0

    tcp_listeners = await nursery.start(
        functools.partial(trio.serve_tcp, lambda s: serve_trio(s, FakeServer(token="t")), 0, host="127.0.0.1")
    )
    port = tcp_listeners[0].socket.getsockname()[1]
    async with TrioClient.connect(f"tcp://127.0.0.1:{port}", token="t") as c:
        assert (await c.infer("double", {"x": np.array([3])}))["y"].tolist() == [6]
    with pytest.raises(Unauthenticated):
        async with TrioClient.connect(f"127.0.0.1:{port}", token="x"):
            pass


async def test_trio_errors_leave_the_context_unwrapped(nursery: trio.Nursery) -> None:
    stream, _ = await trio_pair(nursery, FakeServer())
    with pytest.raises(Overloaded):  # not an ExceptionGroup from the client's internal nursery
        async with TrioClient.open(stream) as c:
            await c.infer("error:OVERLOADED", {"x": np.zeros(1)})
    with pytest.raises(ConnectionClosed):
        await c.ping()
