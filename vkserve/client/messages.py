"""Message schema (DESIGN §8): typed requests and responses, validated from decoded maps.

Requests are ``{"v": 1, "id": int, "op": str, ...op fields}``; responses are
``{"v": 1, "id": int, "ok": bool, "result": any}`` or ``{..., "ok": false, "error": {"code",
"message"}}``. Unknown fields are ignored; a field of the wrong type is a :class:`BadRequest`
that names it, e.g. ``field 'inputs.x.shape': expected list of ...``.

Request ids are chosen by the client, unique among its requests in flight on one connection,
in ``1 .. 2**64-1``. Id 0 (:data:`CONNECTION_ERROR_ID`) is reserved for error responses that
belong to no request (e.g. the error frame sent before closing a connection with broken framing).

Answers (the daemon keeps these rules; DESIGN §8):

- Every request frame the daemon reads gets exactly one answer before the connection closes:
  a response with the request's id (``ok``, or an error whose ``code`` says why), or, when the
  frame has no usable id (not msgpack, no valid ``id``), an error with id 0. A request that
  fails validation (a bad field, a tensor whose shape or data do not fit) is ``BAD_REQUEST``
  for its own id; the connection goes on. Only a frame that ends the connection (a header
  above the frame limit, a request before authentication, a wrong token) leaves the frames
  sent after it unanswered: the daemon reads no further. ``error.message`` never repeats the
  code (clients show ``CODE: message``).
- A request whose id is still in flight on the connection (its answer not yet on its way) is
  not run, whatever its op: it is answered at once ``BAD_REQUEST`` "request id N is already in flight". That
  refusal is written before the original request's answer, so the peer sees two frames with
  id N: first the refusal, then the original's answer. The clients of this package never
  reuse an id that is in flight.
- On a connection that must authenticate (TCP), the daemon decodes nothing but the ``auth``
  request until it succeeds: any other request is answered ``UNAUTHENTICATED`` (its fields
  unread) and the connection closes.
- Shutting down (drain): requests read while requests are still in flight get
  ``UNAVAILABLE`` (``ping`` and ``status`` still run); the ones in flight finish (or get
  ``UNAVAILABLE`` at the drain timeout). Once a connection has nothing in flight, the daemon
  sends an id-0 ``UNAVAILABLE`` frame ("closing the connection"), then answers ``UNAVAILABLE``
  to every request it still reads until the peer closes its side or a short linger (0.5 s)
  ends, and closes. A peer that gets that frame should send nothing more; a request without an
  answer when the connection closes was never read, so it never ran.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from .framing import ProtocolError
from .meaning import Meaning, MeaningError, meanings_from_wire
from .tensors import ShmResolver, TensorError, decode_tensors, encode_tensor, encode_tensors, shm_tensor

__all__ = [
    "CONNECTION_ERROR_ID",
    "MAX_REQUEST_ID",
    "PROTOCOL_VERSION",
    "AuthRequest",
    "BadRequest",
    "BadResponse",
    "CancelRequest",
    "ErrorCode",
    "ErrorInfo",
    "InferRequest",
    "ListModelsRequest",
    "LoadModelRequest",
    "ShmRegisterRequest",
    "ShmSlot",
    "ShmUnregisterRequest",
    "Op",
    "PingRequest",
    "Request",
    "Response",
    "SchemaError",
    "StatusRequest",
    "UnloadModelRequest",
    "decode_infer_result",
    "encode_infer_result",
    "parse_request",
    "parse_response",
]

PROTOCOL_VERSION = 1
CONNECTION_ERROR_ID = 0
MAX_REQUEST_ID = 2**64 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class ErrorCode(StrEnum):
    BAD_REQUEST = "BAD_REQUEST"
    NOT_FOUND = "NOT_FOUND"
    OVERLOADED = "OVERLOADED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    DEVICE_ERROR = "DEVICE_ERROR"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    UNAUTHENTICATED = "UNAUTHENTICATED"


class Op(StrEnum):
    INFER = "infer"
    LOAD_MODEL = "load_model"
    UNLOAD_MODEL = "unload_model"
    LIST_MODELS = "list_models"
    STATUS = "status"
    CANCEL = "cancel"
    PING = "ping"
    AUTH = "auth"
    SHM_REGISTER = "shm_register"
    SHM_UNREGISTER = "shm_unregister"


class SchemaError(ProtocolError):
    """A decoded map does not match the schema. ``field`` is a dotted path (``inputs.x.shape``)."""

    code: ClassVar[ErrorCode] = ErrorCode.BAD_REQUEST

    def __init__(self, field: str, message: str, request_id: int | None = None) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field
        self.detail = message
        #: The request's id when it could be read, so the error can be answered to that request.
        self.request_id = request_id


class BadRequest(SchemaError):
    """A request failed validation; answer it with ``BAD_REQUEST`` and ``str(exc)``."""


class BadResponse(SchemaError):
    """A response from the server failed validation (a server bug or a foreign peer)."""


# --------------------------------------------------------------------------- field helpers


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is an int subclass and is not accepted as one


def _req_int(msg: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = msg.get(key)
    if not _is_int(value) or not lo <= value <= hi:
        raise SchemaError(key, f"expected int in {lo}..{hi}")
    return value


def _opt_int(msg: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    return default if msg.get(key) is None else _req_int(msg, key, lo, hi)


def _req_str(msg: Mapping[str, Any], key: str) -> str:
    value = msg.get(key)
    if not isinstance(value, str) or not value:
        raise SchemaError(key, "expected non-empty str")
    return value


def _opt_number(msg: Mapping[str, Any], key: str, *, nonnegative: bool = False) -> float | None:
    value = msg.get(key)
    if value is None:
        return None
    if not (_is_int(value) or isinstance(value, float)) or not math.isfinite(value):
        raise SchemaError(key, "expected finite number")
    if nonnegative and value < 0:
        raise SchemaError(key, "expected number >= 0")
    return float(value)


def _opt_str_list(msg: Mapping[str, Any], key: str) -> list[str] | None:
    value = msg.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SchemaError(key, "expected list of str")
    return list(value)


#: A device name on the wire (vkserve.devices.names): ``"cpu"``, ``"vulkan:N"`` or a Vulkan
#: index ``"N"`` (1 to 6 ASCII digits).
_DEVICE_NAME = re.compile(r"(vulkan:)?[0-9]{1,6}|cpu")


def _shown(value: str, limit: int = 32) -> str:
    """``repr(value)``, cut short when long (error messages echo what the peer sent)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def _opt_device_list(msg: Mapping[str, Any], key: str) -> list[str] | None:
    names = _opt_str_list(msg, key)
    for i, name in enumerate(names or ()):
        if not _DEVICE_NAME.fullmatch(name):
            raise SchemaError(key, f"item {i}: {_shown(name)} is not a device name ('cpu', "
                                   "'vulkan:N' or N, 1 to 6 ASCII digits)")
    return names


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class ShmSlot:
    """``size`` bytes at ``offset`` of a registered shared-memory region."""

    region: str
    offset: int
    size: int

    def to_message(self) -> dict[str, Any]:
        """The slot as its wire map."""
        return {"region": self.region, "offset": self.offset, "size": self.size}


