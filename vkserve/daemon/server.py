"""The daemon process: listeners, connections, scheduler, signals, shutdown.

Start: bind the sockets (a live socket is an error before anything slow happens), discover
devices, start the scheduler (models load and warm up), accept connections, print where it
listens, notify systemd. SIGINT/SIGTERM: stop accepting (the socket file goes away), let the
requests in flight finish for up to ``server.drain_timeout`` (new ones get ``UNAVAILABLE``),
cancel what is left, close the scheduler (which saves the pipeline caches), exit 0. A second
signal skips the drain. SIGHUP rescans the model repository (new folders load, removed ones
unload, changed ones reload: the new version loads beside the serving one and takes over once
ready, a broken one is reported and not swapped in; other models keep serving).

Operations (DESIGN §9): Prometheus metrics, ``/healthz`` and ``/readyz`` on their own HTTP
listener (``metrics.listen``) in the root nursery; systemd ``Type=notify`` (READY, STATUS
lines with devices and models, WATCHDOG pings from the trio loop, STOPPING) and socket
activation (``LISTEN_FDS``: the inherited sockets replace the ones the config names).

The Open Inference Protocol (KServe v2, ``vkserve.daemon.kserve``) over HTTP (``http.listen``)
and gRPC (``grpc.listen``) shares the scheduler: both are bound at start with the other
sockets, serve once the scheduler runs, and drain with the daemon.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from vkserve.client.protocol import CONNECTION_ERROR_ID, ErrorCode, Response, encode_frame
from vkserve.daemon import systemd
from vkserve.daemon.backend import Backend, Wire
from vkserve.daemon.config import Config, ConfigError, is_loopback, resolve_token, scheduler_config
from vkserve.daemon.connection import Connection
from vkserve.daemon.kserve.service import KServeService
from vkserve.daemon.limits import AuthThrottle, BufferBudget, RateLimitedLog, address_key
from vkserve.daemon.listeners import (
    ListenError,
    UnixSocket,
    bind_unix_socket,
    open_tcp_listeners,
    tcp_listen_address,
)
from vkserve.daemon.metrics import DaemonMetrics, LoadRecorder
from vkserve.devices.cpu import threads as cpu_threads
from vkserve.devices.discovery import GpuProblem
from vkserve.scheduler import (
    DeviceHandle,
    InferResult,
    ModelInfo,
    ModelRepository,
    ModelState,
    Scheduler,
    SchedulerConfig,
    discover_handles,
    vulkan_engine_available,
)

if TYPE_CHECKING:
    import grpc

    from vkserve.daemon.kserve.grpc_server import GrpcFrontend
    from vkserve.daemon.kserve.http_server import HttpFrontend

log = logging.getLogger(__name__)

__all__ = ["Server", "run_daemon", "serve"]

#: An accept loop's handler: serves one accepted stream.
Handler = Callable[[trio.SocketStream], Awaitable[None]]


def vkserve_version() -> str:
    try:
        return metadata.version("vkserve")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class Server:
    """Connections and their bookkeeping; the accept loops hand streams to :meth:`handle_unix`
    and :meth:`handle_tcp`."""

    def __init__(self, config: Config, backend: Backend, token: str | None) -> None:
        self.config = config
        self.backend = backend
        self.token = token
        self.version = vkserve_version()
        self.connections: set[Connection] = set()
        self.draining = False
        self.infer_in_flight = 0
        self.requests_done = 0
        self.connections_total = 0
        self.started_at = time.time()
        self.listening: list[str] = []
        self.repository: Path | None = None
        self._all_closed = trio.Event()
        self.metrics = DaemonMetrics(backend.status, backend.models)
        self._loads = LoadRecorder(self.metrics)
        self._device_labels: dict[int, str] = {}
        self.ready_announced = False
        s = config.server
        #: Connections in the ``max_connections`` budget: Unix ones, authenticated TCP ones.
        self._admitted: set[Connection] = set()
        #: TCP connections not authenticated yet (their own budget), oldest first -> address.
        self._preauth: dict[Connection, str] = {}
        self.buffers = BufferBudget(s.max_buffered_bytes)
        self.auth_throttle = AuthThrottle(s.auth_failures_per_second)
        self.warnings = RateLimitedLog(log)
        #: The KServe v2 front ends' shared service (None unless http or grpc listens).
        self.kserve: KServeService | None = None

    # ------------------------------------------------------------------ metrics and health

    def device_labels(self) -> dict[int, str]:
        """Device index -> metrics label, the device's name (``vulkan:0``, ``cpu``); devices
        never change."""
        if not self._device_labels:
            self._device_labels = {d.index: d.device for d in self.backend.status().devices}
        return self._device_labels

    def exposition(self) -> bytes:
        """``/metrics``: loads finished since the last scrape are observed first."""
        self._loads.record(self.backend.models(), self.device_labels())
        return self.metrics.exposition()

    def reject(self, reason: str) -> None:
        """A request refused before it reached the scheduler's queue."""
        self.metrics.rejected.labels(reason).inc()

    def observe_infer(self, model: str, result: InferResult | None, outcome: str,
                      total: float) -> None:
        """One finished infer request: ``result`` is None unless it succeeded. A request the
        scheduler's full queue refused is a rejection (counted there only), not a finished one."""
        if outcome == "overloaded":
            self.reject("overloaded")  # the scheduler's queue was full: refused, never ran
            return
        if result is None:
            self.metrics.observe_request(model, "none", outcome, total=total)
        else:
            device = self.device_labels().get(result.device_index, str(result.device_index))
            self.metrics.observe_request(model, device, outcome, total=total,
                                         queue=result.queue_seconds, execution=result.run_seconds,
                                         batch_size=result.batch_size)

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: every configured model ready on at least one healthy device.

        A GPU that discovery could not use (device nodes, but no Vulkan GPU) does not make
        the daemon unready, since the CPU serves every model that allows it (a model that
        does not is named as failed anyway); its warning is a second line of the body,
        ready or not, so whoever reads the probe sees it. So is a model's failed reload
        (one ``warning:`` line each): its previous version still serves.
        """
        if self.draining:
            return False, "not ready: shutting down"
        try:
            status = self.backend.status()
            models = self.backend.models()
        except Exception as exc:  # the answer is "not ready", with the reason
            return False, f"not ready: {type(exc).__name__}: {exc}"
        waiting = [m for m in models if m.state not in (ModelState.READY, ModelState.UNLOADING)]
        serving = [m.name for m in models if m.state is ModelState.READY]
        if self.config.metrics.readyz == "any" and serving and status.ready:
            ready, why = True, f"ready: {', '.join(serving)}" + "".join(
                f"\nwarning: model {m.name} ({m.state}{f': {m.error}' if m.error else ''})"
                for m in waiting)
        elif waiting:
            ready, why = False, "not ready: " + "; ".join(
                f"{m.name} ({m.state}{f': {m.error}' if m.error else ''})" for m in waiting)
        elif not status.ready:
            ready, why = False, "not ready: the scheduler is starting or has no healthy device"
        else:
            ready, why = True, f"ready: {', '.join(m.name for m in models) or 'no models configured'}"
        if status.gpu_problem is not None:
            why += f"\nwarning: {status.gpu_problem.describe()}"
        for m in models:  # the previous version still serves, so this is no reason to be unready
            if m.reload_error:
                why += (f"\nwarning: model {m.name}: reload failed, the previous version "
                        f"keeps serving: {m.reload_error}")
        return ready, why

    def systemd_status(self) -> str:
        """One STATUS= line: devices (health) and models (state)."""
        try:
            status = self.backend.status()
            models = self.backend.models()
        except Exception as exc:  # advisory text only
            return f"status unavailable: {exc}"
        devices = ", ".join(f"{d.device}{'' if d.healthy else ' (FAILED)'}"
                            for d in status.devices) or "none"
        names = ", ".join(f"{m.name} ({m.state})" for m in models) or "none"
        return f"devices: {devices}; models: {names}; requests served: {self.requests_done}"

    async def handle_unix(self, stream: trio.SocketStream) -> None:
        await self._handle(stream, "unix", needs_auth=False)

    async def handle_tcp(self, stream: trio.SocketStream) -> None:
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = f"tcp {host}:{port}"
            address = address_key(str(host))
        except OSError:
            peer = address = "tcp ?"
        await self._handle(stream, peer, needs_auth=True, address=address)

    def _make_room_unauthenticated(self, address: str) -> None:
        """A new TCP connection needs a place in the unauthenticated budget
        (``max_unauthenticated``, ``max_unauthenticated_per_address``): when it is full, the
        oldest unauthenticated connection (of the same address if that one is over its share)
        is closed, so silent connections cannot keep anyone out for long."""
        s = self.config.server
        same = [c for c, a in self._preauth.items() if a == address]
        if len(same) >= s.max_unauthenticated_per_address:
            victim, why = same[0], (f"too many unauthenticated connections from {address} "
                                    f"(limit {s.max_unauthenticated_per_address})")
        elif len(self._preauth) >= s.max_unauthenticated:
            victim, why = next(iter(self._preauth)), (
                f"too many unauthenticated connections (limit {s.max_unauthenticated})")
        else:
            return
        del self._preauth[victim]
        self.reject("too_many_unauthenticated")
        self.warnings.warning("closed unauthenticated connections",
                              "closing unauthenticated connection %s: %s", victim.peer, why)
        victim.evict(f"{why}: closed to make room for a newer one")

    def promote(self, conn: Connection) -> str | None:
        """``conn`` authenticated: it moves from the unauthenticated budget into the
        ``max_connections`` one; the refusal's text when that one is full."""
        self._preauth.pop(conn, None)
        limit = self.config.server.max_connections
        if len(self._admitted) >= limit:
            self.warnings.warning("refused connections", "refusing connection %s: %s", conn.peer,
                                  f"too many connections (limit {limit})")
            return f"too many connections (limit {limit})"
        self._admitted.add(conn)
        return None

    async def _handle(self, stream: trio.abc.Stream, peer: str, *, needs_auth: bool,
                      address: str | None = None) -> None:
        self.connections_total += 1
        peer = f"{peer}#{self.connections_total}"
        full = not needs_auth and len(self._admitted) >= self.config.server.max_connections
        if self.draining or full:
            why = "the daemon is shutting down" if self.draining else (
                f"too many connections (limit {self.config.server.max_connections})")
            self.warnings.warning("refused connections", "refusing connection %s: %s", peer, why)
            self.reject("shutting_down" if self.draining else "too_many_connections")
            frame = encode_frame(Response.failure(CONNECTION_ERROR_ID, ErrorCode.UNAVAILABLE, why).to_message())
            with trio.move_on_after(1.0):
                try:
                    await stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            return
        conn = Connection(self, stream, peer, needs_auth=needs_auth, address=address)
        if needs_auth:
            key = address or peer
            self._make_room_unauthenticated(key)
            self._preauth[conn] = key
        else:
            self._admitted.add(conn)
        self.connections.add(conn)
        log.debug("connection %s opened", peer)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            self._admitted.discard(conn)
            self._preauth.pop(conn, None)
            if self.draining and not self.connections:
                self._all_closed.set()

    def begin_drain(self) -> None:
        self.draining = True
        for conn in list(self.connections):
            conn.begin_drain()
        if not self.connections:
            self._all_closed.set()

    def abort_in_flight(self) -> None:
        """Drain timeout: every request still in flight ends now, answered UNAVAILABLE."""
        for conn in list(self.connections):
            conn.abort_in_flight()

    async def wait_all_closed(self) -> None:
        await self._all_closed.wait()

    def requests_in_flight(self) -> int:
        """Requests of the native protocol and infer calls of the KServe front ends."""
        kserve = len(self.kserve.calls) if self.kserve is not None else 0
        return sum(c.requests_in_flight for c in self.connections) + kserve

    async def housekeeping(self) -> None:
        """Once a second: the summary lines of rate-limited warnings whose interval is over."""
        while True:
            await trio.sleep(1.0)
            self.warnings.flush()

    def server_status(self) -> dict[str, Wire]:
        return {
            "version": self.version,
            "pid": os.getpid(),
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "listening": list(self.listening),
            "connections": len(self.connections),
            "unauthenticated_connections": len(self._preauth),
            "connections_total": self.connections_total,
            "buffered_bytes_reserved": self.buffers.used,
            "requests_in_flight": self.requests_in_flight(),
            "infer_in_flight": self.infer_in_flight,
            "requests_done": self.requests_done,
            "draining": self.draining,
        }


