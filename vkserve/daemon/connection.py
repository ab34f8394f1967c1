"""One client connection: read frames, run each request as a task, write answers.

Per connection (DESIGN §8):

- a reader decodes frames with the sans-I/O :class:`~client.framing.FrameDecoder` under an idle
  timeout; a header above the frame limit gets an id-0 error frame and the connection is closed;
  a payload that is not a msgpack map gets an id-0 ``BAD_REQUEST`` and reading goes on; a
  request that fails validation gets ``BAD_REQUEST`` with its own id when it had a valid one;
- a frame must be whole within ``frame_timeout`` of its first byte (the idle timer restarts
  with every byte, this one does not); one above :data:`UNBUDGETED_SIZE` first reserves its
  size from the daemon's shared ``max_buffered_bytes`` and is not read further until it has;
- a TCP peer authenticates within ``auth_timeout``, its wrong tokens throttled per address
  (``limits.AuthThrottle``); only then does it count in ``max_connections``;
- many requests are in flight at once: an infer request is a job submitted to the scheduler
  (``Backend.submit``) and answered from its end, with no task of its own (the scheduler ends
  it at its deadline); other requests, and infers of models with [preprocess] / [postprocess]
  or a client's batch, run as tasks of the connection's nursery; a ``cancel`` op ends the
  target's job or cancels its task, which then answers ``CANCELLED`` (after the op's own
  answer);
- frames to send queue in an outbox, written in order by one task at a time, which sends
  every frame queued meanwhile in one write (the answers of a batch: one syscall), so frames
  stay whole on the stream; a request's task leaves its answer to the task writing, if any
  (the answer counts against ``max_requests_per_connection`` until written); a peer that
  stops reading is dropped after ``send_timeout``;
- when the client goes away (EOF, reset) the nursery is cancelled and the submitted jobs
  ended, which cancels all its work;
- before authentication only an ``auth`` request is decoded; anything else is answered
  ``UNAUTHENTICATED`` by its id, fields unread, and the connection closes;
- a drain (the daemon shuts down) is the reader's state, never a cancellation of it: new
  requests get ``UNAVAILABLE`` while the ones in flight finish; then an id-0 ``UNAVAILABLE``
  goodbye, ``UNAVAILABLE`` for whatever still arrives within :data:`DRAIN_LINGER` (or until
  the peer's EOF), and the close. Every frame read is answered (vkserve.client.messages).

Nothing a client sends escapes :meth:`Connection.run`: a ``SchedulerError`` becomes an answer
with its code; anything else an ``INTERNAL`` answer and a log line; errors of the connection
itself close only it.
"""

from __future__ import annotations

import array
import collections
import functools
import hmac
import logging
import math
import os
import socket
import time
from typing import Any, Protocol

import trio

from vkserve.client.framing import HEADER_SIZE
from vkserve.client.meaning import meanings_to_wire
from vkserve.client.protocol import (
    CONNECTION_ERROR_ID,
    MAX_REQUEST_ID,
    AuthRequest,
    BadRequest,
    CancelRequest,
    ErrorCode,
    FrameDecoder,
    FrameTooLarge,
    InferRequest,
    ListModelsRequest,
    LoadModelRequest,
    MalformedFrame,
    PingRequest,
    Request,
    Response,
    ShmRegisterRequest,
    ShmSlot,
    ShmUnregisterRequest,
    StatusRequest,
    UnloadModelRequest,
    encode_frame,
    encode_infer_result,
    parse_request,
)
from vkserve.client.shm import MAX_REGIONS
from vkserve.daemon.backend import Backend, Wire, to_wire
from vkserve.daemon.config import Config
from vkserve.daemon.limits import AuthThrottle, BufferBudget, RateLimitedLog
from vkserve.daemon.shm import RegionError, Regions
from vkserve.devices.names import DeviceNameError, parse_device
from vkserve.devices.output_room import OutputRoom
from vkserve.scheduler import InferResult, Job, SchedulerError

log = logging.getLogger(__name__)

__all__ = ["Connection", "Host", "PREAUTH_MAX_FRAME_SIZE", "RequestFailed"]

RECV_SIZE = 256 * 1024
#: Shared memory per Unix-socket connection (vkserve.daemon.shm): regions, and their bytes.
SHM_MAX_REGIONS = MAX_REGIONS  # the client keeps to it (vkserve.client.shm)
SHM_MAX_BYTES = 1 << 30
#: File descriptors a connection may have sent ahead of the shm_register requests that take
#: them; more are closed on arrival (and those requests then fail).
MAX_PENDING_FDS = 4
#: Largest frame a TCP peer may send before it has authenticated.
PREAUTH_MAX_FRAME_SIZE = 64 * 1024
#: Frames up to this size (header included) are read without a reservation from the shared
#: ``server.max_buffered_bytes`` budget, in reads of at most this size; a larger frame reserves
#: its whole size once its header arrived, before any more of it is read. So a connection
#: holds at most this much outside the budget, and small requests flow while big frames wait.
UNBUDGETED_SIZE = PREAUTH_MAX_FRAME_SIZE + HEADER_SIZE
#: Drain: how long a connection with nothing left in flight, after its goodbye (an id-0
#: UNAVAILABLE frame), goes on reading and answering UNAVAILABLE before it closes (unless the
#: peer closes first): a request the peer sent before the goodbye reached it still gets an answer.
DRAIN_LINGER = 0.5
GOODBYE = "the daemon is shutting down: closing the connection (requests without an answer were not read)"
#: How late past a request's deadline a result may still be sent (the scheduler ends its jobs
#: at the deadline; a result later than this, after slow image work, is DEADLINE_EXCEEDED).
DEADLINE_GRACE = 0.25


