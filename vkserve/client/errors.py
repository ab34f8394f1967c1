"""Exceptions raised by the clients.

Server-side failures arrive as :class:`ServerError` subclasses, one per :class:`ErrorCode`, so
callers can write ``except Overloaded:`` and still read ``exc.code`` / ``exc.message``.
"""

from __future__ import annotations

import os
from typing import ClassVar

from .messages import ErrorCode, ErrorInfo

__all__ = [
    "BadRequestError",
    "CallTimeout",
    "ClientError",
    "ConnectFailed",
    "ConnectionClosed",
    "DeadlineExceeded",
    "DeviceError",
    "InternalError",
    "NotFound",
    "Overloaded",
    "RequestCancelled",
    "ServerError",
    "Unauthenticated",
    "Unavailable",
    "error_from_info",
]


class ClientError(Exception):
    """Base of every error the clients raise (besides local argument errors)."""


class ConnectFailed(ClientError):
    """No connection could be made: no socket at the path, nothing listening (refused), or no
    answer to the connect within the timeout. ``address`` is where the client tried."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"cannot connect to {address}: {reason}")

    @classmethod
    def from_os_error(cls, address: str, exc: OSError) -> ConnectFailed:
        """The failure a connect's OSError (no such file, refused, timed out, ...) means; an
        error that wraps the attempts' own (anyio's TCP connect) names theirs."""
        cause = exc.__cause__
        causes = cause.exceptions if isinstance(cause, BaseExceptionGroup) else (cause,)
        reasons = [_reason(c) for c in causes if isinstance(c, OSError)]
        return cls(address, "; ".join(dict.fromkeys(reasons)) if reasons else _reason(exc))


def _reason(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__


class ConnectionClosed(ClientError):
    """The connection is closed or broken; requests in flight on it failed with this."""


class ServerError(ClientError):
    """The server answered the request with an error."""

    #: Default code of the subclass; instances carry the code actually received in ``code``.
    default_code: ClassVar[ErrorCode | None] = None

    def __init__(self, message: str, code: ErrorCode | str | None = None) -> None:
        self.code: ErrorCode | str = code if code is not None else (self.default_code or "UNKNOWN")
        self.message = message
        super().__init__(f"{self.code}: {message}")


class BadRequestError(ServerError):
    default_code = ErrorCode.BAD_REQUEST


class NotFound(ServerError):
    default_code = ErrorCode.NOT_FOUND


class Overloaded(ServerError):
    default_code = ErrorCode.OVERLOADED


class DeadlineExceeded(ServerError):
    """Raised for the server's ``DEADLINE_EXCEEDED``, and locally when no answer came within the
    call's timeout (the daemon stopped or hung: the message then says so)."""

    default_code = ErrorCode.DEADLINE_EXCEEDED


class CallTimeout(DeadlineExceeded):
    """No answer came within the call's timeout: raised by the client itself (the daemon is
    stopped, hung or slow), which withdrew the request with a ``cancel``."""


class RequestCancelled(ServerError):
    default_code = ErrorCode.CANCELLED


class DeviceError(ServerError):
    default_code = ErrorCode.DEVICE_ERROR


class Unavailable(ServerError):
    default_code = ErrorCode.UNAVAILABLE


class InternalError(ServerError):
    default_code = ErrorCode.INTERNAL


class Unauthenticated(ServerError):
    default_code = ErrorCode.UNAUTHENTICATED


_BY_CODE: dict[str, type[ServerError]] = {
    cls.default_code: cls
    for cls in (
        BadRequestError,
        NotFound,
        Overloaded,
        DeadlineExceeded,
        RequestCancelled,
        DeviceError,
        Unavailable,
        InternalError,
        Unauthenticated,
    )
    if cls.default_code is not None
}


def error_from_info(info: ErrorInfo) -> ServerError:
    """The exception for an error response; unknown codes give a plain :class:`ServerError`."""
    return _BY_CODE.get(str(info.code), ServerError)(info.message, info.code)
