"""Sans-I/O client side of a connection (in the manner of h11): ids, request frames, responses.

The sync and async clients own the socket and only move bytes; this object does the rest.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping

import numpy.typing as npt

from .framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, FrameError, encode_frame
from .images import as_input
from .messages import InferRequest, Request, Response, parse_response

__all__ = ["DEADLINE_GRACE", "ClientConnection", "answer_wait_budget"]

#: How long past a request's deadline a client waits for the server's own answer before it
#: cancels the request and raises DeadlineExceeded itself.
DEADLINE_GRACE = 1.0


def answer_wait_budget(deadline: float | None, timeout: float | None) -> float | None:
    """Seconds a client waits for an answer: until the request's deadline plus the grace
    period; ``None`` (wait indefinitely) without a deadline."""
    now = time.time()
    ends = [t for t in (deadline, None if timeout is None else now + timeout) if t is not None]
    if not ends:
        return None
    return max(0.0, min(ends) - now) + DEADLINE_GRACE


class ClientConnection:
    """Encode requests and decode responses for one connection.

    Typical use: ``frame = conn.encode(InferRequest(conn.next_id(), ...))``; on receiving bytes,
    ``conn.receive_data(chunk)`` then ``while (r := conn.next_response()) is not None``.
    Any :class:`~client.framing.ProtocolError` raised here means the server broke the protocol
    and the connection should be closed.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._decoder = FrameDecoder(max_frame_size)
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        """A fresh request id (>= 1). Safe to call from several threads (``count`` is atomic)."""
        return next(self._ids)

    def infer_request(self, model: str, inputs: Mapping[str, npt.ArrayLike], *,
                      priority: int, deadline: float | None, timeout: float | None,
                      outputs: list[str] | None) -> InferRequest:
        """An infer request with a fresh id (the same for the sync and the async client)."""
        return InferRequest(self.next_id(), model,
                            {name: as_input(value) for name, value in inputs.items()},
                            priority=priority, deadline=deadline, timeout=timeout,
                            outputs=outputs)

    def encode(self, request: Request) -> bytes:
        """The frame that sends ``request``."""
        return encode_frame(request.to_message(), self.max_frame_size)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes read from the socket, in order."""
        self._decoder.feed(data)

    def receive_eof(self) -> None:
        """Raise FrameError if the peer closed in the middle of a frame."""
        if self._decoder.buffered:
            raise FrameError(f"connection closed with {self._decoder.buffered} bytes of an unfinished frame")

    def next_response(self) -> Response | None:
        """The next whole response received, or None until more bytes arrive."""
        msg = self._decoder.next_message()
        return None if msg is None else parse_response(msg)
