"""The metrics listener: GET /metrics, /healthz (live) and /readyz (ready) over HTTP/1.0.

A deliberately tiny trio server (one request per connection, bounded request size and
time) instead of prometheus-client's thread server: it runs in the daemon's nursery, so it
stops with the daemon, and readiness comes from the same process state it reports.

/readyz answers 200 or 503 with the reason as the body (``Server.readiness``). GPU device
nodes without a usable Vulkan GPU add a ``warning:`` line to the body but do not make the
daemon unready: the CPU still serves, and a model that may not run there is named as failed
(503) anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from prometheus_client import CONTENT_TYPE_LATEST

from vkserve.daemon.config import parse_listen

log = logging.getLogger(__name__)

__all__ = ["parse_listen", "route", "serve_metrics"]

MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT = 5.0


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def route(request_head: bytes, exposition: Callable[[], bytes],
          ready: Callable[[], tuple[bool, str]]) -> bytes:
    """Answer one request (sans-I/O: bytes of the request head in, response bytes out)."""
    try:
        method, target, _ = request_head.split(b"\r\n", 1)[0].decode("ascii").split(" ", 2)
    except (UnicodeDecodeError, ValueError):
        return _response("400 Bad Request", b"bad request line\n")
    path = target.split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return _response("405 Method Not Allowed", b"only GET\n")
    if path == "/metrics":
        response = _response("200 OK", exposition(), CONTENT_TYPE_LATEST)
    elif path == "/healthz":
        response = _response("200 OK", b"ok\n")
    elif path == "/readyz":
        ok, why = ready()
        response = _response("200 OK" if ok else "503 Service Unavailable",
                             (why + "\n").encode())
    else:
        response = _response("404 Not Found", b"not found: try /metrics, /healthz or /readyz\n")
    if method == "HEAD":
        response = response[:response.index(b"\r\n\r\n") + 4]
    return response


async def open_metrics_listeners(host: str, port: int) -> list[trio.SocketListener]:
    """Bind the metrics port (at start, so a taken port stops the daemon before anything slow)."""
    return await trio.open_tcp_listeners(port, host=host)


def bound_port(listeners: list[trio.SocketListener]) -> int:
    return int(listeners[0].socket.getsockname()[1])


async def serve_metrics(host: str, port: int, exposition: Callable[[], bytes],
                        ready: Callable[[], tuple[bool, str]], *,
                        listeners: list[trio.SocketListener] | None = None,
                        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled (on ``listeners`` when given, else on a new ``host:port``
    listener); reports the bound port through task_status. A failing scrape is answered
    500 and logged; it never stops the daemon."""

    def answer(head: bytes) -> bytes:
        try:
            return route(head, exposition, ready)
        except Exception:  # a bug in a collector costs this scrape, not the daemon
            log.exception("metrics: answering %r failed", head[:80])
            return _response("500 Internal Server Error", b"internal error\n")

    async def handle(stream: trio.SocketStream) -> None:
        try:
            async with stream:
                head = b""
                with trio.move_on_after(REQUEST_TIMEOUT):
                    while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_BYTES:
                        chunk = await stream.receive_some(4096)
                        if not chunk:
                            break
                        head += chunk
                await stream.send_all(answer(head))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the scraper went away; nothing to tell it

    if listeners is None:
        listeners = await open_metrics_listeners(host, port)
    bound = bound_port(listeners)
    log.info("metrics on http://%s:%d/metrics (also /healthz, /readyz)", host, bound)
    task_status.started(bound)
    await trio.serve_listeners(handle, listeners)
