"""Blocking client. One connection carries many requests in flight: any number of threads may
call it at once; a reader thread routes each response to its caller by request id."""

from __future__ import annotations

import array
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from .connection import ClientConnection, answer_wait_budget
from .errors import ClientError, ConnectionClosed, DeadlineExceeded, ServerError, error_from_info
from .framing import DEFAULT_MAX_FRAME_SIZE, ProtocolError
from .messages import (
    CONNECTION_ERROR_ID,
    AuthRequest,
    CancelRequest,
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
    decode_infer_result,
)
from .paths import Address, TcpAddress, UnixAddress, check_socket_folder, resolve_address
from .shm import ClientRegion, SharedInputs, SharedMemory

__all__ = ["Client", "open_socket"]

_RECV_SIZE = 256 * 1024
log = logging.getLogger(__name__)


def open_socket(address: Address, timeout: float | None) -> socket.socket:
    """A connected blocking stream socket for ``address`` (TCP_NODELAY on TCP). A Unix
    socket whose folder another user could write is refused (``UnsafeSocketFolder``)."""
    if isinstance(address, UnixAddress):
        check_socket_folder(address.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(address.path)
        except BaseException:
            sock.close()
            raise
    else:
        sock = socket.create_connection((address.host, address.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    return sock


class Client:
    """Synchronous vkserve client over one socket.

    Use :meth:`connect`, or wrap an already connected stream socket with ``Client(sock)``.
    Server errors raise :class:`~client.errors.ServerError` subclasses; a lost connection raises
    :class:`~client.errors.ConnectionClosed` in every caller waiting on it.
    """

    def __init__(self, sock: socket.socket, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._sock = sock
        #: large tensors go through shared memory on Unix sockets (vkserve.client.shm)
        self._shm = SharedMemory() if sock.family == socket.AF_UNIX else None
        self._conn = ClientConnection(max_frame_size)
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}
        self._closed: str | None = None  # why the connection is dead, once it is
        self._reader = threading.Thread(target=self._read_loop, name="vkserve-client-reader", daemon=True)
        self._reader.start()

    @classmethod
    def connect(
        cls,
        address: str | os.PathLike[str] | Address | None = None,
        *,
        token: str | None = None,
        connect_timeout: float | None = 10.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> Client:
        """Connect to a socket path, ``host:port`` or ``tcp://host:port`` (default: the local
        daemon's socket). On TCP, ``token`` (default ``$VKSERVE_TOKEN``) authenticates first."""
        addr = resolve_address(address)
        if token is None and isinstance(addr, TcpAddress):
            token = os.environ.get("VKSERVE_TOKEN")
        client = cls(open_socket(addr, connect_timeout), max_frame_size=max_frame_size)
        if token is not None:
            try:
                client._call(AuthRequest(client._conn.next_id(), token))
            except BaseException:
                client.close()
                raise
        return client

    # ------------------------------------------------------------------ API

    def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.ArrayLike],
        *,
        priority: int = 0,
        deadline: float | None = None,
        timeout: float | None = None,
        outputs: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``model``; returns output name → read-only array.

        ``deadline`` is absolute ``time.time()``; ``timeout`` is seconds. Without an answer by
        then (plus :data:`vkserve.client.connection.DEADLINE_GRACE`) the request is cancelled and
        DeadlineExceeded is raised.
        """
        request = self._conn.infer_request(model, inputs, priority=priority, deadline=deadline,
                                           timeout=timeout, outputs=outputs)
        wait = answer_wait_budget(deadline, timeout)
        region = self._shared_region(request)
        if region is None:
            return decode_infer_result(self._call(request, wait))
        shared = SharedInputs(region, request.inputs)
        try:
            outputs = decode_infer_result(self._call(shared.request(request), wait), shared)
        except BaseException:
            self._drop_region(region)  # the daemon may still write into it
            raise
        assert self._shm is not None
        self._shm.put(region)
        return outputs

    def _shared_region(self, request: InferRequest) -> ClientRegion | None:
        """A registered region for the request's inputs when they are large enough and the
        connection is a Unix socket; None to send them inline (also when the daemon refuses
        a region: shared memory is then off for this connection, with a log line)."""
        if self._shm is None or not SharedMemory.wanted(request.inputs):
            return None
        region, new = self._shm.take(request.inputs)
        if new:
            try:
                self._call(ShmRegisterRequest(self._conn.next_id(), region.name, region.size),
                           fds=(region.fd,))
            except ServerError as exc:
                log.warning("shared memory off for this connection, tensors go inline: %s", exc)
                self._shm.drop(region)
                self._shm = None
                return None
        return region

    def _drop_region(self, region: ClientRegion) -> None:
        assert self._shm is not None
        self._shm.drop(region)
        try:  # best effort, answer ignored: the daemon frees it with the connection anyway
            self._send(self._conn.encode(ShmUnregisterRequest(self._conn.next_id(), region.name)))
        except (ClientError, OSError):
            return

    def models(self) -> list[dict[str, Any]]:
        """The daemon's models (name, inputs with shapes, devices, state, ...)."""
        result = self._call(ListModelsRequest(self._conn.next_id()))
        return list(result.get("models", [])) if isinstance(result, dict) else []

    def load_model(self, name: str, *, devices: list[str] | None = None) -> dict[str, Any]:
        return self._call(LoadModelRequest(self._conn.next_id(), name, devices))

    def unload_model(self, name: str) -> dict[str, Any]:
        return self._call(UnloadModelRequest(self._conn.next_id(), name))

    def status(self) -> dict[str, Any]:
        return self._call(StatusRequest(self._conn.next_id()))

    def ping(self) -> float:
        """Round-trip time in seconds."""
        start = time.perf_counter()
        self._call(PingRequest(self._conn.next_id()))
        return time.perf_counter() - start

    def close(self) -> None:
        """Close the connection; requests still in flight raise ConnectionClosed."""
        self._fail("client closed the connection")
        if self._reader is not threading.current_thread():
            self._reader.join()
        self._sock.close()
        if self._shm is not None:
            self._shm.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _call(self, request: Request, wait: float | None = None, fds: tuple[int, ...] = ()) -> Any:
        frame = self._conn.encode(request)
        future: Future[Any] = Future()
        with self._state_lock:
            if self._closed is not None:
                raise ConnectionClosed(self._closed)
            self._pending[request.id] = future
        try:
            self._send(frame, fds)
            return future.result(wait)
        except TimeoutError:
            if self._forget(request.id):
                self._cancel(request.id)
                raise DeadlineExceeded("no answer from the server by the request's deadline") from None
            return future.result()  # the answer arrived just as the wait ran out
        except BaseException:
            # Interrupted (e.g. KeyboardInterrupt): withdraw the request server-side too.
            if self._forget(request.id):
                self._cancel(request.id)
            raise
        finally:
            self._forget(request.id)

    def _forget(self, request_id: int) -> bool:
        """Drop a pending request; False if a response (or failure) already claimed it."""
        with self._state_lock:
            return self._pending.pop(request_id, None) is not None

    def _cancel(self, target: int) -> None:
        """Best effort: on a dead connection there is nothing left to cancel."""
        try:
            self._send(self._conn.encode(CancelRequest(self._conn.next_id(), target)))
        except (ClientError, OSError):
            return

    def _send(self, frame: bytes, fds: tuple[int, ...] = ()) -> None:
        """Write a frame; ``fds`` travel with its first bytes (SCM_RIGHTS, Unix sockets)."""
        with self._send_lock:
            if self._closed is not None:
                raise ConnectionClosed(self._closed)
            try:
                sent = 0
                if fds:
                    sent = self._sock.sendmsg(
                        [frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                self._sock.sendall(memoryview(frame)[sent:])
            except OSError as exc:
                # The reader may have closed the connection first (e.g. on an error frame):
                # report the first reason, not the broken pipe it caused.
                self._fail(f"send failed: {exc}")
                raise ConnectionClosed(self._closed or f"send failed: {exc}") from exc
            except BaseException:
                # Interrupted mid-frame: the stream's framing can no longer be trusted.
                self._fail("connection closed after an interrupted send")
                raise

    def _read_loop(self) -> None:
        buf = bytearray(_RECV_SIZE)  # reused: no allocation per recv
        view = memoryview(buf)
        try:
            while True:
                n = self._sock.recv_into(buf)
                if not n:
                    self._conn.receive_eof()
                    self._fail("server closed the connection")
                    return
                self._conn.receive_data(view[:n])
                while (response := self._conn.next_response()) is not None:
                    self._dispatch(response)
        except OSError as exc:
            self._fail(f"connection lost: {exc}")
        except ProtocolError as exc:
            self._fail(f"protocol error from server: {exc}")

    def _dispatch(self, response: Response) -> None:
        if response.id == CONNECTION_ERROR_ID and response.error is not None:
            # An error that belongs to no request: the server is about to close the connection.
            self._fail(f"server reported a connection error: {error_from_info(response.error)}")
            return
        with self._state_lock:
            future = self._pending.pop(response.id, None)
        if future is None:
            return  # answer to a request we cancelled or gave up on
        if response.ok:
            future.set_result(response.result)
        else:
            assert response.error is not None  # parse_response guarantees it
            future.set_exception(error_from_info(response.error))

    def _fail(self, reason: str) -> None:
        """Mark the connection dead (first reason wins) and fail everything in flight."""
        with self._state_lock:
            if self._closed is None:
                self._closed = reason
            reason = self._closed
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(ConnectionClosed(reason))
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
        except OSError:
            return  # already shut down or never connected
