"""Blocking client. One connection carries many requests in flight: any number of threads may
call it at once; a reader thread routes each response to its caller by request id."""

from __future__ import annotations

import array
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

from .calls import Call, InferCall, Pause, Post, Step, infer_steps, run_steps
from .connection import ClientConnection
from .errors import CallTimeout, ClientError, ConnectFailed, ConnectionClosed, error_from_info
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

__all__ = ["Client", "open_socket"]

_RECV_SIZE = 256 * 1024


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
    Every call waits at most ``timeout`` seconds (the client's, or the call's own ``timeout``;
    ``None``: no limit), then raises :class:`~vkserve.client.errors.CallTimeout` (a
    DeadlineExceeded). Server errors raise :class:`~vkserve.client.errors.ServerError`
    subclasses; a lost connection raises :class:`~vkserve.client.errors.ConnectionClosed` in
    every caller waiting on it.
    With ``retry``, an infer answered OVERLOADED is tried again (see
    :class:`~vkserve.client.policy.RetryPolicy`).
    """

    def __init__(self, sock: socket.socket, *, timeout: float | None = DEFAULT_TIMEOUT,
                 retry: RetryPolicy | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 shared_memory: bool = True) -> None:
        self._sock = sock
        self.timeout = resolve_timeout(timeout, None)
        self.retry = retry
        #: large tensors go through shared memory on Unix sockets (vkserve.client.shm)
        self._shm = SharedMemory() if sock.family == socket.AF_UNIX and shared_memory else None
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
        timeout: float | None = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        shared_memory: bool = True,
    ) -> Client:
        """Connect to a socket path, ``host:port`` or ``tcp://host:port`` (default: the local
        daemon's socket). On TCP, ``token`` (default ``$VKSERVE_TOKEN``) authenticates first.

        ``timeout`` bounds the connect and is every call's default wait; ``retry`` retries
        infers answered OVERLOADED; ``shared_memory=False`` keeps large tensors inline on a
        Unix socket too. Raises :class:`~vkserve.client.errors.ConnectFailed` when no daemon
        can be reached there."""
        addr = resolve_address(address)
        if token is None and isinstance(addr, TcpAddress):
            token = os.environ.get("VKSERVE_TOKEN")
        try:
            sock = open_socket(addr, timeout)
        except OSError as exc:
            raise ConnectFailed.from_os_error(str(addr), exc) from exc
        client = cls(sock, timeout=timeout, retry=retry, max_frame_size=max_frame_size,
                     shared_memory=shared_memory)
        if token is not None:
            try:
                client._call(AuthRequest(client._conn.next_id(), token), timeout)
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
        timeout: Timeout = DEFAULT,
        outputs: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``model``; returns output name → read-only array.

        ``deadline`` is absolute ``time.time()``; ``timeout`` is seconds (default: the
        client's), sent to the daemon too, which drops a request it cannot answer in time.
        Without an answer by then (plus :data:`vkserve.client.connection.DEADLINE_GRACE`) the
        request is cancelled and DeadlineExceeded is raised.
        """
        return self.infer_detailed(model, inputs, priority=priority, deadline=deadline,
                                   timeout=timeout, outputs=outputs).outputs

    def infer_detailed(
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
        return run_steps(infer_steps(self._conn, self._shm, call, self.retry), self._perform)

    def _perform(self, step: Step) -> Any:
        match step:
            case Call(request, wait, fds):
                return self._call(request, wait, fds)
            case Post(request):
                try:  # best effort, answer ignored
                    self._send(self._conn.encode(request))
                except (ClientError, OSError):
                    return None
            case Pause(seconds):
                time.sleep(seconds)
        return None

    def models(self, *, timeout: Timeout = DEFAULT) -> list[dict[str, Any]]:
        """The daemon's models (name, inputs with shapes, devices, state, ...)."""
        result = self._call(ListModelsRequest(self._conn.next_id()), self._wait(timeout))
        return list(result.get("models", [])) if isinstance(result, dict) else []

    def load_model(self, name: str, *, devices: list[str] | None = None,
                   timeout: Timeout = DEFAULT) -> dict[str, Any]:
        """Load model ``name`` from the daemon's repository (on ``devices``: ``"cpu"`` or
        device indices as strings; default: its config); returns the model's entry."""
        return self._call(LoadModelRequest(self._conn.next_id(), name, devices), self._wait(timeout))

    def unload_model(self, name: str, *, timeout: Timeout = DEFAULT) -> dict[str, Any]:
        """Unload model ``name`` (requests in flight finish first)."""
        return self._call(UnloadModelRequest(self._conn.next_id(), name), self._wait(timeout))

    def status(self, *, timeout: Timeout = DEFAULT) -> dict[str, Any]:
        """The daemon's devices with health, queue depths, jobs in flight and models."""
        return self._call(StatusRequest(self._conn.next_id()), self._wait(timeout))

    def ping(self, *, timeout: Timeout = DEFAULT) -> float:
        """Round-trip time in seconds."""
        start = time.perf_counter()
        self._call(PingRequest(self._conn.next_id()), self._wait(timeout))
        return time.perf_counter() - start

    def _wait(self, timeout: Timeout) -> float | None:
        return resolve_timeout(timeout, self.timeout)

    def close(self) -> None:
        """Close the connection; requests still in flight raise ConnectionClosed."""
        self._fail("client closed the connection")
        if self._reader is not threading.current_thread():
            self._reader.join()
        self._sock.close()
        if self._shm is not None:
            self._shm.close()

    def __enter__(self) -> Client:
        """The client itself; the block's end closes it."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the connection (see :meth:`close`)."""
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
                raise CallTimeout(f"no answer from the server within {wait:.3g} s "
                                       f"({request.op.value})") from None
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