def _example_command(
    models: list[ModelInfo], repository: Path | None, socket_path: Path, default_socket: Path
) -> str:
    """``vkserve infer ...`` for the first ready model (else one still loading), with a sample
    input when the folder has one; ``vkserve models`` when none can answer (it says why)."""
    usable = ([m for m in models if m.state is ModelState.READY]
              or [m for m in models if m.state is ModelState.LOADING])
    if not usable:
        return "vkserve models"
    first = usable[0]
    args = f"vkserve infer {first.name}"
    sample = None
    if repository is not None:
        samples = sorted((repository / first.name / "samples").glob("*.npy"))
        sample = next((s for s in samples if s.stem == "3"), samples[0] if samples else None)
    inputs = list(first.inputs)
    if sample is not None and len(inputs) == 1:
        cwd = Path.cwd()  # short when under the folder it was started in; absolute elsewhere and under systemd (cwd /)
        shown = sample.relative_to(cwd) if cwd != Path("/") and sample.is_relative_to(cwd) else sample
        args += f" --input {inputs[0]}={shown}"
    else:
        args += " --random-input"
    if socket_path != default_socket:
        args += f" --socket {socket_path}"
    return args


async def _rescan(backend: Backend) -> None:
    """SIGHUP: load the models whose folders appeared (or were fixed) in the repository."""
    try:
        result = await backend.rescan()
    except Exception as exc:  # e.g. not running yet; the daemon goes on either way
        log.warning("SIGHUP: rescan failed: %s", exc)
        return
    log.info("SIGHUP: repository rescanned: %s", result)


