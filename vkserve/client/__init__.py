"""vkserve client: the wire protocol (:mod:`vkserve.client.protocol`), the blocking
:class:`Client` (threads) and the :class:`AsyncClient` (asyncio and trio, on anyio)."""

from .async_client import AsyncClient
from .errors import (
    BadRequestError,
    CallTimeout,
    ClientError,
    ConnectFailed,
    ConnectionClosed,
    DeadlineExceeded,
    DeviceError,
    InternalError,
    NotFound,
    Overloaded,
    RequestCancelled,
    ServerError,
    Unauthenticated,
    Unavailable,
)
from .messages import InferReply
from .paths import UnsafeSocketFolder
from .policy import DEFAULT_TIMEOUT, RetryPolicy
from .sync_client import Client

__all__ = [
    "DEFAULT_TIMEOUT",
    "AsyncClient",
    "BadRequestError",
    "CallTimeout",
    "Client",
    "ClientError",
    "ConnectFailed",
    "ConnectionClosed",
    "DeadlineExceeded",
    "DeviceError",
    "InferReply",
    "InternalError",
    "NotFound",
    "Overloaded",
    "RequestCancelled",
    "RetryPolicy",
    "ServerError",
    "Unauthenticated",
    "Unavailable",
    "UnsafeSocketFolder",
]
