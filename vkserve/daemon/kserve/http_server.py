"""KServe v2 over HTTP/1.1 on trio: the socket side, with h11 (the mapping is ``http_core``).

Per connection: h11 parses requests (keep-alive: one after the other); a request head is checked
for the token (``http_core.authorize``; wrong tokens from one address throttled as on the
native TCP listener) and its declared size before its body is read; the body must arrive
within ``server.frame_timeout`` and be at most ``server.max_frame_size`` bytes; an idle
connection closes after ``server.idle_timeout``; connections beyond ``server.max_connections``
(counted apart from the native protocol's) are answered 503 and closed. A drain (the daemon
shuts down) answers what is in flight with ``Connection: close`` and closes idle connections.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from http import HTTPStatus

import h11
import trio

from vkserve.client.protocol import ErrorCode
from vkserve.daemon.config import ServerConfig
from vkserve.daemon.kserve.http_core import HttpRequest, HttpResponse, answer, authorize, error_response
from vkserve.daemon.kserve.service import KServeService
from vkserve.daemon.limits import AuthThrottle, address_key

log = logging.getLogger(__name__)

__all__ = ["HttpFrontend"]

RECV_SIZE = 256 * 1024
#: Largest request head (request line and headers).
MAX_HEAD = 64 * 1024
_KNOWN_STATUS = {s.value for s in HTTPStatus}


class _Close(Exception):
    """Internal: stop serving this connection (after what was sent)."""


class HttpFrontend:
    """Serves accepted streams (``handle``) through the shared service."""

    def __init__(self, service: KServeService, limits: ServerConfig, token: str | None,
                 throttle: AuthThrottle) -> None:
        self.service = service
        self.limits = limits
        self.token = token
        self.throttle = throttle
        self.connections: set[_HttpConnection] = set()
        #: Requests read and not yet answered (a drain waits for none).
        self.answering = 0
        self._idle = trio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def answering_one(self) -> Iterator[None]:
        """Counts one request from its read until its answer is sent."""
        self.answering += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        try:
            yield
        finally:
            self.answering -= 1
            if not self.answering:
                self._idle.set()

    async def wait_idle(self) -> None:
        """Until every request read so far has its answer sent (or its connection is gone)."""
        await self._idle.wait()

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            peer = address_key(str(stream.socket.getpeername()[0]))
        except OSError:
            peer = "?"
        if len(self.connections) >= self.limits.max_connections:
            await _refuse_connection(stream, f"too many HTTP connections (limit "
                                             f"{self.limits.max_connections})")
            return
        conn = _HttpConnection(self, stream, peer)
        self.connections.add(conn)
        try:
            async with stream:
                await conn.run()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("http connection from %s: %r", peer, exc)
        finally:
            self.connections.discard(conn)

    def begin_drain(self) -> None:
        """Close the connections that wait for a request; the others close after their answer."""
        for conn in list(self.connections):
            conn.begin_drain()


async def _refuse_connection(stream: trio.SocketStream, message: str) -> None:
    """A 503 before any request is read (written by hand: h11 answers requests only), then close."""
    response = error_response(ErrorCode.UNAVAILABLE, message)
    head = "".join(f"{k}: {v}\r\n" for k, v in response.headers)
    data = (f"HTTP/1.1 503 {HTTPStatus(503).phrase}\r\n{head}content-length: {len(response.body)}\r\n"
            f"connection: close\r\n\r\n").encode("latin-1") + response.body
    async with stream:
        with trio.move_on_after(1.0), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(data)


class _HttpConnection:
    def __init__(self, frontend: HttpFrontend, stream: trio.SocketStream, peer: str) -> None:
        self.frontend = frontend
        self.limits = frontend.limits
        self.stream = stream
        self.peer = peer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._idle_scope: trio.CancelScope | None = None

    def begin_drain(self) -> None:
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def _next_event(self, deadline: float) -> h11.Event | None:
        """The next h11 event, or None when ``deadline`` passed first."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.move_on_at(deadline):
                data = await self.stream.receive_some(RECV_SIZE)
                self.h11.receive_data(data)
                continue
            return None

    async def _send(self, response: HttpResponse, close: bool = False, head_only: bool = False) -> None:
        """Write one response (``head_only``: a HEAD request's, its body's length but no body)."""
        headers = [*response.headers, ("content-length", str(len(response.body)))]
        if close:
            headers.append(("connection", "close"))
        reason = HTTPStatus(response.status).phrase if response.status in _KNOWN_STATUS else ""
        data = self.h11.send(h11.Response(status_code=response.status, headers=headers,
                                          reason=reason.encode("ascii")))
        body = self.h11.send(h11.Data(data=response.body)) if response.body and not head_only else b""
        end = self.h11.send(h11.EndOfMessage())
        with trio.move_on_after(self.limits.send_timeout) as timer:
            await self.stream.send_all(b"".join([data or b"", body or b"", end or b""]))
        if timer.cancelled_caught:
            raise _Close(f"client did not read for {self.limits.send_timeout} s")

    async def _refuse(self, code: ErrorCode, message: str) -> None:
        """Answer an error and close (the request's body, if any, stays unread)."""
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await self._send(error_response(code, message), close=True)
        raise _Close(message)

    async def run(self) -> None:
        try:
            while True:
                await self._serve_one()
                if self.h11.our_state is h11.MUST_CLOSE or self.frontend.service.host.draining:
                    return
                self.h11.start_next_cycle()
        except _Close as exc:
            log.debug("http connection from %s closed: %s", self.peer, exc)
        except h11.RemoteProtocolError as exc:
            if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self._send(error_response(ErrorCode.BAD_REQUEST, f"bad HTTP request: {exc}"),
                                 close=True)

    async def _serve_one(self) -> None:
        if self.frontend.service.host.draining:
            raise _Close("draining")
        event: h11.Event | None = None  # stays None when the drain interrupts the wait
        with trio.CancelScope() as self._idle_scope:
            event = await self._next_event(trio.current_time() + self.limits.idle_timeout)
        self._idle_scope = None
        if not isinstance(event, h11.Request):
            raise _Close("idle" if event is None else f"peer sent {type(event).__name__}")
        headers = tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in event.headers)
        refusal = authorize(headers, self.frontend.token)
        if self.frontend.token is not None:
            with trio.move_on_after(self.limits.auth_timeout) as waited:
                await self.frontend.throttle.acquire(self.peer)
            if waited.cancelled_caught:
                await self._refuse(ErrorCode.UNAUTHENTICATED, "too many wrong tokens from this address")
            if refusal is None:
                self.frontend.throttle.refund(self.peer)
        if refusal is not None:
            await self._send(refusal, close=True)
            raise _Close("unauthenticated")
        length = dict(headers).get("content-length", "0")
        if length.isdigit() and int(length) > self.limits.max_frame_size:
            await self._refuse(ErrorCode.BAD_REQUEST, f"request body of {length} bytes is over the "
                               f"limit (server.max_frame_size {self.limits.max_frame_size})")
        body = await self._read_body()
        request = HttpRequest(event.method.decode("ascii").upper(),
                              event.target.decode("latin-1"), headers, body)
        with self.frontend.answering_one():
            await self._answer(request)

    async def _answer(self, request: HttpRequest) -> None:
        try:
            response = await answer(request, self.frontend.service)
        except Exception as exc:  # a bug costs this request (500), not the daemon
            log.exception("http %s %s from %s failed", request.method, request.target, self.peer)
            response = error_response(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        await self._send(response, close=self.frontend.service.host.draining,
                         head_only=request.method == "HEAD")

    async def _read_body(self) -> bytes:
        if self.h11.they_are_waiting_for_100_continue:
            await self.stream.send_all(self.h11.send(h11.InformationalResponse(status_code=100, headers=[])))
        deadline = trio.current_time() + self.limits.frame_timeout
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event(min(deadline, trio.current_time() + self.limits.idle_timeout))
            if event is None:
                await self._refuse(ErrorCode.BAD_REQUEST, f"request body not complete within "
                                   f"server.frame_timeout ({self.limits.frame_timeout:g} s)")
            if isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.limits.max_frame_size:
                    await self._refuse(ErrorCode.BAD_REQUEST, f"request body over the limit "
                                       f"(server.max_frame_size {self.limits.max_frame_size})")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.ConnectionClosed):
                raise _Close("peer closed during the body")