async def _watch_signals(
    signals: AsyncIterator[int], stop: trio.Event, startup: trio.CancelScope, root: trio.Nursery,
    backend: Backend,
) -> None:
    hard = root.cancel_scope
    async for signum in signals:
        if signum == signal.SIGHUP:
            if not stop.is_set():
                root.start_soon(_rescan, backend)
            continue
        if not stop.is_set():
            log.info("%s: shutting down (draining requests in flight)", signal.Signals(signum).name)
            stop.set()
            startup.cancel()
        else:
            log.warning("%s again: stopping now", signal.Signals(signum).name)
            hard.cancel()


async def _wait_ready(backend: Backend, stop: trio.Event, scope: trio.CancelScope) -> None:
    """Until the scheduler reports ready (start-up loads done) or a stop signal arrives."""
    async def stop_on_signal() -> None:
        await stop.wait()
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_on_signal)
        await backend.wait_until(backend.ready)
        nursery.cancel_scope.cancel()


#: Seconds the UNAVAILABLE answers of a drain timeout may take to go out.
ABORT_GRACE = 2.0
#: Seconds between STATUS= refreshes (sent only when the text changed).
STATUS_INTERVAL = 5.0
#: how far each ping before READY moves systemd's start timeout ahead (several ping rounds)
START_EXTENSION = 30.0
#: start-up time after which the pings stop extending it (systemd's own timeout applies again)
START_LIMIT = 900.0


