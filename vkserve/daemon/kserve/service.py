"""The Open Inference Protocol (KServe v2) over the scheduler: what the HTTP and gRPC front ends share.

Both front ends turn their wire form into the dataclasses here and back; the answers and the
checks (datatypes, tensor sizes, model names, readiness) are made once, in :class:`KServeService`.

- Tensors: ``FP32``; ``FP16`` and ``FP64`` are accepted and converted by the scheduler as the
  native protocol's are (``scheduler.jobs.validate_inputs``); any other datatype is a
  ``BAD_REQUEST`` naming the tensor. Outputs are ``FP32``.
- Batches: an input with one leading dimension more than the model's is a client batch
  (the scheduler's rule); the outputs then carry the batch dimension too. Model metadata shows
  that dimension as Triton does (a leading ``-1``) when the model batches (``max_batch_size`` > 1
  and every input of known rank); inputs without it are still accepted as one item.
- Versions: a model has one version, ``"1"``; another version is ``NOT_FOUND``.
- Request parameters (Triton's): ``priority`` is a level, 1 the highest, 0 or none the default;
  level ``p`` runs at the scheduler's priority ``-p`` (higher runs first), a request without one
  at ``scheduler.default_priority`` (so ``default_priority = -N`` makes ``N`` the default level,
  as Triton's ``default_priority_level``). ``timeout`` is in microseconds from when the request
  arrived (0 or none: no timeout) and becomes the scheduler's deadline; a request that misses it
  is ``DEADLINE_EXCEEDED`` (HTTP 504, gRPC DEADLINE_EXCEEDED), never a late answer.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Protocol

import numpy as np
import trio

from vkserve.client.protocol import ErrorCode
from vkserve.daemon.backend import Backend
from vkserve.daemon.connection import DEADLINE_GRACE
from vkserve.scheduler import InferResult, ModelInfo, ModelState, SchedulerError

__all__ = [
    "DATATYPES",
    "MODEL_VERSION",
    "PLATFORM",
    "IndexEntry",
    "InferCall",
    "InferReply",
    "KServeError",
    "KServeHost",
    "KServeService",
    "ModelMetadata",
    "OutputTensor",
    "ServerMetadata",
    "TensorMetadata",
    "decode_flat",
    "decode_raw",
    "request_parameter",
]

PLATFORM = "vkserve"
MODEL_VERSION = "1"
SERVER_NAME = "vkserve"
#: KServe v2 extensions this server implements.
EXTENSIONS = ("binary_tensor_data",)
#: Accepted input datatypes (KServe names) -> their numpy dtype (little-endian).
DATATYPES: dict[str, np.dtype] = {
    "FP32": np.dtype("<f4"),
    "FP16": np.dtype("<f2"),
    "FP64": np.dtype("<f8"),
    "UINT8": np.dtype("u1"),  # images, for a model with [preprocess] (vkserve.processing)
}
OUTPUT_DATATYPE = "FP32"
#: The infer request parameters that :class:`InferCall` carries (Triton's names).
PRIORITY, TIMEOUT = "priority", "timeout"
_UINT64_MAX = 2**64 - 1


class KServeError(Exception):
    """A request that fails: the front end answers with ``code``'s status and ``message``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: any size


@dataclasses.dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclasses.dataclass(frozen=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class IndexEntry:
    """One model of ``POST /v2/repository/index``."""

    name: str
    version: str
    state: str  # READY, LOADING, UNAVAILABLE (Triton's names)
    reason: str


@dataclasses.dataclass(frozen=True)
class InferCall:
    """One decoded infer request."""

    model: str
    version: str  # "" = the model's only version
    id: str
    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...] | None  # None: every output
    priority: int = 0  # Triton's level: 1 the highest, 0 the default
    timeout_us: int = 0  # microseconds from arrival; 0: none

    def scheduler_priority(self) -> int | None:
        """The scheduler's priority (higher first) of the level; None: the default."""
        return -self.priority if self.priority else None