@dataclass(frozen=True, slots=True, eq=False)
class InferRequest:
    """Run ``model`` on ``inputs``. Higher ``priority`` runs first.

    ``deadline`` is an absolute unix time (``time.time()`` clock); ``timeout`` is seconds from
    when the server receives the request. Both may be given: the earlier one applies.
    ``outputs`` selects output names (``None`` = all). Decoded ``inputs`` are read-only arrays.

    Shared memory (Unix sockets): ``placed`` names inputs the client already wrote into a
    registered region (at that offset; sent as references, not bytes); ``outputs_shm`` is room
    where the server writes the outputs that fit (the others come inline).
    """

    id: int
    model: str
    inputs: dict[str, npt.NDArray[Any]]
    priority: int = 0
    deadline: float | None = None
    timeout: float | None = None
    outputs: list[str] | None = None
    placed: Mapping[str, ShmSlot] | None = None
    outputs_shm: ShmSlot | None = None
    op: ClassVar[Op] = Op.INFER

    def effective_deadline(self, received_at: float) -> float | None:
        """The absolute unix time by which the answer is due, or ``None`` for no deadline."""
        by_timeout = None if self.timeout is None else received_at + self.timeout
        candidates = [d for d in (self.deadline, by_timeout) if d is not None]
        return min(candidates) if candidates else None

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        msg = _header(self.id, self.op)
        msg["model"] = self.model
        placed = self.placed or {}
        msg["inputs"] = {**encode_tensors({n: a for n, a in self.inputs.items() if n not in placed}),
                         **{n: shm_tensor(np.asarray(self.inputs[n]), slot.region, slot.offset)
                            for n, slot in placed.items()}}
        msg["priority"] = self.priority
        for key in ("deadline", "timeout", "outputs"):
            value = getattr(self, key)
            if value is not None:
                msg[key] = value
        if self.outputs_shm is not None:
            msg["outputs_shm"] = self.outputs_shm.to_message()
        return msg