async def _systemd_pings(interval: float | None, started: float, server: Server | None = None) -> None:
    """WATCHDOG=1 every ``interval`` (half of ``$WATCHDOG_USEC``) from the trio loop itself,
    so a stuck loop stops the pings and systemd restarts the daemon; a STATUS= line when the
    devices' or models' state changed. Until READY (and while the backend is built, before
    there is a ``server``), each round also pushes systemd's start timeout (TimeoutStartSec=,
    90 s by default) :data:`START_EXTENSION` ahead, for at most :data:`START_LIMIT` from
    ``started``: a first start compiles every CPU kernel, 90-110 s on a 2-core box and more on
    a Raspberry Pi-class one (the unit's start timed out)."""
    last_status = ""
    next_status = 0.0
    while True:
        now = trio.current_time()
        ready = server is not None and server.ready_announced
        lines = []
        if interval:
            lines.append("WATCHDOG=1")
        if not ready and now - started < START_LIMIT:
            lines.append(f"EXTEND_TIMEOUT_USEC={int(START_EXTENSION * 1e6)}")
        if now >= next_status and server is not None and ready:
            text = server.systemd_status()
            if text != last_status:
                lines.append(f"STATUS={text}")
                last_status = text
            next_status = now + STATUS_INTERVAL
        if lines:
            systemd.notify("\n".join(lines))
        await trio.sleep(min(interval or STATUS_INTERVAL, STATUS_INTERVAL))


async def _build_backend(factory: Callable[[], Awaitable[Backend]], started: float) -> Backend:
    """``factory()`` (a test hook's devices are discovered in there), with the systemd pings
    running meanwhile; its errors come out as they are (not in a group)."""
    failed: Exception | None = None
    async with trio.open_nursery() as building:
        if os.environ.get("NOTIFY_SOCKET"):
            building.start_soon(_systemd_pings, systemd.watchdog_interval(), started)
        try:
            backend = await factory()
        except Exception as exc:  # re-raised below, outside the nursery
            failed = exc
        building.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return backend


