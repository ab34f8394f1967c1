"""The metrics listener: GET /metrics, /healthz (live) and /readyz (ready) over HTTP/1.0.

A deliberately tiny trio server (one request per connection, bounded request size and
time) instead of prometheus-client's thread server: it runs in the daemon's nursery, so it
stops with the daemon, and readiness comes from the same process state it reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from prometheus_client import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT = 5.0


def parse_listen(value: str) -> tuple[str, int] | None:
    """`HOST:PORT` (`[v6]:PORT` too) or `off` -> None."""
    if value == "off":
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics listen address {value!r}: expected HOST:PORT or 'off'")
    return host.strip("[]") or "127.0.0.1", int(port)


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
        return _response("200 OK", exposition(), CONTENT_TYPE_LATEST)
    if path == "/healthz":
        return _response("200 OK", b"ok\n")
    if path == "/readyz":
        ok, why = ready()
        return _response("200 OK" if ok else "503 Service Unavailable", (why + "\n").encode())
    return _response("404 Not Found", b"not found: try /metrics, /healthz or /readyz\n")


async def serve_metrics(host: str, port: int, exposition: Callable[[], bytes],
                        ready: Callable[[], tuple[bool, str]], *,
                        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled; reports the bound port through task_status."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            head = b""
            with trio.move_on_after(REQUEST_TIMEOUT):
                while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_BYTES:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    head += chunk
            try:
                await stream.send_all(route(head, exposition, ready))
            except trio.BrokenResourceError:
                pass  # the scraper went away; nothing to tell it

    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("metrics on http://%s:%d/metrics (also /healthz, /readyz)", host, bound)
    task_status.started(bound)
    await trio.serve_listeners(handle, listeners)
