"""The sync client and the AsyncClient (under asyncio and under trio) against an in-test fake
server built on the sans-I/O layer.

No daemon is involved: ``FakeServer`` turns received bytes into response bytes, and thin
drivers run it over a real socketpair (thread) or an anyio Unix/TCP listener.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import numpy as np
import pytest

import vkserve.client.connection
from vkserve.client import (
    AsyncClient,
    Client,
    ConnectFailed,
    ConnectionClosed,
    DeadlineExceeded,
    DeviceError,
    NotFound,
    Overloaded,
    RequestCancelled,
    RetryPolicy,
    ServerError,
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
    cancelled; ``error:CODE``: fails with CODE; ``busy:N``: OVERLOADED to the first N tries
    (``tries`` records each try's timeout), then y = 2*x.
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
        self.tries: list[float | None] = []  # the timeout each busy:N try carried

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
            case InferRequest(model=model) if model.startswith("busy:"):
                self.tries.append(req.timeout)
                if len(self.tries) <= int(model.removeprefix("busy:")):
                    return [Response.failure(req.id, ErrorCode.OVERLOADED, "queue full")]
                return [Response.success(req.id, encode_infer_result({"y": req.inputs["x"] * 2}))]
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


def test_sync_retries_overloaded_with_backoff(sync_server: tuple[Client, FakeServer]) -> None:
    c, server = sync_server
    with pytest.raises(Overloaded):  # retries are opt-in
        c.infer("busy:1", {"x": np.ones(2)})
    server.tries.clear()
    c.retry = RetryPolicy(attempts=3, backoff=0.001, jitter=0)
    reply = c.infer_detailed("busy:2", {"x": np.ones(2)}, timeout=60)
    assert reply.attempts == 3 and reply.outputs["y"].tolist() == [2, 2]
    # every try carried what was left of the call's timeout, never more
    assert len(server.tries) == 3 and all(t is not None and 0 < t <= 60 for t in server.tries)
    assert server.tries == sorted(server.tries, reverse=True)
    server.tries.clear()
    with pytest.raises(Overloaded):  # out of retries: the last OVERLOADED is raised
        c.infer("busy:9", {"x": np.ones(2)})
    assert len(server.tries) == 4


def test_sync_default_timeout_applies_to_every_call(no_grace: None) -> None:
    server = FakeServer()
    a, b = socket.socketpair()
    thread = threading.Thread(target=serve_blocking, args=(b, server), daemon=True)
    thread.start()
    with Client(a, timeout=0.05) as c:
        with pytest.raises(DeadlineExceeded, match=r"no answer from the server within 0\.1 s \(infer\)"):
            c.infer("hang", {"x": np.zeros(1)})  # 0.05 s and the (shortened) grace
        assert c.infer("double", {"x": np.ones(1)}, timeout=None)["y"].tolist() == [2]
        assert server.hanging == {} and server.cancels == server.hung_ids  # cancelled in time
    thread.join(5)


def test_sync_connect_failures_are_client_errors(tmp_path: Path) -> None:
    with pytest.raises(ConnectFailed, match=r"unix:.*missing\.sock: No such file"):
        Client.connect(tmp_path / "missing.sock")
    dead = tmp_path / "dead.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(dead))
    listener.close()  # the file stays, nobody listens: what a killed daemon leaves
    with pytest.raises(ConnectFailed, match="refused"):
        Client.connect(dead)
    port_holder = socket.create_server(("127.0.0.1", 0))
    port = port_holder.getsockname()[1]
    port_holder.close()
    with pytest.raises(ConnectFailed, match=rf"tcp://127\.0\.0\.1:{port}"):
        Client.connect(f"127.0.0.1:{port}", token="t")


# ============================================================================ async client
# Each test runs under asyncio and under trio: one implementation (anyio) for both.


@pytest.fixture(params=["asyncio", "trio"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(backend: str, main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend=backend)


async def serve_async(stream: anyio.abc.ByteStream, server: FakeServer) -> None:
    """Serve until EOF (or until cancelled: the stream is closed, the client sees EOF)."""
    async with stream:
        while True:
            try:
                data = await stream.receive(65536)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
            if out := server.receive(data):
                await stream.send(out)


@asynccontextmanager
async def serving(listener: anyio.abc.Listener[anyio.abc.SocketStream],
                  handle: Callable[[anyio.abc.SocketStream], Awaitable[None]]) -> AsyncIterator[None]:
    """Accept and ``handle`` connections for the block; then stop accepting and let the
    handlers end at their clients' EOF (cancelling a receive as data arrives makes anyio's
    asyncio backend log an InvalidStateError)."""
    async with anyio.create_task_group() as tasks:
        accepting = anyio.CancelScope()

        async def accept() -> None:
            with accepting:
                await listener.serve(handle, task_group=tasks)

        tasks.start_soon(accept)
        yield
        accepting.cancel()


@asynccontextmanager
async def fake_daemon(path: Path, server: FakeServer) -> AsyncIterator[anyio.CancelScope]:
    """``server`` behind a Unix listener at ``path``; cancelling the scope it yields hangs up
    on the (one) connected client."""
    hang_up = anyio.CancelScope()

    async def handle(stream: anyio.abc.SocketStream) -> None:
        with hang_up:
            await serve_async(stream, server)

    async with serving(await anyio.create_unix_listener(path), handle):
        yield hang_up


def test_async_many_tasks_multiplexed_out_of_order(backend: str, tmp_path: Path) -> None:
    server = FakeServer(hold=16)
    results: dict[int, np.ndarray] = {}

    async def main() -> None:
        async with fake_daemon(tmp_path / "vk.sock", server), \
                AsyncClient.connect(tmp_path / "vk.sock") as c:

            async def one(i: int) -> None:
                results[i] = (await c.infer("double", {"x": np.full((2, 2), i, dtype=np.int32)}))["y"]

            async with anyio.create_task_group() as tasks:
                for i in range(16):
                    tasks.start_soon(one, i)

    run(backend, main)
    assert sorted(results) == list(range(16))
    for i, y in results.items():
        np.testing.assert_array_equal(y, np.full((2, 2), 2 * i, dtype=np.int32))
    assert server.answer_order == sorted(server.answer_order, reverse=True)


def test_async_large_tensor_and_other_ops(backend: str, tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB

    async def main() -> None:
        async with fake_daemon(tmp_path / "vk.sock", FakeServer()), \
                AsyncClient.connect(tmp_path / "vk.sock") as c:
            out = await c.infer("double", {"x": x.T})
            np.testing.assert_array_equal(out["y"], x.T * 2)
            # the server refused the region (sent with SCM_RIGHTS): inline from then on
            assert c._shm is not None and c._shm.off is not None and "inline" in c._shm.off
            assert c._shm.regions == []
            assert await c.models() == [{"name": "double", "state": "ready"}]
            assert (await c.status())["devices"][0]["name"] == "cpu"
            assert await c.load_model("m") == {"name": "m", "devices": None}
            assert await c.unload_model("m") == {"name": "m"}
            assert await c.ping() >= 0
            with pytest.raises(NotFound):
                await c.load_model("nope")

    run(backend, main)


@pytest.mark.parametrize(
    ("code", "cls"), [(ErrorCode.OVERLOADED, Overloaded), (ErrorCode.NOT_FOUND, NotFound)]
)
def test_async_error_mapping(backend: str, tmp_path: Path, code: ErrorCode, cls: type) -> None:
    async def main() -> None:
        async with fake_daemon(tmp_path / "vk.sock", FakeServer()), \
                AsyncClient.connect(tmp_path / "vk.sock") as c:
            with pytest.raises(cls) as info:
                await c.infer(f"error:{code}", {"x": np.zeros(1)})
            assert info.value.code is code

    run(backend, main)


def test_async_cancel_sends_cancel_op(backend: str, tmp_path: Path) -> None:
    server = FakeServer()

    async def main() -> None:
        async with fake_daemon(tmp_path / "vk.sock", server), \
                AsyncClient.connect(tmp_path / "vk.sock") as c:
            async with anyio.create_task_group() as inner:
                inner.start_soon(c.infer, "hang", {"x": np.zeros(1)})
                while not server.hung.is_set():
                    await anyio.sleep(0.001)
                inner.cancel_scope.cancel()
            await c.ping()  # the cancel frame went out before this ping: the server has seen it
            assert server.cancels == server.hung_ids and len(server.hung_ids) == 1
            assert server.hanging == {}
            np.testing.assert_array_equal((await c.infer("double", {"x": np.ones(2)}))["y"], [2, 2])

    run(backend, main)


def test_async_default_timeout_cancels_unanswered(backend: str, tmp_path: Path, no_grace: None) -> None:
    server = FakeServer()

    async def main() -> None:
        async with fake_daemon(tmp_path / "vk.sock", server), \
                AsyncClient.connect(tmp_path / "vk.sock", timeout=0.05) as c:
            with pytest.raises(DeadlineExceeded, match=r"no answer from the server within 0\.1 s"):
                await c.infer("hang", {"x": np.zeros(1)})
            await c.ping(timeout=None)
            assert server.cancels == server.hung_ids and len(server.hung_ids) == 1
            assert server.hanging == {}

    run(backend, main)


def test_async_retries_overloaded_with_backoff(backend: str, tmp_path: Path) -> None:
    server = FakeServer()

    async def main() -> None:
        async with fake_daemon(tmp_path / "vk.sock", server), \
                AsyncClient.connect(tmp_path / "vk.sock",
                                    retry=RetryPolicy(attempts=2, backoff=0.001, jitter=0)) as c:
            reply = await c.infer_detailed("busy:2", {"x": np.ones(2)}, timeout=60)
            assert reply.attempts == 3 and reply.outputs["y"].tolist() == [2, 2]
            server.tries.clear()
            with pytest.raises(Overloaded):
                await c.infer("busy:5", {"x": np.ones(2)})
            assert len(server.tries) == 3  # the first try and 2 retries
            server.tries.clear()
            # a retry that could not start before the call's timeout is not made
            c.retry = RetryPolicy(attempts=5, backoff=30, max_backoff=30, jitter=0)
            with pytest.raises(Overloaded):
                await c.infer("busy:5", {"x": np.ones(2)}, timeout=10)
            assert len(server.tries) == 1

    run(backend, main)


def test_async_connection_loss_fails_waiters(backend: str, tmp_path: Path) -> None:
    server = FakeServer(hold=100)
    failures: list[BaseException] = []

    async def main() -> None:
        async with fake_daemon(tmp_path / "vk.sock", server) as hang_up, \
                AsyncClient.connect(tmp_path / "vk.sock") as c:

            async def one() -> None:
                try:
                    await c.infer("double", {"x": np.zeros(1)})
                except ConnectionClosed as exc:
                    failures.append(exc)

            async with anyio.create_task_group() as inner:
                for _ in range(3):
                    inner.start_soon(one)
                while len(server.held) < 3:
                    await anyio.sleep(0.001)
                hang_up.cancel()
            assert len(failures) == 3
            with pytest.raises(ConnectionClosed):
                await c.ping()

    run(backend, main)


def test_async_connect_tcp_token_and_failures(backend: str, tmp_path: Path) -> None:
    async def main() -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with serving(listener, lambda s: serve_async(s, FakeServer(token="t"))):
            async with AsyncClient.connect(f"tcp://127.0.0.1:{port}", token="t") as c:
                assert (await c.infer("double", {"x": np.array([3])}))["y"].tolist() == [6]
            with pytest.raises(Unauthenticated):
                async with AsyncClient.connect(f"127.0.0.1:{port}", token="x"):
                    pass
        with pytest.raises(ConnectFailed, match=r"unix:.*missing\.sock: No such file"):
            async with AsyncClient.connect(tmp_path / "missing.sock"):
                pass
        dead = tmp_path / "dead.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(dead))
        sock.close()
        with pytest.raises(ConnectFailed, match="refused"):
            async with AsyncClient.connect(dead):
                pass
        closed = socket.create_server(("127.0.0.1", 0))
        closed_port = closed.getsockname()[1]
        closed.close()
        with pytest.raises(ConnectFailed, match=rf"tcp://127\.0\.0\.1:{closed_port}: Connection refused"):
            async with AsyncClient.connect(f"127.0.0.1:{closed_port}", token="t"):
                pass

    run(backend, main)


def test_async_errors_leave_the_context_unwrapped(backend: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with fake_daemon(tmp_path / "vk.sock", FakeServer()):
            with pytest.raises(Overloaded):  # not an ExceptionGroup from the client's task group
                async with AsyncClient.connect(tmp_path / "vk.sock") as c:
                    await c.infer("error:OVERLOADED", {"x": np.zeros(1)})
            with pytest.raises(ConnectionClosed):
                await c.ping()

    run(backend, main)
