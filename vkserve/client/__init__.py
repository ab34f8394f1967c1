"""vkserve client: the wire protocol (:mod:`vkserve.client.protocol`) and sync/trio clients."""

from .errors import (
    BadRequestError,
    ClientError,
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
from .paths import UnsafeSocketFolder
from .sync_client import Client
from .trio_client import TrioClient

__all__ = [
    "BadRequestError",
    "Client",
    "ClientError",
    "ConnectionClosed",
    "DeadlineExceeded",
    "DeviceError",
    "InternalError",
    "NotFound",
    "Overloaded",
    "RequestCancelled",
    "ServerError",
    "TrioClient",
    "Unauthenticated",
    "Unavailable",
    "UnsafeSocketFolder",
]