@dataclass(frozen=True, slots=True)
class ShmRegisterRequest:
    """Register a shared-memory region for this connection's tensors: ``size`` bytes of the
    file descriptor sent with this request's frame (SCM_RIGHTS on the Unix socket), which must
    be a memfd sealed against shrinking (see ``vkserve.client.shm``)."""

    id: int
    name: str
    size: int
    op: ClassVar[Op] = Op.SHM_REGISTER

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        return {**_header(self.id, self.op), "name": self.name, "size": self.size}


@dataclass(frozen=True, slots=True)
class ShmUnregisterRequest:
    id: int
    name: str
    op: ClassVar[Op] = Op.SHM_UNREGISTER

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        return {**_header(self.id, self.op), "name": self.name}


@dataclass(frozen=True, slots=True)
class LoadModelRequest:
    """Load a model from the repository by name; ``devices`` restricts where (``None`` = config):
    device indices as ASCII digits (``"0"``) or ``"cpu"``; anything else is a BadRequest."""

    id: int
    name: str
    devices: list[str] | None = None
    op: ClassVar[Op] = Op.LOAD_MODEL

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        msg = _header(self.id, self.op)
        msg["name"] = self.name
        if self.devices is not None:
            msg["devices"] = self.devices
        return msg


@dataclass(frozen=True, slots=True)
class UnloadModelRequest:
    id: int
    name: str
    op: ClassVar[Op] = Op.UNLOAD_MODEL

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        return {**_header(self.id, self.op), "name": self.name}


@dataclass(frozen=True, slots=True)
class ListModelsRequest:
    id: int
    op: ClassVar[Op] = Op.LIST_MODELS

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        return _header(self.id, self.op)


@dataclass(frozen=True, slots=True)
class StatusRequest:
    id: int
    op: ClassVar[Op] = Op.STATUS

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        return _header(self.id, self.op)


@dataclass(frozen=True, slots=True)
class PingRequest:
    id: int
    op: ClassVar[Op] = Op.PING

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        return _header(self.id, self.op)


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """Cancel request ``target`` of the same connection. The target still gets exactly one
    answer (``CANCELLED``, or its result if it had already finished)."""

    id: int
    target: int
    op: ClassVar[Op] = Op.CANCEL

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        return {**_header(self.id, self.op), "target": self.target}


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """First request on a token-protected (TCP) connection."""

    id: int
    token: str
    op: ClassVar[Op] = Op.AUTH

    def to_message(self) -> dict[str, Any]:
        """The request as the map a frame carries."""
        return {**_header(self.id, self.op), "token": self.token}


Request = (
    InferRequest
    | LoadModelRequest
    | UnloadModelRequest
    | ListModelsRequest
    | StatusRequest
    | PingRequest
    | CancelRequest
    | AuthRequest
    | ShmRegisterRequest
    | ShmUnregisterRequest
)


def _header(request_id: int, op: Op) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "id": request_id, "op": op.value}


def _parse_infer(rid: int, msg: Mapping[str, Any], shm: ShmResolver | None) -> InferRequest:
    model = _req_str(msg, "model")
    try:
        inputs = decode_tensors(msg.get("inputs"), shm)
    except TensorError as exc:
        raise SchemaError(_join("inputs", exc.field), exc.detail) from None
    outputs_shm = None
    if msg.get("outputs_shm") is not None:
        if shm is None:
            raise SchemaError("outputs_shm", "shared memory needs a Unix-socket connection and a "
                                             "registered region")
        outputs_shm = _parse_slot(msg["outputs_shm"], "outputs_shm")
    return InferRequest(
        id=rid,
        model=model,
        inputs=inputs,
        priority=_opt_int(msg, "priority", 0, _INT64_MIN, _INT64_MAX),
        deadline=_opt_number(msg, "deadline"),
        timeout=_opt_number(msg, "timeout", nonnegative=True),
        outputs=_opt_str_list(msg, "outputs"),
        outputs_shm=outputs_shm,
    )