@dataclasses.dataclass(frozen=True)
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray  # C-contiguous, the datatype's little-endian dtype


@dataclasses.dataclass(frozen=True)
class InferReply:
    model: str
    version: str
    id: str
    outputs: tuple[OutputTensor, ...]


class KServeHost(Protocol):
    """What the front ends need of the daemon (``vkserve.daemon.server.Server``)."""

    backend: Backend
    version: str
    draining: bool
    requests_done: int

    def readiness(self) -> tuple[bool, str]: ...

    def observe_infer(self, model: str, result: InferResult | None, outcome: str,
                      total: float) -> None: ...


def numpy_dtype(tensor: str, datatype: str) -> np.dtype:
    """The dtype of an accepted datatype, else BAD_REQUEST naming the tensor."""
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        raise KServeError(ErrorCode.BAD_REQUEST,
                          f"input '{tensor}': datatype {datatype!r} is not supported (send FP32; "
                          f"FP16 and FP64 are converted; UINT8 images for a model with [preprocess])")
    return dtype


def _check_shape(tensor: str, shape: object) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
        raise KServeError(ErrorCode.BAD_REQUEST,
                          f"input '{tensor}': shape must be a list of sizes >= 0, got {shape!r}")
    return tuple(shape)


def decode_raw(tensor: str, datatype: str, shape: object, raw: bytes | bytearray | memoryview) -> np.ndarray:
    """A tensor from its raw little-endian, row-major bytes (HTTP binary data, gRPC raw contents)."""
    dtype = numpy_dtype(tensor, datatype)
    dims = _check_shape(tensor, shape)
    want = math.prod(dims) * dtype.itemsize
    if len(raw) != want:
        raise KServeError(ErrorCode.BAD_REQUEST,
                          f"input '{tensor}': {len(raw)} bytes of data for shape {list(dims)} of "
                          f"{datatype} ({want} bytes expected)")
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def decode_flat(tensor: str, datatype: str, shape: object, data: object) -> np.ndarray:
    """A tensor from its values as a (flat or nested) list of numbers (JSON, gRPC contents)."""
    dtype = numpy_dtype(tensor, datatype)
    dims = _check_shape(tensor, shape)
    try:
        array = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        raise KServeError(ErrorCode.BAD_REQUEST,
                          f"input '{tensor}': data must be a list of numbers "
                          f"(in {datatype}'s range)") from None
    if array.size != math.prod(dims):
        raise KServeError(ErrorCode.BAD_REQUEST,
                          f"input '{tensor}': {array.size} values for shape {list(dims)} "
                          f"({math.prod(dims)} expected)")
    return array.reshape(dims)


def request_parameter(name: str, value: object) -> int:
    """The ``priority`` or ``timeout`` parameter of an infer request as an integer of 0 or
    more, else BAD_REQUEST naming it."""
    if type(value) is not int or not 0 <= value <= _UINT64_MAX:
        unit = " (microseconds)" if name == TIMEOUT else ""
        raise KServeError(ErrorCode.BAD_REQUEST, f"infer request: parameter '{name}'{unit} must be "
                          f"an integer of 0 or more, got {value!r}")
    return value


def _state(info: ModelInfo) -> tuple[str, str]:
    """Triton's repository state and reason of a model."""
    if info.state is ModelState.READY:
        return "READY", ""
    if info.state is ModelState.LOADING:
        return "LOADING", ""
    return "UNAVAILABLE", info.error or str(info.state)