@dataclasses.dataclass
class _Listening:
    """Where the daemon listens: its own Unix socket or the ones systemd passed, TCP, metrics."""

    socket_path: Path  # for the banner's example command
    unix: UnixSocket | None = None  # bound here (removed at exit); None when inherited
    unix_listeners: list[trio.SocketListener] = dataclasses.field(default_factory=list)
    tcp_listeners: list[trio.SocketListener] = dataclasses.field(default_factory=list)
    metrics: list[trio.SocketListener] = dataclasses.field(default_factory=list)
    metrics_host: str = ""
    described: list[str] = dataclasses.field(default_factory=list)
    inherited: list[socket.socket] = dataclasses.field(default_factory=list)
    #: KServe v2: HTTP listeners, the bound (not started) gRPC server, their announcements,
    #: and the token they need (None on loopback addresses).
    http: list[trio.SocketListener] = dataclasses.field(default_factory=list)
    grpc_server: grpc.Server | None = None
    kserve_lines: list[str] = dataclasses.field(default_factory=list)
    kserve_token: str | None = None

    def close(self) -> None:
        """Idempotent: remove our socket file and close every socket (served ones are
        closed already; those never served, e.g. after a start-up failure, are not)."""
        if self.unix is not None:
            self.unix.unlink()
            self.unix.sock.close()
        for listener in self.unix_listeners + self.tcp_listeners + self.metrics + self.http:
            listener.socket.close()
        for sock in self.inherited:
            sock.close()
        if self.grpc_server is not None:
            self.grpc_server.stop(None)


def _adopt_inherited(sockets: list[socket.socket], config: Config, where: _Listening) -> None:
    """Socket activation: serve the listening sockets systemd passed (Unix and/or TCP)."""
    for sock in sockets:
        if sock.type != socket.SOCK_STREAM:
            raise ListenError(f"socket activation: fd {sock.fileno()} is not a stream socket")
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        if sock.family == socket.AF_UNIX:
            name = sock.getsockname()
            path = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            where.unix_listeners.append(listener)
            where.described.append(f"unix:{path or '(unnamed)'}")
            if path and not path.startswith("\0"):
                where.socket_path = Path(path)
        elif sock.family in (socket.AF_INET, socket.AF_INET6):
            where.tcp_listeners.append(listener)
            where.described.append("tcp:{}:{}".format(*tcp_listen_address(listener)))
        else:
            raise ListenError(f"socket activation: fd {sock.fileno()}: unsupported family "
                              f"{sock.family!r}")
    log.info("socket activation: serving %d inherited socket(s): %s", len(sockets),
             ", ".join(where.described))


def _resolve_token(config: Config, tcp_inherited: bool) -> str | None:
    if not tcp_inherited or config.server.tcp:
        return resolve_token(config.server)
    try:  # systemd passed a TCP socket: it needs a token as server.tcp does
        return resolve_token(dataclasses.replace(config.server, tcp="inherited"))
    except ConfigError as exc:
        raise ConfigError(f"socket activation passed a TCP socket: {exc}") from None


async def _open_listeners(config: Config) -> tuple[_Listening, str | None]:
    """Bind (or inherit) every socket before anything slow, so a taken address fails fast."""
    where = _Listening(config.server.socket_path())
    inherited = systemd.listen_fds()
    where.inherited = inherited
    try:
        if inherited:
            _adopt_inherited(inherited, config, where)
            token = _resolve_token(config, bool(where.tcp_listeners))
        else:
            token = resolve_token(config.server)
            where.unix = bind_unix_socket(where.socket_path, config.server.socket_mode)
            where.unix_listeners.append(where.unix.listener())
            where.described.append(f"unix:{where.socket_path}")
            tcp = config.server.tcp_address()
            if tcp is not None:
                where.tcp_listeners = await open_tcp_listeners(tcp.host, tcp.port)
                where.described += ["tcp:{}:{}".format(*tcp_listen_address(ls))
                                    for ls in where.tcp_listeners]
        metrics = config.metrics.listen_address()
        if metrics is not None:
            host, port = metrics
            try:
                where.metrics = await trio.open_tcp_listeners(port, host=host)
            except OSError as exc:
                raise ListenError(f"metrics.listen {host}:{port}: cannot listen: {exc}") from None
            where.metrics_host = host
        await _open_kserve(config, where)
    except BaseException:
        where.close()
        raise
    return where, token


