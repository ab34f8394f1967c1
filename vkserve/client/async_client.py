"""Async client on anyio: one implementation for asyncio (``asyncio.run``) and trio
(``trio.run``). Many tasks may share one connection: requests are multiplexed by id, and a
reader task (in a task group the client's context manager owns) routes each response to its
caller. Cancelling a waiting call sends a ``cancel`` op for its request."""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import numpy as np
import numpy.typing as npt

from .calls import Call, InferCall, Pause, Post, Step, arun_steps, infer_steps
from .connection import ClientConnection
from .errors import CallTimeout, ConnectFailed, ConnectionClosed, error_from_info
from .framing import DEFAULT_MAX_FRAME_SIZE, ProtocolError
from .messages import (
    CONNECTION_ERROR_ID,
    AuthRequest,
    CancelRequest,
    InferReply,
    ListModelsRequest,
    LoadModelRequest,
    PingRequest,
    Request,
    Response,
    StatusRequest,
    UnloadModelRequest,
)
from .paths import Address, TcpAddress, UnixAddress, check_socket_folder, resolve_address
from .policy import DEFAULT, DEFAULT_TIMEOUT, RetryPolicy, Timeout, resolve_timeout
from .shm import SharedMemory

__all__ = ["AsyncClient"]

_RECV_SIZE = 64 * 1024
#: How long a best-effort frame sent from a cancelled call (``cancel``, ``shm_unregister``)
#: may wait for the send lock.
_CANCEL_SEND_TIMEOUT = 5.0
_STREAM_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError)


class _Slot:
    """Where the reader task leaves the answer for one waiting call."""

    __slots__ = ("event", "response", "failure")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.response: Response | None = None
        self.failure: str | None = None


async def _open_stream(addr: Address, timeout: float | None) -> anyio.abc.SocketStream:
    """A connected stream to ``addr`` within ``timeout``, or ConnectFailed."""
    try:
        with anyio.fail_after(timeout):
            if isinstance(addr, UnixAddress):
                check_socket_folder(addr.path)  # UnsafeSocketFolder: another user could replace it
                return await anyio.connect_unix(addr.path)
            return await anyio.connect_tcp(addr.host, addr.port)
    except TimeoutError as exc:
        if timeout is None:  # the system's own connect timeout
            raise ConnectFailed.from_os_error(str(addr), exc) from exc
        raise ConnectFailed(str(addr), f"no connection within {timeout:g} s") from exc
    except OSError as exc:
        raise ConnectFailed.from_os_error(str(addr), exc) from exc