class Host(Protocol):
    """What a connection needs of the daemon (``vkserve.daemon.server.Server``)."""

    config: Config
    backend: Backend
    token: str | None
    version: str
    draining: bool
    infer_in_flight: int
    requests_done: int

    buffers: BufferBudget
    auth_throttle: AuthThrottle
    warnings: RateLimitedLog

    def reject(self, reason: str) -> None: ...

    def promote(self, conn: Connection) -> str | None: ...

    def observe_infer(self, model: str, result: InferResult | None, outcome: str,
                      total: float) -> None: ...

    def server_status(self) -> dict[str, Wire]: ...


class RequestFailed(Exception):
    """Answer the request with this error code and message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Closing(Exception):
    """Internal: the reader stops and the connection closes (reason in the message)."""


def _request_id(msg: dict[str, Any]) -> int:
    """The map's request id when it is a valid one, else :data:`CONNECTION_ERROR_ID`."""
    rid = msg.get("id")
    return rid if type(rid) is int and 1 <= rid <= MAX_REQUEST_ID else CONNECTION_ERROR_ID


class Connection:
    def __init__(self, server: Host, stream: trio.abc.Stream, peer: str, *, needs_auth: bool,
                 address: str | None = None) -> None:
        self.server = server
        self.cfg = server.config.server
        self.stream = stream
        self.peer = peer
        #: The source the per-address budgets count (``limits.address_key``); None on Unix.
        self.address = address
        self.needs_auth = needs_auth
        self.authenticated = not needs_auth
        self.decoder = FrameDecoder(
            min(PREAUTH_MAX_FRAME_SIZE, self.cfg.max_frame_size) if needs_auth else self.cfg.max_frame_size
        )
        #: frames waiting to be written, in order; a task writing them holds ``_writing``
        self._outbox: list[bytes | memoryview] = []
        self._writing = False
        self._queued = 0  # frames ever queued
        self._written = 0  # of those, frames written
        self._wrote = trio.Event()  # set (and replaced) after every write
        #: request id -> the cancel scope of its task (requests in flight on this connection)
        self.tasks: dict[int, trio.CancelScope] = {}
        #: request id -> its job, for infer requests submitted to the scheduler with no task
        #: of their own, answered from the job's end (`_job_done`)
        self.jobs: dict[int, Job] = {}
        #: request id -> why the connection cancelled that job ("client" or "abort")
        self._cancelled: dict[int, str] = {}
        self._answers = trio.Event()  # set when `_post` queued an answer
        self.infer_in_flight = 0
        #: request id -> the scheduler's InferResult (device, queue and run seconds), kept
        #: from the answer until the request's metrics are recorded
        self._results: dict[int, InferResult] = {}
        self.opened_at = trio.current_time()
        self._reader_scope = trio.CancelScope()
        self._broken = False
        self._aborting = False  # the daemon's drain timed out: cancelled = UNAVAILABLE
        #: Bytes reserved from ``server.buffers`` for the frame being received.
        self._reserved = 0
        #: When the frame being received must be complete (``server.frame_timeout``).
        self._frame_deadline = math.inf
        #: Why the daemon closes this unauthenticated connection to make room for a newer one.
        self._evicted: str | None = None
        #: Drain: set once this connection, idle, said goodbye; it reads on until then.
        self._closing_until: float | None = None
        self._recv_scope: trio.CancelScope | None = None  # the reader's wait for bytes
        self._woken = False  # that wait was interrupted by _wake_reader (not a timer)
        # Unix sockets: descriptors sent with frames (SCM_RIGHTS) wait here for the
        # shm_register requests that take them, in order; the regions they became.
        sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._sock = sock  # reads go to the socket itself (``_receive_from_socket``)
        self._fd = sock.fileno() if sock is not None else None  # for ``_send_now``
        self._unix = sock if sock is not None and sock.family == socket.AF_UNIX else None
        self._fds: collections.deque[int] = collections.deque()
        self.regions = Regions(SHM_MAX_REGIONS, SHM_MAX_BYTES) if self._unix is not None else None
        #: the socket's descriptor as a plain socket, for reads without trio's speculative try
        #: (``_receive_from_socket``); made and detached (never closed) by ``run``
        self._raw: socket.socket | None = None
        self._drained = False  # the last read took less than it asked for: the socket was empty

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Serve the connection until the peer leaves, breaks framing or the daemon drains."""
        reason = "closed"
        if self._sock is not None:
            self._raw = socket.socket(fileno=self._sock.fileno())
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_answers)
                try:
                    reason = await self._read_loop(nursery)
                finally:
                    # Whatever ended the reader, the client is gone or being dropped:
                    # its requests in flight are cancelled (their jobs with them).
                    nursery.cancel_scope.cancel()
                    self._broken = True  # nothing more is written
                    for rid, job in list(self.jobs.items()):
                        self._cancelled[rid] = "client"
                        self.server.backend.cancel(job, "the client went away")
        except Exception as exc:  # a bug here must cost this connection only
            reason = f"internal error: {type(exc).__name__}: {exc}"
            log.exception("connection %s failed", self.peer)
        finally:
            if self._raw is not None:
                self._raw.detach()  # the descriptor is trio's socket's, which closes it
                self._raw = None
            self.server.buffers.release(self._reserved)
            self._reserved = 0
            while self._fds:
                os.close(self._fds.popleft())
            if self.regions is not None:
                self.regions.close()
            log.debug("connection %s: %s", self.peer, reason)

    def evict(self, why: str) -> None:
        """Close this unauthenticated connection (answered UNAVAILABLE): a newer one needs
        its place in the unauthenticated budget."""
        self._evicted = why
        self._reader_scope.cancel()

    def abort_in_flight(self) -> None:
        """The drain timed out: cancel every request in flight; each answers UNAVAILABLE."""
        self._aborting = True
        for scope in list(self.tasks.values()):
            scope.cancel()
        for rid, job in list(self.jobs.items()):
            self._cancelled[rid] = "abort"
            self.server.backend.cancel(job, "the daemon is shutting down")

    def begin_drain(self) -> None:
        """The daemon is shutting down. The drain is the reader's: requests it reads get
        UNAVAILABLE while those in flight finish; once none is in flight it sends the goodbye,
        answers what still arrives for :data:`DRAIN_LINGER` (or until the peer's EOF), closes.
        Only the reader's wait for bytes is ever interrupted, so no frame read goes unanswered."""
        self._wake_reader()

    def _wake_reader(self) -> None:
        """Make the reader look at the drain state now, if it is waiting for bytes (a cancelled
        ``receive_some`` has read nothing)."""
        if self._recv_scope is not None:
            self._woken = True
            self._recv_scope.cancel()

    async def _say_goodbye(self) -> None:
        self._closing_until = trio.current_time() + DRAIN_LINGER
        await self._send_connection_error(ErrorCode.UNAVAILABLE, GOODBYE)

    # ------------------------------------------------------------------ reading

    async def _receive(self, max_bytes: int) -> bytes | None:
        """Next chunk, ``b""`` at EOF, ``None`` when the idle, auth or frame timer ran out."""
        deadline = min(trio.current_time() + self.cfg.idle_timeout, self._frame_deadline)
        if not self.authenticated:
            deadline = min(deadline, self.opened_at + self.cfg.auth_timeout)
        if self._closing_until is not None:
            deadline = min(deadline, self._closing_until)
        self._woken = False
        with trio.move_on_at(deadline) as self._recv_scope:
            try:
                if self._sock is not None:
                    return await self._receive_from_socket(self._sock, max_bytes)
                return await self.stream.receive_some(max_bytes)
            finally:
                self._recv_scope = None
        return None

    async def _receive_from_socket(self, sock: trio.socket.SocketType, max_bytes: int) -> bytes:
        """``receive_some`` on the socket itself, keeping the descriptors a Unix peer sent
        (SCM_RIGHTS). A socket error is the stream's BrokenResourceError, as trio's
        SocketStream makes it (a peer's reset is no bug of this connection).

        trio's ``recvmsg`` tries the call at once, waits for the socket only when it finds
        nothing, and checkpoints after a read. After a read that emptied the socket (a client
        waiting for its answers, as under most loads) the try is a wasted system call and the
        checkpoint a wasted loop round, so then this waits first and reads once. Measured on an
        H200 over a Unix socket, mobilenet with 32 in flight: 1.05-1.26x the requests a second
        of trio's path in three alternating pairs (the loop 179-261 us a request against
        228-329)."""
        size = socket.CMSG_SPACE(4 * MAX_PENDING_FDS) if self._unix is not None else 0
        try:
            if self._drained and self._raw is not None:
                await trio.lowlevel.wait_readable(sock)
                try:
                    data, ancdata, _, _ = self._raw.recvmsg(max_bytes, size)
                except BlockingIOError:  # readable, and yet nothing (another reader can't exist)
                    data, ancdata, _, _ = await sock.recvmsg(max_bytes, size)
            else:
                data, ancdata, _, _ = await sock.recvmsg(max_bytes, size)
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket error: {exc}") from exc
        self._drained = len(data) < max_bytes
        for level, kind, payload in ancdata:
            if level != socket.SOL_SOCKET or kind != socket.SCM_RIGHTS:
                continue
            fds = array.array("i")
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
            for fd in fds:
                if len(self._fds) < MAX_PENDING_FDS:
                    self._fds.append(fd)
                else:
                    os.close(fd)
        return data

    def _receive_size(self) -> int:
        """The next read's size: the rest of a frame whose size is reserved (never beyond it),
        else :data:`UNBUDGETED_SIZE`."""
        size = self.decoder.frame_size
        if self._reserved and size is not None:
            return max(1, min(RECV_SIZE, size - self.decoder.buffered))
        return UNBUDGETED_SIZE

    async def _read_loop(self, nursery: trio.Nursery) -> str:
        with self._reader_scope:
            while True:
                if self._closing_until is None and self.server.draining and not self.busy:
                    await self._say_goodbye()  # drained: nothing in flight, no frame pending
                    if self._broken:
                        return "send failed"
                try:
                    data = await self._receive(self._receive_size())
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    return f"connection lost: {exc!r}"
                if data is None:
                    if self._woken:
                        continue  # begin_drain / the last answer of a drain: look again
                    if self._closing_until is not None and trio.current_time() >= self._closing_until:
                        return "daemon shutting down"
                    if self.decoder.buffered and trio.current_time() >= self._frame_deadline:
                        self.server.reject("frame_timeout")
                        size = self.decoder.frame_size
                        await self._send_connection_error(
                            ErrorCode.BAD_REQUEST,
                            f"incomplete frame ({self.decoder.buffered} of "
                            f"{size if size is not None else '?'} bytes) not complete within "
                            f"server.frame_timeout ({self.cfg.frame_timeout:g} s)",
                        )
                        return "frame timeout"
                    if not self.authenticated:
                        self.server.reject("unauthenticated")
                        await self._send_connection_error(ErrorCode.UNAUTHENTICATED, "authentication timed out")
                        return "authentication timed out"
                    if self.busy and not self.decoder.buffered:
                        continue  # the client is waiting for answers, not idle
                    if self.decoder.buffered:
                        await self._send_connection_error(
                            ErrorCode.BAD_REQUEST,
                            f"incomplete frame ({self.decoder.buffered} bytes) timed out",
                        )
                    return "idle timeout"
                if not data:
                    if self.decoder.buffered:
                        return f"client closed mid-frame ({self.decoder.buffered} bytes)"
                    return "client closed the connection"
                arrived = trio.current_time()
                frames = self.decoder.frames
                try:
                    self.decoder.feed(data)
                    await self._drain_decoder(nursery)
                except FrameTooLarge as exc:
                    self.server.reject("frame_too_large")
                    await self._send_connection_error(ErrorCode.BAD_REQUEST, str(exc))
                    return f"frame too large: {exc}"
                except _Closing as exc:
                    return str(exc)
                if self._broken:
                    return "send failed"
                if not self.decoder.buffered:
                    self._frame_deadline = math.inf
                elif self.decoder.frames != frames or self._frame_deadline == math.inf:
                    self._frame_deadline = arrived + self.cfg.frame_timeout  # a new frame began
                try:
                    await self._reserve_frame()
                except _Closing as exc:
                    return str(exc)
        if self._evicted is not None:
            with trio.move_on_after(1.0):
                await self._send_connection_error(ErrorCode.UNAVAILABLE, self._evicted)
            return f"closed: {self._evicted}"
        return "daemon shutting down"

    async def _reserve_frame(self) -> None:
        """Hold a reservation of the shared ``server.max_buffered_bytes`` for the frame being
        received when it is larger than :data:`UNBUDGETED_SIZE`, and none otherwise. While the
        budget is spent this waits, reading nothing (the sender blocks: TCP backpressure), up
        to the frame's own deadline (``server.frame_timeout`` counts from its first byte)."""
        budget = self.server.buffers
        size = self.decoder.frame_size
        need = 0  # the payload's bytes, for a frame above UNBUDGETED_SIZE
        if size is not None and size > UNBUDGETED_SIZE:
            need = min(size - HEADER_SIZE, budget.capacity)
        if need <= self._reserved:
            budget.release(self._reserved - need)
            self._reserved = need
            return
        while True:
            self._woken = False
            closing = self._closing_until if self._closing_until is not None else math.inf
            with trio.move_on_at(min(self._frame_deadline, closing)) as self._recv_scope:
                try:
                    await budget.acquire(need - self._reserved)
                    self._reserved = need
                    return
                finally:
                    self._recv_scope = None
            if trio.current_time() >= closing:
                raise _Closing("daemon shutting down")
            if not self._woken:
                break  # the frame's deadline
            if self.server.draining and not self.busy:  # drained: this frame stays unread
                if self._closing_until is None:
                    await self._say_goodbye()
                raise _Closing("daemon shutting down")
        self.server.reject("frame_timeout")
        await self._send_connection_error(
            ErrorCode.BAD_REQUEST,
            f"incomplete frame ({self.decoder.buffered} of {size} bytes) not complete within "
            f"server.frame_timeout ({self.cfg.frame_timeout:g} s): it waited for buffer space "
            f"(server.max_buffered_bytes, {budget.capacity} bytes, in use by other connections)")
        raise _Closing("frame timeout (waiting for buffer space)")

    async def _drain_decoder(self, nursery: trio.Nursery) -> None:
        while True:
            try:
                msg = self.decoder.next_message()
            except MalformedFrame as exc:
                self.server.reject("bad_request")
                await self._send_response(Response.failure(CONNECTION_ERROR_ID, ErrorCode.BAD_REQUEST, str(exc)))
                continue
            if msg is None:
                return
            await self._handle_message(msg, nursery)

    async def _handle_message(self, msg: dict[str, Any], nursery: trio.Nursery) -> None:
        received_at = time.time()
        if not self.authenticated and msg.get("op") != "auth":
            # Before authentication only the auth request is decoded: anything else is refused
            # by its id with its fields unread (no tensor decoded) and the connection closes.
            self.server.reject("unauthenticated")
            await self._send_response(Response.failure(
                _request_id(msg), ErrorCode.UNAUTHENTICATED, "authenticate first (op 'auth' with the token)"))
            raise _Closing("request before authentication")
        try:
            request = parse_request(msg, self.regions)
        except BadRequest as exc:
            self.server.reject("bad_request")
            rid = exc.request_id if exc.request_id is not None else CONNECTION_ERROR_ID
            await self._send_response(Response.failure(rid, ErrorCode.BAD_REQUEST, str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 (a validation bug: this request fails, the connection goes on)
            # (rate-limited, no traceback: a peer repeating the frame must not flood the log)
            self.server.warnings.warning("validation errors", "connection %s: validating a request "
                                         "failed: %s: %s", self.peer, type(exc).__name__, exc)
            await self._send_response(Response.failure(
                _request_id(msg), ErrorCode.INTERNAL,
                f"internal error validating the request: {type(exc).__name__}: {exc}"))
            return
        if isinstance(request, AuthRequest):
            await self._authenticate(request)
            return
        if request.id in self.tasks or request.id in self.jobs:
            # Not run. The refusal is written before the original's answer: that answer takes
            # its place on the send lock only once its id has left ``tasks``.
            self.server.reject("bad_request")
            await self._send_response(
                Response.failure(request.id, ErrorCode.BAD_REQUEST, f"request id {request.id} is already in flight")
            )
            return
        if isinstance(request, (ShmRegisterRequest, ShmUnregisterRequest)):
            # in order with the reading: the next request may use the region already
            await self._send_response(self._shm_request(request))
            return
        if isinstance(request, CancelRequest):
            scope = self.tasks.get(request.target)
            job = self.jobs.get(request.target)
            # the acknowledgement is queued ahead of the target's (cancelled) answer
            self._post(encode_frame(Response.success(request.id, {"cancelled": scope is not None or job is not None})
                                    .to_message(), self.cfg.max_frame_size))
            if scope is not None:
                scope.cancel()
            if job is not None:
                self._cancelled[request.target] = "client"
                self.server.backend.cancel(job, "the caller cancelled the job")
            return
        if self._closing_until is not None or (
            self.server.draining and not isinstance(request, (PingRequest, StatusRequest))
        ):
            self.server.reject("shutting_down")
            await self._send_response(
                Response.failure(request.id, ErrorCode.UNAVAILABLE, "the daemon is shutting down")
            )
            return
        in_flight = self.requests_in_flight + self._queued - self._written  # answers unsent count too
        if in_flight >= self.cfg.max_requests_per_connection:
            self.server.reject("overloaded")
            await self._send_response(
                Response.failure(
                    request.id, ErrorCode.OVERLOADED,
                    f"{in_flight} requests in flight on this connection (limit "
                    f"{self.cfg.max_requests_per_connection})",
                )
            )
            return
        if isinstance(request, InferRequest) and self._submit(request, received_at):
            return
        scope = trio.CancelScope()
        self.tasks[request.id] = scope
        nursery.start_soon(self._run_request, request, received_at, scope)

    @property
    def requests_in_flight(self) -> int:
        return len(self.tasks) + len(self.jobs)

    @property
    def busy(self) -> bool:
        """Requests in flight (not counting answers not yet written)."""
        return bool(self.tasks or self.jobs)

    # ------------------------------------------------------------------ jobs without a task

    def _submit(self, request: InferRequest, received_at: float) -> bool:
        """Submit an infer request as a job answered from its end, with no task, cancel scope
        or event of its own (the scheduler ends it at its deadline); False where the scheduler
        wants the awaiting path (an image to convert, a segmentation mask, a client's batch), nothing
        admitted then."""
        self.infer_in_flight += 1
        self.server.infer_in_flight += 1
        try:
            job = self.server.backend.submit(request.model, dict(request.inputs), priority=request.priority,
                                             deadline=request.effective_deadline(received_at),
                                             outputs=request.outputs, room=self._room(request),
                                             on_done=functools.partial(self._job_done, request, received_at))
        except SchedulerError as exc:
            self._infer_ended(request, received_at, None, exc.code.value.lower())
            self._post(encode_frame(Response.failure(request.id, exc.code, exc.message).to_message(),
                                    self.cfg.max_frame_size))
            return True
        except Exception as exc:  # noqa: BLE001 (a bug: this request fails, the connection goes on)
            log.exception("request %s infer from %s failed", request.id, self.peer)
            self._infer_ended(request, received_at, None, ErrorCode.INTERNAL.value.lower())
            self._post(encode_frame(Response.failure(
                request.id, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}").to_message(),
                self.cfg.max_frame_size))
            return True
        if job is None:
            self.infer_in_flight -= 1
            self.server.infer_in_flight -= 1
            return False
        self.jobs[request.id] = job
        return True

    def _job_done(self, request: InferRequest, received_at: float, job: Job) -> None:
        """A submitted job ended (in the loop): its answer, as the awaiting path gives it."""
        self.jobs.pop(request.id, None)
        why = self._cancelled.pop(request.id, None)
        frame: bytes | None = None
        outcome = "ok"
        if job.error is not None:
            error = job.error
            code, message = error.code, error.message
            if why == "abort":
                code, message = ErrorCode.UNAVAILABLE, "the daemon is shutting down (drain timeout): the request was cancelled"
            elif why == "client":
                code, message = ErrorCode.CANCELLED, "cancelled by the client"
            outcome = code.value.lower()
            response = Response.failure(request.id, code, message)
        else:
            assert job.result is not None
            try:
                answer = self._infer_answer(request, job.result, job.room)
                frame = encode_frame(Response.success(request.id, answer).to_message(), self.cfg.max_frame_size)
            except FrameTooLarge as exc:
                response = Response.failure(request.id, ErrorCode.INTERNAL, f"answer too large to send: {exc}")
                outcome = ErrorCode.INTERNAL.value.lower()
            except Exception as exc:  # noqa: BLE001 (this answer fails; the connection goes on)
                log.exception("request %s infer from %s failed", request.id, self.peer)
                response = Response.failure(request.id, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
                outcome = ErrorCode.INTERNAL.value.lower()
        self._infer_ended(request, received_at, job.result, outcome)
        if frame is None:
            frame = encode_frame(response.to_message(), self.cfg.max_frame_size)
        self._post(frame)
        if self.server.draining and not self.busy:
            self._wake_reader()

    def _infer_ended(self, request: InferRequest, received_at: float, result: InferResult | None,
                     outcome: str) -> None:
        """An infer request's end, counted (both paths)."""
        self.infer_in_flight -= 1
        self.server.infer_in_flight -= 1
        self.server.observe_infer(request.model, result, outcome, time.time() - received_at)
        self.server.requests_done += 1

    def _post(self, frame: bytes) -> None:
        """An answer from outside a task: written at once when it is the connection's last in
        flight and nothing waits to be written; else queued for the task writing now, or the
        connection's answer writer (`_write_answers`), with the other answers ending in this
        loop round, in one write."""
        if self._broken:
            return
        self._queued += 1
        if not self._outbox and not self._writing and not self.busy:
            # the connection's last answer in flight: nothing would join it, so it goes out
            # now rather than in the writer's next round (the rest there, if the socket is full)
            try:
                sent = self._send_now(frame)
            except OSError as exc:
                self._mark_broken(f"send failed: {exc!r}")
                return
            if sent == len(frame):
                self._written += 1
                return
            self._outbox.append(memoryview(frame)[sent:])
        else:
            self._outbox.append(frame)
        self._answers.set()

    async def _write_answers(self) -> None:
        """The connection's writer of `_post`'s answers (a task of its nursery)."""
        while True:
            await self._answers.wait()
            self._answers = trio.Event()
            if self._outbox and not self._writing and not self._broken:
                await self._write_outbox()

    def _shm_request(self, request: ShmRegisterRequest | ShmUnregisterRequest) -> Response:
        if self.regions is None:
            self.server.reject("bad_request")
            return Response.failure(request.id, ErrorCode.BAD_REQUEST,
                                    "shared memory needs a Unix-socket connection (descriptors "
                                    "cannot travel over TCP); send tensors inline")
        if isinstance(request, ShmUnregisterRequest):
            return Response.success(request.id, {"unregistered": self.regions.unregister(request.name)})
        if not self._fds:
            self.server.reject("bad_request")
            return Response.failure(request.id, ErrorCode.BAD_REQUEST,
                                    "no file descriptor came with the request (send the memfd "
                                    "with the frame as SCM_RIGHTS)")
        try:
            self.regions.register(request.name, self._fds.popleft(), request.size)
        except (RegionError, OSError) as exc:
            self.server.reject("bad_request")
            return Response.failure(request.id, ErrorCode.BAD_REQUEST, f"shm_register: {exc}")
        return Response.success(request.id, {"registered": request.name, "size": request.size})

    async def _authenticate(self, request: AuthRequest) -> None:
        token = self.server.token
        if not self.needs_auth:
            await self._send_response(Response.success(request.id, {"authenticated": True}))
            return
        assert token is not None
        key = self.address or self.peer
        first = not self.authenticated
        if first:
            # Attempts from one address are throttled (only wrong tokens spend the bucket);
            # the wait counts against auth_timeout.
            with trio.move_on_at(self.opened_at + self.cfg.auth_timeout) as waited:
                await self.server.auth_throttle.acquire(key)
            if waited.cancelled_caught:
                self.server.reject("unauthenticated")
                await self._send_response(Response.failure(
                    request.id, ErrorCode.UNAUTHENTICATED,
                    "authentication timed out (too many wrong tokens from this address)"))
                raise _Closing("authentication timed out")
        if hmac.compare_digest(request.token.encode("utf-8"), token.encode("utf-8")):
            if first:
                self.server.auth_throttle.refund(key)
                refused = self.server.promote(self)  # into the max_connections budget
                if refused is not None:
                    self.server.reject("too_many_connections")
                    await self._send_response(Response.failure(request.id, ErrorCode.UNAVAILABLE, refused))
                    raise _Closing(refused)
            self.authenticated = True
            self.decoder.max_frame_size = self.cfg.max_frame_size
            await self._send_response(Response.success(request.id, {"authenticated": True}))
            return
        self.server.warnings.warning("wrong tokens", "connection %s: wrong token", self.peer)
        self.server.reject("unauthenticated")
        await self._send_response(Response.failure(request.id, ErrorCode.UNAUTHENTICATED, "wrong token"))
        raise _Closing("wrong token")

    # ------------------------------------------------------------------ requests

    async def _run_request(self, request: Request, received_at: float, scope: trio.CancelScope) -> None:
        try:
            await self._answer_request(request, received_at, scope)
        finally:
            self.tasks.pop(request.id, None)
        if self.server.draining and not self.busy:
            self._wake_reader()  # its answer is queued: the drained connection says goodbye (after it)

    async def _answer_request(self, request: Request, received_at: float,
                              scope: trio.CancelScope) -> None:
        is_infer = isinstance(request, InferRequest)
        if is_infer:
            self.infer_in_flight += 1
            self.server.infer_in_flight += 1
        response: Response | None = None
        frame: bytes | None = None
        outcome = ErrorCode.CANCELLED.value  # unless it ends otherwise (teardown cancels)
        try:
            with scope:
                try:
                    result = await self._execute(request, received_at)
                    frame = encode_frame(Response.success(request.id, result).to_message(), self.cfg.max_frame_size)
                    outcome = "ok"
                except RequestFailed as exc:
                    response = Response.failure(request.id, exc.code, exc.message)
                except SchedulerError as exc:  # the code travels in the frame's code, once
                    response = Response.failure(request.id, exc.code, exc.message)
                except FrameTooLarge as exc:
                    response = Response.failure(request.id, ErrorCode.INTERNAL, f"answer too large to send: {exc}")
                except Exception as exc:
                    log.exception("request %s %s from %s failed", request.id, request.op, self.peer)
                    response = Response.failure(
                        request.id, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
                    )
            if scope.cancelled_caught:
                frame = None
                if self._aborting:
                    response = Response.failure(
                        request.id, ErrorCode.UNAVAILABLE,
                        "the daemon is shutting down (drain timeout): the request was cancelled")
                else:
                    response = Response.failure(request.id, ErrorCode.CANCELLED, "cancelled by the client")
            if response is not None and response.error is not None:
                outcome = str(response.error.code)
        finally:
            if is_infer:
                assert isinstance(request, InferRequest)
                self._infer_ended(request, received_at, self._results.pop(request.id, None), outcome.lower())
            else:
                self.server.requests_done += 1
        if frame is None:
            assert response is not None
            frame = encode_frame(response.to_message(), self.cfg.max_frame_size)
        # No longer in flight from here: with no checkpoint in between, the answer takes its
        # place in the outbox, behind any refusal of a duplicate of its id (sent while the id
        # was in flight) and ahead of the drain's goodbye.
        self.tasks.pop(request.id, None)
        await self._send_frame(frame, wait=False)

    async def _execute(self, request: Request, received_at: float) -> dict[str, Wire]:
        backend = self.server.backend
        if isinstance(request, InferRequest):
            return await self._infer(request, received_at)
        if isinstance(request, PingRequest):
            return {"pong": True, "time": time.time(), "version": self.server.version}
        if isinstance(request, StatusRequest):
            return {**to_wire(backend.status()), "server": self.server.server_status()}
        if isinstance(request, ListModelsRequest):
            return {"models": [to_wire(m) for m in backend.models()]}
        if isinstance(request, LoadModelRequest):
            devices = None if request.devices is None else self._device_indices(request.devices)
            return to_wire(await backend.load_model(request.name, devices))
        if isinstance(request, UnloadModelRequest):
            return to_wire(await backend.unload_model(request.name))
        raise RequestFailed(ErrorCode.BAD_REQUEST, f"op {request.op!r} is not served")

    def _device_indices(self, names: list[str]) -> list[int]:
        """Wire device names (``cpu``, ``vulkan:N``, ``N``: devices.names) as the scheduler's
        device indices (a Vulkan device's is its Vulkan index)."""
        cpu = [d.index for d in self.server.backend.status().devices if d.kind == "cpu"]
        out: list[int] = []
        for text in names:
            try:
                name = parse_device(text)
            except DeviceNameError as exc:
                raise RequestFailed(ErrorCode.BAD_REQUEST, f"field 'devices': {exc}") from None
            if not name.is_cpu:
                out.append(name.index)
            elif cpu:
                out.append(cpu[0])
            else:
                raise RequestFailed(ErrorCode.BAD_REQUEST, "field 'devices': the daemon has no CPU device")
        return out

    async def _infer(self, request: InferRequest, received_at: float) -> dict[str, Wire]:
        deadline = request.effective_deadline(received_at)
        # The scheduler ends the job at its deadline (DEADLINE_EXCEEDED); what it awaits besides
        # the job is image work in threads, which a cancel scope here could not interrupt
        # either, so no scope of its own: a result that still comes late is not sent.
        room = self._room(request)
        result = await self.server.backend.infer(request.model, dict(request.inputs),
                                                 priority=request.priority, deadline=deadline,
                                                 outputs=request.outputs, room=room)
        if deadline is not None and time.time() > deadline + DEADLINE_GRACE:
            raise RequestFailed(ErrorCode.DEADLINE_EXCEEDED,
                                "no result by the request's deadline (it came "
                                f"{time.time() - deadline:.3f} s late)")
        self._results[request.id] = result
        return self._infer_answer(request, result, room)

    def _room(self, request: InferRequest) -> OutputRoom | None:
        """The room the request gives its outputs in its shared memory, if any."""
        if request.outputs_shm is None or self.regions is None:
            return None
        return self.regions.room(request.outputs_shm, request.outputs)

    def _infer_answer(self, request: InferRequest, result: InferResult,
                      room: OutputRoom | None) -> dict[str, Wire]:
        """An infer request's answer: its outputs inline, or in its room where they fit (the
        engine wrote those it could there; the others are copied in now)."""
        placed: dict[str, ShmSlot] = {}
        if room is not None:
            slot = request.outputs_shm
            assert slot is not None
            placed = {name: ShmSlot(slot.region, slot.offset + p.offset, p.nbytes)
                      for name, p in room.complete(result.outputs).items()}
        stages: dict[str, float] = {}
        if result.stages is not None:  # the execution's split (a batch's: all its jobs')
            stages = {"copy_in_seconds": result.stages.copy_in, "device_seconds": result.stages.run,
                      "copy_out_seconds": result.stages.copy_out}
        # the model's [postprocess], one entry per item (vkserve.client.meaning)
        meanings = {"postprocess": meanings_to_wire(result.meanings)} if result.meanings else {}
        return encode_infer_result(result.outputs, placed=placed, device=result.device,
                                   queue_seconds=result.queue_seconds, run_seconds=result.run_seconds,
                                   batch_size=result.batch_size, **stages, **meanings)

    # ------------------------------------------------------------------ writing

    async def _send_response(self, response: Response) -> None:
        await self._send_frame(encode_frame(response.to_message(), self.cfg.max_frame_size))

    async def _send_connection_error(self, code: ErrorCode, message: str) -> None:
        await self._send_response(Response.failure(CONNECTION_ERROR_ID, code, message))

    async def _send_frame(self, frame: bytes, *, wait: bool = True) -> None:
        """Write one whole frame (queued in order; returns once it is written), or mark the
        connection broken and stop its reader. The frame is queued before the first
        checkpoint, so frames go out in the order this is called.

        ``wait=False`` (a request's answer): while another task is writing, return at once;
        that task writes this frame too, and it counts as in flight until then (``_queued`` -
        ``_written``).
        Waiting cost every answer of a batch but the writer's one or more wake-ups."""
        if self._broken:
            return
        self._outbox.append(frame)
        self._queued += 1
        mine = self._queued
        if not wait and self._writing:
            return
        while self._written < mine and not self._broken:
            if self._writing:  # the writing task takes this frame in its next write
                await self._wrote.wait()
            else:
                await self._write_outbox()

    async def _write_outbox(self) -> None:
        """Write everything queued: what is queued in one write, then what queued while a
        write waited for the socket. The writer task runs a round after an answer's ``_post``,
        so the answers of every run that ended by then (a batch's) share a write; waiting one
        round more for further answers, as this once did while requests were in flight, cost
        mobilenet at 32 in flight on an H200 ~10 % of its requests a second (3,242 against
        3,609 req/s, two pairs alternating)."""
        self._writing = True
        try:
            while self._outbox and not self._broken:
                frames, self._outbox = self._outbox, []
                data = frames[0] if len(frames) == 1 else b"".join(frames)
                try:
                    sent = self._send_now(data)
                except OSError as exc:
                    self._mark_broken(f"send failed: {exc!r}")
                    return
                if sent < len(data) and not await self._send_rest(memoryview(data)[sent:]):
                    return
                self._written += len(frames)
                self._wrote.set()
                self._wrote = trio.Event()
        finally:
            self._writing = False
            self._wrote.set()  # waiters look again: written, broken, or one of them writes next
            self._wrote = trio.Event()

    async def _send_rest(self, data: memoryview) -> bool:
        """What the socket did not take at once, under ``send_timeout``; False (the connection
        marked broken) when it failed or timed out. Only the connection's own teardown can
        cancel it (answers are sent outside their request's cancel scope); frames torn that
        way mark the stream unusable too."""
        completed = False
        try:
            with trio.move_on_after(self.cfg.send_timeout) as timer:
                await self.stream.send_all(data)
                completed = True
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._mark_broken(f"send failed: {exc!r}")
            return False
        finally:
            if not completed and not self._broken:
                self._broken = True
        if timer.cancelled_caught:
            self._mark_broken(f"client did not read for {self.cfg.send_timeout} s")
            return False
        return True

    def _send_now(self, data: bytes | memoryview) -> int:
        """Bytes of ``data`` the socket took at once (0 when its buffer is full), written
        without a schedule point: an answer usually fits the socket's buffer, and trio's
        ``send_all`` costs the loop a round per answer even then (a sequential client's
        request took 5 rounds with it, 4 without). The rest goes through ``send_all``.
        Raises OSError when the peer is gone."""
        if self._fd is None:
            return 0
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0

    def _mark_broken(self, reason: str) -> None:
        log.info("connection %s: %s; closing it", self.peer, reason)
        self._broken = True
        self._reader_scope.cancel()