async def _open_kserve(config: Config, where: _Listening) -> None:
    """Bind the KServe v2 HTTP and gRPC addresses; the token when one is off the loopback."""
    http, grpc_at = config.http.listen_address(), config.grpc.listen_address()
    remote = [f"{name}.listen {addr[0]}" for name, addr in (("http", http), ("grpc", grpc_at))
              if addr is not None and not is_loopback(addr[0])]
    if remote:
        where.kserve_token = resolve_token(config.server, needed_by=" and ".join(remote))
    note = " (token required)" if where.kserve_token is not None else ""
    if http is not None:
        host, port = http
        try:
            where.http = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise ListenError(f"http.listen {host}:{port}: cannot listen: {exc}") from None
        for listener in where.http:
            bound_host, bound_port = tcp_listen_address(listener)
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            where.kserve_lines.append(f"vkserve: KServe v2 HTTP on http://{shown}:{bound_port}/v2{note}")
    if grpc_at is not None:
        from vkserve.daemon.kserve.grpc_server import bind_grpc, grpc_address  # noqa: PLC0415

        host, port = grpc_at
        try:
            where.grpc_server, bound = bind_grpc(host, port, config.server)
        except OSError as exc:
            raise ListenError(f"grpc.listen {host}:{port}: cannot listen: {exc}") from None
        where.kserve_lines.append(f"vkserve: KServe v2 gRPC on {grpc_address(host, bound)}{note}")


async def serve(config: Config, backend_factory: Callable[[], Awaitable[Backend]] | None = None,
                announce: Callable[[str], None] | None = None) -> int:
    """Run the daemon until SIGINT/SIGTERM; returns the exit status.

    ``backend_factory`` builds the scheduler (default: ``scheduler.Scheduler`` over the
    discovered devices and ``config.models.repository``). Raises ConfigError / ListenError
    for problems found before serving.
    """
    say = announce or (lambda line: print(line, flush=True))
    repo_path = config.models.repository_path()
    if backend_factory is None:
        backend_factory = _default_backend_factory(config, repo_path)
    where, token = await _open_listeners(config)
    started = trio.current_time()
    try:
        backend = await _build_backend(backend_factory, started)
        server = Server(config, backend, token)
        server.repository = repo_path
        server.listening = list(where.described)
        listeners: list[tuple[Handler, list[trio.SocketListener]]] = []
        if where.unix_listeners:
            listeners.append((server.handle_unix, where.unix_listeners))
        if where.tcp_listeners:
            listeners.append((server.handle_tcp, where.tcp_listeners))
        frontends = _kserve_frontends(config, server, where)
        if frontends.http is not None:
            listeners.append((frontends.http.handle, where.http))
        return await _run(config, server, backend, where, listeners, frontends, say, started)
    finally:
        where.close()


@dataclasses.dataclass
class _Frontends:
    """The KServe v2 front ends that listen (both None when neither is configured)."""

    http: HttpFrontend | None = None
    grpc: GrpcFrontend | None = None

    def begin_drain(self, grpc_grace: float) -> None:
        """Idle HTTP connections close, gRPC refuses new calls (``grpc_grace`` seconds for
        those in flight); requests in flight go on."""
        if self.http is not None:
            self.http.begin_drain()
        if self.grpc is not None:
            self.grpc.begin_stop(grpc_grace)

    async def wait_drained(self) -> None:
        """Until every HTTP request and gRPC call in flight has been answered."""
        if self.http is not None:
            await self.http.wait_idle()
        if self.grpc is not None:
            await self.grpc.wait_stopped()


def _kserve_frontends(config: Config, server: Server, where: _Listening) -> _Frontends:
    frontends = _Frontends()
    if not where.http and where.grpc_server is None:
        return frontends
    server.kserve = KServeService(server)
    if where.http:
        from vkserve.daemon.kserve.http_server import HttpFrontend  # noqa: PLC0415

        frontends.http = HttpFrontend(server.kserve, config.server, where.kserve_token,
                                      server.auth_throttle)
    if where.grpc_server is not None:
        from vkserve.daemon.kserve.grpc_server import GrpcFrontend  # noqa: PLC0415

        frontends.grpc = GrpcFrontend(where.grpc_server, server.kserve, where.kserve_token,
                                      server.auth_throttle, trio.lowlevel.current_trio_token())
    return frontends