def _parse_slot(value: Any, field: str) -> ShmSlot:
    if not isinstance(value, dict):
        raise SchemaError(field, "expected map with region, offset and size")
    return ShmSlot(_req_str(value, "region"), _req_int(value, "offset", 0, _INT64_MAX),
                   _req_int(value, "size", 0, _INT64_MAX))


_PARSERS: dict[str, Callable[[int, Mapping[str, Any]], Request]] = {
    Op.SHM_REGISTER: lambda rid, m: ShmRegisterRequest(rid, _req_str(m, "name"),
                                                       _req_int(m, "size", 1, _INT64_MAX)),
    Op.SHM_UNREGISTER: lambda rid, m: ShmUnregisterRequest(rid, _req_str(m, "name")),
    Op.LOAD_MODEL: lambda rid, m: LoadModelRequest(rid, _req_str(m, "name"), _opt_device_list(m, "devices")),
    Op.UNLOAD_MODEL: lambda rid, m: UnloadModelRequest(rid, _req_str(m, "name")),
    Op.LIST_MODELS: lambda rid, m: ListModelsRequest(rid),
    Op.STATUS: lambda rid, m: StatusRequest(rid),
    Op.PING: lambda rid, m: PingRequest(rid),
    Op.CANCEL: lambda rid, m: CancelRequest(rid, _req_int(m, "target", 1, MAX_REQUEST_ID)),
    Op.AUTH: lambda rid, m: AuthRequest(rid, _req_str(m, "token")),
}


def _check_version(msg: Mapping[str, Any]) -> None:
    v = msg.get("v")
    if not _is_int(v):
        raise SchemaError("v", "expected int")
    if v != PROTOCOL_VERSION:
        raise SchemaError("v", f"unsupported protocol version {v}; this peer speaks {PROTOCOL_VERSION}")


def parse_request(msg: Mapping[str, Any], shm: ShmResolver | None = None) -> Request:
    """Validate a decoded request map into a typed request, or raise :class:`BadRequest`.

    ``BadRequest.request_id`` carries the id whenever it was valid, so the caller can answer
    that request; otherwise answer with :data:`CONNECTION_ERROR_ID`. ``shm`` resolves tensors
    that refer to the connection's shared-memory regions (None: such tensors are refused).
    """
    raw_id = msg.get("id")
    rid = raw_id if _is_int(raw_id) and 1 <= raw_id <= MAX_REQUEST_ID else None
    try:
        _check_version(msg)
        if rid is None:
            raise SchemaError("id", f"expected int in 1..{MAX_REQUEST_ID}")
        op = msg.get("op")
        if not isinstance(op, str):
            raise SchemaError("op", "expected str")
        if op == Op.INFER:
            return _parse_infer(rid, msg, shm)
        parser = _PARSERS.get(op)
        if parser is None:
            raise SchemaError("op", f"unknown op {op!r}; expected one of {', '.join(o.value for o in Op)}")
        return parser(rid, msg)
    except SchemaError as exc:
        raise BadRequest(exc.field, exc.detail, rid) from None


# --------------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """``code`` is an :class:`ErrorCode`, or the raw string when a newer peer sent an unknown one."""

    code: ErrorCode | str
    message: str


@dataclass(frozen=True, slots=True, eq=False)
class Response:
    id: int
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None

    @classmethod
    def success(cls, request_id: int, result: Any = None) -> Response:
        """``result`` must be msgpack-serialisable (maps with str keys, lists, scalars, bin)."""
        return cls(request_id, True, {} if result is None else result)

    @classmethod
    def failure(cls, request_id: int, code: ErrorCode, message: str) -> Response:
        """An error answer to ``request_id``."""
        return cls(request_id, False, error=ErrorInfo(code, message))

    def to_message(self) -> dict[str, Any]:
        """The response as the map a frame carries."""
        msg: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": self.id, "ok": self.ok}
        if self.ok:
            msg["result"] = self.result
        elif self.error is None:
            raise ValueError("a failed Response needs an error")
        else:
            msg["error"] = {"code": str(self.error.code), "message": self.error.message}
        return msg