class AsyncClient:
    """Async vkserve client for asyncio and trio programs::

        async with AsyncClient.connect("/run/vkserve/vkserve.sock") as client:
            outputs = await client.infer("digits", {"data": x})

    (or :meth:`open` over a connected anyio byte stream). Every call waits at most
    ``timeout`` seconds (the client's, or the call's own; ``None``: no limit), then raises
    :class:`~vkserve.client.errors.CallTimeout` (a DeadlineExceeded); server errors raise
    :class:`~vkserve.client.errors.ServerError` subclasses; a lost connection raises
    :class:`~vkserve.client.errors.ConnectionClosed`. With ``retry``, an infer answered
    OVERLOADED is tried again (:class:`~vkserve.client.policy.RetryPolicy`).
    """

    def __init__(self, stream: anyio.abc.ByteStream, *, timeout: float | None = DEFAULT_TIMEOUT,
                 retry: RetryPolicy | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 shared_memory: bool = True) -> None:
        self._stream = stream
        self.timeout = resolve_timeout(timeout, None)
        self.retry = retry
        #: large tensors go through shared memory on Unix sockets (vkserve.client.shm)
        self._unix = stream if isinstance(stream, anyio.abc.UNIXSocketStream) else None
        self._shm = SharedMemory() if self._unix is not None and shared_memory else None
        self._conn = ClientConnection(max_frame_size)
        self._send_lock = anyio.Lock()
        #: a plain socket's own (non-blocking) socket, for ``_send_frame``'s direct writes; not
        #: where the stream writes through a transport of its own (asyncio's TCP streams)
        raw = (stream.extra(anyio.abc.SocketAttribute.raw_socket)
               if isinstance(stream, anyio.abc.SocketStream) else None)
        self._raw = raw if isinstance(raw, socket.socket) else None
        self._pending: dict[int, _Slot] = {}
        self._closed: str | None = None

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        address: str | os.PathLike[str] | Address | None = None,
        *,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        shared_memory: bool = True,
    ) -> AsyncIterator[AsyncClient]:
        """Connect to a socket path, ``host:port`` or ``tcp://host:port`` (default: the local
        daemon's socket). On TCP, ``token`` (default ``$VKSERVE_TOKEN``) authenticates first.

        ``timeout`` bounds the connect and is every call's default wait; ``retry`` retries
        infers answered OVERLOADED; ``shared_memory=False`` keeps large tensors inline on a
        Unix socket too. Raises :class:`~vkserve.client.errors.ConnectFailed` when no daemon
        can be reached there."""
        addr = resolve_address(address)
        if token is None and isinstance(addr, TcpAddress):
            token = os.environ.get("VKSERVE_TOKEN")
        stream = await _open_stream(addr, timeout)
        async with cls.open(stream, token=token, timeout=timeout, retry=retry,
                            max_frame_size=max_frame_size, shared_memory=shared_memory) as client:
            yield client

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        stream: anyio.abc.ByteStream,
        *,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        shared_memory: bool = True,
    ) -> AsyncIterator[AsyncClient]:
        """Run a client over a connected stream (authenticating with ``token`` first when
        given); the stream is closed on exit. Arguments as for :meth:`connect`."""
        client = cls(stream, timeout=timeout, retry=retry, max_frame_size=max_frame_size,
                     shared_memory=shared_memory)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client._read_loop)
                try:
                    if token is not None:
                        await client._call(AuthRequest(client._conn.next_id(), token), client.timeout)
                    yield client
                finally:
                    client._fail("client closed the connection")
                    # Closing the stream ends the reader's receive; the cancel is for a reader
                    # that was not waiting on the stream then.
                    with anyio.CancelScope(shield=True):
                        await stream.aclose()
                    tasks.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The reader task never raises, so a lone exception is the caller's own (or the
            # auth failure): hand it back as itself, not wrapped in our private task group's.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from group.exceptions[0].__cause__
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            if client._shm is not None:
                client._shm.close()

    # ------------------------------------------------------------------ API

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.ArrayLike],
        *,
        priority: int = 0,
        deadline: float | None = None,
        timeout: Timeout = DEFAULT,
        outputs: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``model``; returns output name → read-only array.

        ``deadline`` is absolute ``time.time()``; ``timeout`` is seconds (default: the
        client's), sent to the daemon too, which drops a request it cannot answer in time.
        Without an answer by then (plus :data:`vkserve.client.connection.DEADLINE_GRACE`) the
        request is cancelled and DeadlineExceeded is raised.
        """
        reply = await self.infer_detailed(model, inputs, priority=priority, deadline=deadline,
                                          timeout=timeout, outputs=outputs)
        return reply.outputs

    async def infer_detailed(
        self,
        model: str,
        inputs: Mapping[str, npt.ArrayLike],
        *,
        priority: int = 0,
        deadline: float | None = None,
        timeout: Timeout = DEFAULT,
        outputs: list[str] | None = None,
    ) -> InferReply:
        """Like :meth:`infer`, with the daemon's device, queue/run timings and batch size, and
        the tries this client made (``attempts``)."""
        call = InferCall(model, inputs, priority, deadline, resolve_timeout(timeout, self.timeout), outputs)
        return await arun_steps(infer_steps(self._conn, self._shm, call, self.retry), self._perform)

    async def _perform(self, step: Step) -> Any:
        match step:
            case Call(request, wait, fds):
                return await self._call(request, math.inf if wait is None else wait, fds)
            case Post(request):
                await self._send_best_effort(request)
            case Pause(seconds):
                await anyio.sleep(seconds)
        return None

    async def models(self, *, timeout: Timeout = DEFAULT) -> list[dict[str, Any]]:
        """The daemon's models (name, inputs with shapes, devices, state, ...)."""
        result = await self._call(ListModelsRequest(self._conn.next_id()), self._wait(timeout))
        return list(result.get("models", [])) if isinstance(result, dict) else []

    async def load_model(self, name: str, *, devices: list[str] | None = None,
                         timeout: Timeout = DEFAULT) -> dict[str, Any]:
        """Load model ``name`` from the daemon's repository (on ``devices``: ``"cpu"`` or
        device indices as strings; default: its config); returns the model's entry."""
        return await self._call(LoadModelRequest(self._conn.next_id(), name, devices), self._wait(timeout))

    async def unload_model(self, name: str, *, timeout: Timeout = DEFAULT) -> dict[str, Any]:
        """Unload model ``name`` (requests in flight finish first)."""
        return await self._call(UnloadModelRequest(self._conn.next_id(), name), self._wait(timeout))

    async def status(self, *, timeout: Timeout = DEFAULT) -> dict[str, Any]:
        """The daemon's devices with health, queue depths, jobs in flight and models."""
        return await self._call(StatusRequest(self._conn.next_id()), self._wait(timeout))

    async def ping(self, *, timeout: Timeout = DEFAULT) -> float:
        """Round-trip time in seconds."""
        start = time.perf_counter()
        await self._call(PingRequest(self._conn.next_id()), self._wait(timeout))
        return time.perf_counter() - start

    def _wait(self, timeout: Timeout) -> float:
        seconds = resolve_timeout(timeout, self.timeout)
        return math.inf if seconds is None else seconds

    # ------------------------------------------------------------------ internals

    async def _call(self, request: Request, budget: float = math.inf, fds: tuple[int, ...] = ()) -> Any:
        frame = self._conn.encode(request)
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        slot = _Slot()
        self._pending[request.id] = slot
        sent = False
        try:
            with anyio.move_on_after(budget):
                await self._send_frame(frame, fds)
                sent = True
                await slot.event.wait()
        finally:
            # Still pending here means we stopped waiting (cancelled, or out of time).
            if self._pending.pop(request.id, None) is not None and sent:
                await self._send_best_effort(CancelRequest(self._conn.next_id(), request.id))
        if slot.response is not None:
            if slot.response.ok:
                return slot.response.result
            assert slot.response.error is not None  # parse_response guarantees it
            raise error_from_info(slot.response.error)
        if slot.failure is not None:
            raise ConnectionClosed(slot.failure)
        raise CallTimeout(f"no answer from the server within {budget:.3g} s ({request.op.value})")

    async def _send_frame(self, frame: bytes, fds: tuple[int, ...] = ()) -> None:
        """Write a frame; ``fds`` travel with its first byte (SCM_RIGHTS, Unix sockets).

        With nothing else sending, a plain socket takes the frame at once with one ``send``
        (what does not fit follows through the stream, the lock still held): the stream's path
        costs a schedule point and a cancel scope a frame, a large share of a small request's
        client-side CPU."""
        if not fds and self._raw is not None and self._closed is None:
            try:
                self._send_lock.acquire_nowait()
            except anyio.WouldBlock:
                pass  # another task is sending: queue behind it
            else:
                try:
                    await self._send_direct(self._raw, frame)
                finally:
                    self._send_lock.release()
                return
        async with self._send_lock:
            if self._closed is not None:
                raise ConnectionClosed(self._closed)
            # A frame is written whole or the stream is lost: a send cancelled halfway would
            # leave the server reading a torn frame.
            with anyio.CancelScope(shield=True):
                try:
                    if fds:
                        assert self._unix is not None
                        await self._unix.send_fds(frame[:1], fds)  # one byte: never a partial send
                        frame = frame[1:]
                    await self._stream.send(frame)
                except _STREAM_GONE as exc:
                    raise self._send_failed(exc) from exc

    async def _send_direct(self, raw: socket.socket, frame: bytes) -> None:
        """``_send_frame``'s direct write (the send lock held)."""
        try:
            sent = raw.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise self._send_failed(exc) from exc
        if sent == len(frame):
            return
        with anyio.CancelScope(shield=True):  # the frame's rest, never torn (see _send_frame)
            try:
                await self._stream.send(memoryview(frame)[sent:])
            except _STREAM_GONE as exc:
                raise self._send_failed(exc) from exc

    def _send_failed(self, exc: Exception) -> ConnectionClosed:
        """Mark the connection dead after a failed send (an earlier reason is kept); the error
        for the caller to raise."""
        self._fail(f"send failed: {exc!r}")
        return ConnectionClosed(self._closed or f"send failed: {exc!r}")

    async def _send_best_effort(self, request: Request) -> None:
        """Send a frame whose answer nobody waits for (``cancel``, ``shm_unregister``), from a
        possibly cancelled context: a dead connection has nothing left to cancel, and a busy
        one gets a bounded wait for the send lock."""
        frame = self._conn.encode(request)
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + _CANCEL_SEND_TIMEOUT):
            try:
                await self._send_frame(frame)
            except ConnectionClosed:
                return

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    data = await self._stream.receive(_RECV_SIZE)
                except anyio.EndOfStream:
                    self._conn.receive_eof()
                    self._fail("server closed the connection")
                    return
                self._conn.receive_data(data)
                while (response := self._conn.next_response()) is not None:
                    self._dispatch(response)
        except _STREAM_GONE as exc:
            self._fail(f"connection lost: {exc!r}")
        except ProtocolError as exc:
            self._fail(f"protocol error from server: {exc}")

    def _dispatch(self, response: Response) -> None:
        if response.id == CONNECTION_ERROR_ID and response.error is not None:
            self._fail(f"server reported a connection error: {error_from_info(response.error)}")
            return
        slot = self._pending.pop(response.id, None)
        if slot is None:
            return  # answer to a request we cancelled or gave up on
        slot.response = response
        slot.event.set()

    def _fail(self, reason: str) -> None:
        """Mark the connection dead (first reason wins) and wake every waiting call."""
        if self._closed is None:
            self._closed = reason
        pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.failure = self._closed
            slot.event.set()
