"""trio client. Many tasks may share one connection: requests are multiplexed by id, and a
reader task (in a nursery the client's context manager owns) routes each response to its
caller. Cancelling a waiting call sends a ``cancel`` op for its request."""

from __future__ import annotations

import array
import logging
import math
import os
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import trio

from .connection import ClientConnection, answer_wait_budget
from .errors import ConnectionClosed, DeadlineExceeded, ServerError, error_from_info
from .framing import DEFAULT_MAX_FRAME_SIZE, ProtocolError
from .messages import (
    CONNECTION_ERROR_ID,
    AuthRequest,
    CancelRequest,
    InferReply,
    InferRequest,
    ListModelsRequest,
    LoadModelRequest,
    PingRequest,
    Request,
    Response,
    ShmRegisterRequest,
    ShmUnregisterRequest,
    StatusRequest,
    UnloadModelRequest,
    decode_infer_reply,
)
from .paths import Address, UnixAddress, check_socket_folder, resolve_address
from .shm import ClientRegion, SharedInputs, SharedMemory

__all__ = ["TrioClient"]

_RECV_SIZE = 64 * 1024  # trio allocates a fresh buffer of this size per receive
#: How long a cancelled call may wait for the send lock to deliver its ``cancel`` op.
_CANCEL_SEND_TIMEOUT = 5.0
log = logging.getLogger(__name__)


class _Slot:
    """Where the reader task leaves the answer for one waiting call."""

    __slots__ = ("event", "response", "failure")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: Response | None = None
        self.failure: str | None = None