def _default_backend_factory(config: Config, repo_path: Path) -> Callable[[], Awaitable[Backend]]:
    if not repo_path.is_dir():
        raise ConfigError(f"models.repository: {repo_path} is not a directory")
    table = dict(config.scheduler)
    if "cache_dir" not in table:  # persistent pipeline caches unless the config says ""
        from vkserve.cache.persist import default_cache_dir  # noqa: PLC0415

        table["cache_dir"] = str(default_cache_dir())
    sched_cfg = scheduler_config(table, SchedulerConfig)

    async def build() -> Backend:
        # (the scheduler compiles the CPU kernels for this machine, or loads them from their
        # cache, once it runs: beside the GPUs' loads, the sockets answering meanwhile)
        log.info("%s", cpu_threads.configure(config.cpu.threads))
        hooks = parse_test_hooks(os.environ)
        if not hooks:  # the scheduler discovers the devices itself (in a worker thread) when it runs
            return Scheduler(None, sched_cfg, ModelRepository(repo_path))
        devices, gpu_problem = await trio.to_thread.run_sync(_hooked_devices, sched_cfg, hooks)
        return Scheduler(devices, sched_cfg, ModelRepository(repo_path), gpu_problem=gpu_problem)

    return build


#: Test hooks (DESIGN issue 6: faults are injected in the device worker, not by mocking
#: Vulkan), reached from outside the process: ``VKSERVE_TEST_DEVICE_DELAY="cpu=0.3,0=0.05"``
#: adds seconds to every run on those devices, ``VKSERVE_TEST_DEVICE_FAULT="0=3"`` makes the
#: next runs on device 0 fail as a lost device (``"0=3@500"``: the 3 runs after 500 more runs,
#: a fault in the middle of a load). Devices are indices or ``cpu``.
TEST_HOOK_VARS = {"VKSERVE_TEST_DEVICE_DELAY": "delay", "VKSERVE_TEST_DEVICE_FAULT": "fault"}


def parse_test_hooks(env: Mapping[str, str]) -> list[tuple[str, str, float, int]]:
    """``[(kind, device, value, after)]`` from the test-hook variables; ConfigError when
    malformed."""
    hooks = []
    for var, kind in TEST_HOOK_VARS.items():
        for item in filter(None, (p.strip() for p in env.get(var, "").split(","))):
            device, sep, value = item.partition("=")
            value, at, after = value.partition("@")
            try:
                number = float(value)
                runs = int(after) if at else 0
            except ValueError:
                number, runs = -1.0, -1
            if (not sep or not (device == "cpu" or device.isdigit()) or number < 0 or runs < 0
                    or (at and kind != "fault")):
                raise ConfigError(f"${var}: {item!r} is not DEVICE=NUMBER (DEVICE an index or cpu"
                                  f"{'; NUMBER@RUNS to start after RUNS runs' if kind == 'fault' else ''})")
            hooks.append((kind, device, number, runs))
    return hooks


def _hooked_devices(sched_cfg: SchedulerConfig, hooks: list[tuple[str, str, float, int]]
                    ) -> tuple[list[DeviceHandle], GpuProblem | None]:
    use_vulkan = sched_cfg.use_vulkan and vulkan_engine_available()
    handles, gpu_problem = discover_handles(use_vulkan=use_vulkan, cache_dir=sched_cfg.cache_dir)
    for kind, device, value, after in hooks:
        for h in handles:
            if (device == "cpu" and h.is_cpu) or (device.isdigit() and h.index == int(device)):
                log.warning("TEST HOOK: device %d (%s): %s %g after %d runs", h.index, h.name, kind, value, after)
                if kind == "delay":
                    h.inject_delay(value)
                else:
                    h.inject_fault(int(value), after)
    return handles, gpu_problem


async def _run(
    config: Config,
    server: Server,
    backend: Backend,
    where: _Listening,
    listeners: list[tuple[Handler, list[trio.SocketListener]]],
    frontends: _Frontends,
    say: Callable[[str], None],
    started: float,
) -> int:
    stop = trio.Event()
    startup = trio.CancelScope()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as root:
            root.start_soon(_watch_signals, signals, stop, startup, root, backend)
            if os.environ.get("NOTIFY_SOCKET"):
                root.start_soon(_systemd_pings, systemd.watchdog_interval(), started, server)
            if where.metrics:
                from vkserve.daemon.metrics_http import serve_metrics  # noqa: PLC0415

                port = await root.start(functools.partial(
                    serve_metrics, where.metrics_host, 0, server.exposition, server.readiness,
                    listeners=where.metrics))
                host = where.metrics_host
                shown = f"[{host}]" if ":" in host else host
                say(f"vkserve: metrics on http://{shown}:{port}/metrics (also /healthz, /readyz)")
            with startup:
                systemd.notify("STATUS=starting the scheduler")
                await root.start(backend.run)
            if stop.is_set():
                systemd.notify("STOPPING=1\nSTATUS=stopped during start-up")
                say("vkserve: stopped during start-up")
            else:
                await _accept_and_drain(config, server, where, listeners, frontends, stop, say)
            systemd.notify("STATUS=closing the scheduler (saving pipeline caches)")
            await backend.aclose()
            root.cancel_scope.cancel()
    return 0