class KServeService:
    """The protocol's operations on the daemon's scheduler (one instance for both front ends)."""

    def __init__(self, host: KServeHost) -> None:
        self.host = host
        #: Infer calls in flight, each with its cancel scope (a drain timeout cancels them).
        self.calls: set[trio.CancelScope] = set()

    def abort_in_flight(self) -> None:
        """The drain timed out: every call in flight ends now, answered UNAVAILABLE."""
        for scope in list(self.calls):
            scope.cancel()

    # ------------------------------------------------------------------ health and metadata

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.host.readiness()[0]

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(SERVER_NAME, self.host.version, EXTENSIONS)

    def model(self, name: str, version: str = "") -> ModelInfo:
        """The model's report, or NOT_FOUND naming the known models (or the versions)."""
        models = self.host.backend.models()
        for info in models:
            if info.name == name:
                if version not in ("", MODEL_VERSION):
                    raise KServeError(ErrorCode.NOT_FOUND,
                                      f"model '{name}' has no version {version!r} (versions: "
                                      f"{MODEL_VERSION})")
                return info
        raise KServeError(ErrorCode.NOT_FOUND, f"no model '{name}' (models: "
                          f"{', '.join(m.name for m in models) or 'none'})")

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.model(name, version).state is ModelState.READY and not self.host.draining

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        info = self.model(name, version)
        batched = info.max_batch_size > 1 and bool(info.inputs) and all(info.inputs.values())
        lead = (-1,) if batched else ()

        def tensors(shapes: dict[str, list[int]], datatype: str) -> tuple[TensorMetadata, ...]:
            return tuple(TensorMetadata(n, datatype, (*lead, *dims)) for n, dims in shapes.items())

        return ModelMetadata(info.name, (MODEL_VERSION,), PLATFORM,
                             tensors(info.inputs, OUTPUT_DATATYPE), tensors(info.outputs, OUTPUT_DATATYPE))

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries = []
        for info in self.host.backend.models():
            state, reason = _state(info)
            if not ready_only or state == "READY":
                entries.append(IndexEntry(info.name, MODEL_VERSION, state, reason))
        return entries

    # ------------------------------------------------------------------ inference

    async def infer(self, call: InferCall) -> InferReply:
        """Run ``call`` on the scheduler; KServeError (with the scheduler's code) on failure."""
        self.model(call.model, call.version)  # NOT_FOUND before anything else
        if self.host.draining:
            raise KServeError(ErrorCode.UNAVAILABLE, "the daemon is shutting down")
        started = time.time()
        deadline = started + call.timeout_us / 1e6 if call.timeout_us else None
        # past the deadline (and a grace for the scheduler's own answer) the call ends here
        late = trio.current_time() + call.timeout_us / 1e6 + DEADLINE_GRACE if call.timeout_us else math.inf
        result: InferResult | None = None
        outcome = ErrorCode.CANCELLED.value.lower()  # unless it ends otherwise
        scope = trio.CancelScope()
        self.calls.add(scope)
        try:
            with scope, trio.move_on_at(late) as timer:
                result = await self.host.backend.infer(
                    call.model, call.inputs, priority=call.scheduler_priority(), deadline=deadline,
                    outputs=None if call.outputs is None else list(call.outputs))
                outcome = "ok"
            if timer.cancelled_caught:
                outcome = ErrorCode.DEADLINE_EXCEEDED.value.lower()
                raise KServeError(ErrorCode.DEADLINE_EXCEEDED, f"model '{call.model}': no result "
                                  f"within the request's timeout ({call.timeout_us} us)")
            if scope.cancelled_caught:
                outcome = ErrorCode.UNAVAILABLE.value.lower()
        except SchedulerError as exc:
            outcome = exc.code.value.lower()
            raise KServeError(exc.code, exc.message) from None
        finally:
            self.calls.discard(scope)
            self.host.requests_done += 1
            self.host.observe_infer(call.model, result, outcome, time.time() - started)
        if result is None:  # only a drain timeout cancels this scope
            raise KServeError(ErrorCode.UNAVAILABLE,
                              "the daemon is shutting down (drain timeout): the call was cancelled")
        outputs = tuple(
            OutputTensor(name, OUTPUT_DATATYPE, tuple(array.shape),
                         np.ascontiguousarray(array, dtype=DATATYPES[OUTPUT_DATATYPE]))
            for name, array in result.outputs.items())
        return InferReply(call.model, MODEL_VERSION, call.id, outputs)