class TrioClient:
    """Async vkserve client; obtain one with ``async with TrioClient.connect(...) as c``
    (or :meth:`open` over an existing :class:`trio.abc.Stream`)."""

    def __init__(self, stream: trio.abc.Stream, max_frame_size: int, shared_memory: bool = True) -> None:
        self._stream = stream
        sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        #: large tensors go through shared memory on Unix sockets (vkserve.client.shm)
        self._unix = sock if sock is not None and sock.family == socket.AF_UNIX else None
        self._shm = SharedMemory() if self._unix is not None and shared_memory else None
        self._conn = ClientConnection(max_frame_size)
        self._send_lock = trio.StrictFIFOLock()
        self._pending: dict[int, _Slot] = {}
        self._closed: str | None = None

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        address: str | os.PathLike[str] | Address | None = None,
        *,
        token: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        shared_memory: bool = True,
    ) -> AsyncIterator[TrioClient]:
        """Connect to a socket path, ``host:port`` or ``tcp://host:port`` (default: the local
        daemon's socket). On TCP, ``token`` (default ``$VKSERVE_TOKEN``) authenticates first.
        ``shared_memory=False`` keeps large tensors inline on a Unix socket too."""
        addr = resolve_address(address)
        stream: trio.abc.Stream
        if isinstance(addr, UnixAddress):
            check_socket_folder(addr.path)  # UnsafeSocketFolder: another user could replace it
            stream = await trio.open_unix_socket(addr.path)
        else:
            stream = await trio.open_tcp_stream(addr.host, addr.port)
            if token is None:
                token = os.environ.get("VKSERVE_TOKEN")
        async with cls.open(stream, token=token, max_frame_size=max_frame_size,
                            shared_memory=shared_memory) as client:
            yield client

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        stream: trio.abc.Stream,
        *,
        token: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        shared_memory: bool = True,
    ) -> AsyncIterator[TrioClient]:
        """Run a client over a connected stream; the stream is closed on exit."""
        client = cls(stream, max_frame_size, shared_memory)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client._read_loop)
                try:
                    if token is not None:
                        await client._call(AuthRequest(client._conn.next_id(), token))
                    yield client
                finally:
                    client._fail("client closed the connection")
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The reader task never raises, so a lone exception is the caller's own (or the
            # auth failure): hand it back as itself, not wrapped in our private nursery's group.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from group.exceptions[0].__cause__
            raise
        finally:
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
        timeout: float | None = None,
        outputs: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``model``; returns output name → read-only array. See :meth:`Client.infer`."""
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
        timeout: float | None = None,
        outputs: list[str] | None = None,
    ) -> InferReply:
        """Like :meth:`infer`, with the server's device and queue/run timings."""
        request = self._conn.infer_request(model, inputs, priority=priority, deadline=deadline,
                                           timeout=timeout, outputs=outputs)
        budget = answer_wait_budget(deadline, timeout)
        wait = math.inf if budget is None else budget
        region = await self._shared_region(request)
        if region is None:
            return decode_infer_reply(await self._call(request, wait))
        shared = SharedInputs(region, request.inputs)
        try:
            reply = decode_infer_reply(await self._call(shared.request(request), wait), shared)
        except BaseException:
            await self._drop_region(region)  # the daemon may still write into it
            raise
        assert self._shm is not None
        self._shm.put(region)
        return reply

    async def _shared_region(self, request: InferRequest) -> ClientRegion | None:
        """As ``Client._shared_region``: a registered region, or None to send inline."""
        if self._shm is None or not SharedMemory.wanted(request.inputs):
            return None
        region, new = self._shm.take(request.inputs)
        if new:
            try:
                await self._call(ShmRegisterRequest(self._conn.next_id(), region.name, region.size),
                                 fds=(region.fd,))
            except ServerError as exc:
                log.warning("shared memory off for this connection, tensors go inline: %s", exc)
                self._shm.drop(region)
                self._shm = None
                return None
        return region

    async def _drop_region(self, region: ClientRegion) -> None:
        assert self._shm is not None
        self._shm.drop(region)
        frame = self._conn.encode(ShmUnregisterRequest(self._conn.next_id(), region.name))
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CANCEL_SEND_TIMEOUT):
            try:  # best effort, answer ignored: the daemon frees it with the connection anyway
                await self._send_frame(frame)
            except ConnectionClosed:
                return

    async def models(self) -> list[dict[str, Any]]:
        result = await self._call(ListModelsRequest(self._conn.next_id()))
        return list(result.get("models", [])) if isinstance(result, dict) else []

    async def load_model(self, name: str, *, devices: list[str] | None = None) -> dict[str, Any]:
        return await self._call(LoadModelRequest(self._conn.next_id(), name, devices))

    async def unload_model(self, name: str) -> dict[str, Any]:
        return await self._call(UnloadModelRequest(self._conn.next_id(), name))

    async def status(self) -> dict[str, Any]:
        return await self._call(StatusRequest(self._conn.next_id()))

    async def ping(self) -> float:
        """Round-trip time in seconds."""
        start = trio.current_time()
        await self._call(PingRequest(self._conn.next_id()))
        return trio.current_time() - start

    # ------------------------------------------------------------------ internals

    async def _call(self, request: Request, budget: float = math.inf, fds: tuple[int, ...] = ()) -> Any:
        frame = self._conn.encode(request)
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        slot = _Slot()
        self._pending[request.id] = slot
        sent = False
        try:
            with trio.move_on_after(budget):
                await self._send_frame(frame, fds)
                sent = True
                await slot.event.wait()
        finally:
            # Still pending here means we stopped waiting (cancelled, or out of time).
            if self._pending.pop(request.id, None) is not None and sent:
                await self._send_cancel(request.id)
        if slot.response is not None:
            if slot.response.ok:
                return slot.response.result
            assert slot.response.error is not None  # parse_response guarantees it
            raise error_from_info(slot.response.error)
        if slot.failure is not None:
            raise ConnectionClosed(slot.failure)
        raise DeadlineExceeded("no answer from the server by the request's deadline")

    async def _send_frame(self, frame: bytes, fds: tuple[int, ...] = ()) -> None:
        """Write a frame; ``fds`` travel with its first bytes (SCM_RIGHTS, Unix sockets)."""
        async with self._send_lock:
            if self._closed is not None:
                raise ConnectionClosed(self._closed)
            # A frame is written whole or the stream is lost: a send_all cancelled halfway
            # would leave the server reading a torn frame.
            with trio.CancelScope(shield=True):
                try:
                    sent = 0
                    if fds:
                        assert self._unix is not None
                        sent = await self._unix.sendmsg(
                            [frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                    await self._stream.send_all(memoryview(frame)[sent:])
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._fail(f"send failed: {exc!r}")  # keeps an earlier reason
                    raise ConnectionClosed(self._closed or f"send failed: {exc!r}") from exc

    async def _send_cancel(self, target: int) -> None:
        """Best effort, from a possibly cancelled context: a dead connection has nothing left
        to cancel, and a busy one gets a bounded wait for the send lock."""
        frame = self._conn.encode(CancelRequest(self._conn.next_id(), target))
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CANCEL_SEND_TIMEOUT):
            try:
                await self._send_frame(frame)
            except ConnectionClosed:
                return

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._stream.receive_some(_RECV_SIZE)
                if not data:
                    self._conn.receive_eof()
                    self._fail("server closed the connection")
                    return
                self._conn.receive_data(data)
                while (response := self._conn.next_response()) is not None:
                    self._dispatch(response)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
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
