"""Length-prefixed msgpack framing (DESIGN §8), sans-I/O.

A frame is a 4-byte big-endian payload length followed by exactly one msgpack map. The length
prefix lets a reader refuse an oversized frame as soon as its header arrives, before buffering
any of the payload (msgpack's own Unpacker cannot do that, see notes/platform.md §2).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import msgpack

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "HEADER_SIZE",
    "FrameDecoder",
    "FrameError",
    "FrameTooLarge",
    "MalformedFrame",
    "ProtocolError",
    "encode_frame",
    "unpack_payload",
]

DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024
HEADER_SIZE = 4
_HEADER = struct.Struct(">I")
_U32_MAX = 0xFFFFFFFF


class ProtocolError(Exception):
    """Base of every error the wire layer raises about what a peer sent."""


class FrameError(ProtocolError):
    """The byte stream can no longer be split into frames; the connection must be closed."""


class FrameTooLarge(FrameError):
    """A frame header declared (or an encoder produced) a payload above the frame limit."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class MalformedFrame(ProtocolError):
    """A well-delimited frame whose payload is not one msgpack map.

    The framing itself is intact, so the stream may continue with the next frame.
    """


def encode_frame(message: Mapping[str, Any], max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """Pack ``message`` as one frame; raises FrameTooLarge rather than send what a peer rejects."""
    payload = msgpack.packb(message, use_bin_type=True)
    limit = min(max_frame_size, _U32_MAX)
    if len(payload) > limit:
        raise FrameTooLarge(len(payload), limit)
    return _HEADER.pack(len(payload)) + payload


#: How deep msgpack's unpacker lets arrays and maps nest (its fixed stack; deeper is StackError).
MAX_NESTING = 1024


def _unpack_reason(exc: Exception) -> str:
    """Why msgpack refused a payload; some of its errors carry no text of their own."""
    if isinstance(exc, msgpack.StackError):
        return f"arrays/maps nested deeper than {MAX_NESTING} levels"
    if isinstance(exc, msgpack.FormatError):
        return f"unknown or reserved type byte ({exc})" if str(exc) else "unknown or reserved type byte"
    return str(exc) or type(exc).__name__


def unpack_payload(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decode one frame payload into a map, or raise MalformedFrame.

    String keys are required at the top level; nested maps may only have str/bytes keys
    (``strict_map_key``). Length limits derive from the payload size, so a declared bin/array
    length can never exceed what actually arrived.
    """
    n = len(payload)
    try:
        obj = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=n,
            max_map_len=n,
            max_ext_len=n,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # ValueError covers ExtraData, FormatError, StackError, truncated data and bad UTF-8.
        raise MalformedFrame(f"payload is not valid msgpack: {_unpack_reason(exc)}") from None
    if not isinstance(obj, dict):
        raise MalformedFrame(f"payload must be a msgpack map, got {type(obj).__name__}")
    return obj


class FrameDecoder:
    """Split an incoming byte stream into decoded msgpack maps.

    Feed arbitrary chunks with :meth:`feed`, then call :meth:`next_message` until it returns
    ``None``. ``max_frame_size`` bounds the payload length (the 4-byte header excluded).

    Errors: :class:`FrameTooLarge` is fatal (raised as soon as the offending header is
    buffered; every later call raises it again). :class:`MalformedFrame` consumes only the bad
    frame; decoding continues with the next one.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 0:
            raise ValueError("max_frame_size must be >= 0")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._fatal: FrameError | None = None
        #: Frames consumed so far (decoded or malformed).
        self.frames = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame (non-zero at EOF means a torn frame)."""
        return len(self._buf)

    @property
    def frame_size(self) -> int | None:
        """Header plus payload bytes of the frame being received, once its header is in (the
        length a peer claims: nothing is allocated for it before the bytes arrive)."""
        if len(self._buf) < HEADER_SIZE:
            return None
        return HEADER_SIZE + _HEADER.unpack_from(self._buf)[0]

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes (FrameTooLarge as soon as an oversized header is in)."""
        if self._fatal is not None:
            raise self._fatal
        self._buf += data
        self._check_header()

    def next_message(self) -> dict[str, Any] | None:
        """Return the next complete frame's map, or ``None`` if more bytes are needed."""
        length = self._check_header()
        if length is None or len(self._buf) < HEADER_SIZE + length:
            return None
        end = HEADER_SIZE + length
        try:
            # Decode straight out of the receive buffer: no copy of the payload is made here.
            with memoryview(self._buf) as view, view[HEADER_SIZE:end] as payload:
                return unpack_payload(payload)
        finally:
            del self._buf[:end]
            self.frames += 1

    def __iter__(self) -> FrameDecoder:
        """Iterate over the complete messages buffered so far."""
        return self

    def __next__(self) -> dict[str, Any]:
        """The next complete message (StopIteration when more bytes are needed)."""
        msg = self.next_message()
        if msg is None:
            raise StopIteration
        return msg

    def _check_header(self) -> int | None:
        if self._fatal is not None:
            raise self._fatal
        if len(self._buf) < HEADER_SIZE:
            return None
        (length,) = _HEADER.unpack_from(self._buf)
        if length > self.max_frame_size:
            self._fatal = FrameTooLarge(length, self.max_frame_size)
            self._buf = bytearray()
            raise self._fatal
        return length