async def _accept_and_drain(
    config: Config,
    server: Server,
    where: _Listening,
    listeners: list[tuple[Handler, list[trio.SocketListener]]],
    frontends: _Frontends,
    stop: trio.Event,
    say: Callable[[str], None],
) -> None:
    async with trio.open_nursery() as handlers:
        handlers.start_soon(server.housekeeping)
        async with trio.open_nursery() as acceptors:
            for handler, group in listeners:
                await acceptors.start(
                    functools.partial(trio.serve_listeners, handler, group, handler_nursery=handlers)
                )
            if frontends.grpc is not None:
                frontends.grpc.start()
            for listening in server.listening:
                kind, _, addr = listening.partition(":")
                say(f"vkserve: listening on {kind} {addr}{' (token required)' if kind == 'tcp' else ''}")
            for line in where.kserve_lines:
                say(line)
            with trio.CancelScope() as loading:
                systemd.notify("STATUS=loading models")
                await _wait_ready(server.backend, stop, loading)
            if stop.is_set():
                acceptors.cancel_scope.cancel()
            else:
                _announce(server, where.socket_path, say)
                systemd.notify(f"READY=1\nSTATUS=serving on {', '.join(server.listening)}; "
                               f"{server.systemd_status()}")
                server.ready_announced = True
                await stop.wait()
                acceptors.cancel_scope.cancel()  # closes the listeners
        if where.unix is not None:
            where.unix.unlink()
        in_flight = server.requests_in_flight()
        say(f"vkserve: stopping; draining {in_flight} request(s) in flight "
            f"(up to {config.server.drain_timeout:g} s)")
        systemd.notify(f"STOPPING=1\nSTATUS=draining {in_flight} request(s)")
        server.begin_drain()
        frontends.begin_drain(config.server.drain_timeout + ABORT_GRACE)
        with trio.move_on_after(config.server.drain_timeout) as drain:
            await server.wait_all_closed()
            await frontends.wait_drained()
        if drain.cancelled_caught:
            left = server.requests_in_flight()
            log.warning("drain timeout: cancelling %d request(s) still in flight "
                        "(answered UNAVAILABLE)", left)
            server.abort_in_flight()
            if server.kserve is not None:
                server.kserve.abort_in_flight()
            with trio.move_on_after(ABORT_GRACE):  # the answers go out, connections close
                await server.wait_all_closed()
                await frontends.wait_drained()
        handlers.cancel_scope.cancel()
    say(f"vkserve: stopped ({server.requests_done} requests served)")


def _announce(server: Server, socket_path: Path, say: Callable[[str], None]) -> None:
    from vkserve.client.paths import default_socket_path  # noqa: PLC0415

    try:
        models = server.backend.models()
    except Exception:  # only for the banner; serving goes on
        log.exception("listing models for the start-up banner failed")
        models = []
    names = ", ".join(f"{m.name} ({m.state})" for m in models) or "none"
    say(f"vkserve {server.version}: models: {names}")
    say(f"vkserve: send a job:  {_example_command(models, server.repository, socket_path, default_socket_path())}")


def run_daemon(config: Config) -> int:
    """``trio.run(serve)`` with one-line reporting of start-up problems (exit status 1/2)."""
    try:
        return trio.run(serve, config)
    except ConfigError as exc:
        print(f"vkserve serve: config: {exc}", file=sys.stderr)
        return 2
    except ListenError as exc:
        print(f"vkserve serve: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        config_errors, rest = group.split((ConfigError, ListenError))
        if rest is None and config_errors is not None:
            print(f"vkserve serve: {config_errors.exceptions[0]}", file=sys.stderr)
            return 2
        log.error("vkserve serve failed", exc_info=group)
        return 1