def parse_response(msg: Mapping[str, Any]) -> Response:
    """Validate a decoded response map, or raise :class:`BadResponse`."""
    raw_id = msg.get("id")
    rid = raw_id if _is_int(raw_id) and 0 <= raw_id <= MAX_REQUEST_ID else None
    try:
        _check_version(msg)
        if rid is None:
            raise SchemaError("id", f"expected int in 0..{MAX_REQUEST_ID}")
        ok = msg.get("ok")
        if not isinstance(ok, bool):
            raise SchemaError("ok", "expected bool")
        if ok:
            return Response(rid, True, msg.get("result"))
        error = msg.get("error")
        if not isinstance(error, dict):
            raise SchemaError("error", "expected map")
        code, message = error.get("code"), error.get("message")
        if not isinstance(code, str):
            raise SchemaError("error.code", "expected str")
        if not isinstance(message, str):
            raise SchemaError("error.message", "expected str")
        known = code in ErrorCode.__members__
        return Response(rid, False, error=ErrorInfo(ErrorCode(code) if known else code, message))
    except SchemaError as exc:
        raise BadResponse(exc.field, exc.detail, rid) from None


def encode_infer_result(outputs: Mapping[str, npt.ArrayLike], *,
                        placed: Mapping[str, ShmSlot] | None = None, **extra: Any) -> dict[str, Any]:
    """The ``result`` of an infer response: ``{"outputs": {name: tensor}, **extra}``; outputs
    named in ``placed`` were written into a shared-memory region and go as references.

    ``extra`` carries optional metadata (e.g. ``device``, timings); clients ignore what they
    do not know.
    """
    placed = placed or {}
    return {"outputs": {n: shm_tensor(np.asarray(a), placed[n].region, placed[n].offset)
                        if n in placed else encode_tensor(a) for n, a in outputs.items()}, **extra}


@dataclass(frozen=True)
class InferReply:
    """An infer result with the server's timing extras (absent ones are None)."""

    outputs: dict[str, np.ndarray]
    device: str | None = None
    queue_seconds: float | None = None
    run_seconds: float | None = None
    batch_size: int | None = None  # jobs the daemon ran together with this one (itself included)
    # the execution's split of run_seconds: inputs in, the device's run, outputs out
    copy_in_seconds: float | None = None
    device_seconds: float | None = None
    copy_out_seconds: float | None = None
    #: tries the client made (1, or more when a RetryPolicy retried OVERLOADED answers)
    attempts: int = 1
    #: the model's [postprocess]: classes, boxes or a mask, one per item (vkserve.client.meaning)
    meanings: tuple[Meaning, ...] = ()


def decode_infer_reply(result: Any, shm: ShmResolver | None = None) -> InferReply:
    """Outputs plus the optional ``device``/``queue_seconds``/``run_seconds``/``batch_size``
    extras."""
    outputs = decode_infer_result(result, shm)

    def number(key: str) -> float | None:
        value = result.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    device = result.get("device")
    batch = result.get("batch_size")
    try:
        meanings = meanings_from_wire(result.get("postprocess"))
    except MeaningError as exc:
        raise BadResponse("result.postprocess", str(exc)) from None
    return InferReply(outputs, device if isinstance(device, str) else None,
                      number("queue_seconds"), number("run_seconds"),
                      batch if type(batch) is int else None, number("copy_in_seconds"),
                      number("device_seconds"), number("copy_out_seconds"), meanings=meanings)


def decode_infer_result(result: Any, shm: ShmResolver | None = None) -> dict[str, np.ndarray]:
    """Decode the outputs of an infer result, or raise :class:`BadResponse` naming the field.
    Outputs in shared memory (``shm``: the client's regions) are copied out of it."""
    if not isinstance(result, dict):
        raise BadResponse("result", "expected map")
    try:
        outputs = decode_tensors(result.get("outputs"), shm)
        return outputs if shm is None else {n: a.copy() for n, a in outputs.items()}
    except TensorError as exc:
        raise BadResponse(_join("result.outputs", exc.field), exc.detail) from None
