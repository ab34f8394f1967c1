"""KServe v2 over gRPC: ``inference.GRPCInferenceService`` on grpcio's thread-pool server.

ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer (tensors in
``raw_input_contents`` or typed ``contents``; outputs always in ``raw_output_contents``;
Triton's ``priority`` and ``timeout`` request parameters). The
messages are ``proto/inference_pb2`` (our package name, the protocol's field numbers); the
service is registered under the protocol's name with a generic handler, so no generated
``_pb2_grpc`` module is needed.

grpcio runs handlers in its own worker threads; each call goes into the trio loop with
``trio.from_thread.run`` (the daemon's trio token), where the shared
:class:`~vkserve.daemon.kserve.service.KServeService` answers it. The daemon owns the
server's lifetime: the port is bound at start (a taken port stops the daemon before anything
slow), the server starts once the scheduler runs, a drain stops it gracefully (new calls are
refused, calls in flight finish within ``server.drain_timeout``) and the daemon's exit stops it
for good. A non-loopback listener needs ``authorization: Bearer <token>`` metadata.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent import futures
from typing import TypeVar
from urllib.parse import unquote

import grpc
import numpy as np
import trio

from vkserve.client.protocol import ErrorCode
from vkserve.daemon.config import ServerConfig
from vkserve.daemon.kserve.proto import inference_pb2 as pb
from vkserve.daemon.kserve.service import (
    PRIORITY,
    TIMEOUT,
    InferCall,
    KServeError,
    KServeService,
    decode_flat,
    decode_raw,
    numpy_dtype,
    request_parameter,
)
from vkserve.daemon.limits import AuthThrottle, address_key

log = logging.getLogger(__name__)

__all__ = ["SERVICE_NAME", "GrpcFrontend", "bind_grpc"]

SERVICE_NAME = "inference.GRPCInferenceService"
#: Worker threads: calls served at once (an infer holds its thread until its answer).
WORKERS = 32

_CODES: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.OVERLOADED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.DEVICE_ERROR: grpc.StatusCode.INTERNAL,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
}
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_grpc(host: str, port: int, limits: ServerConfig) -> tuple[grpc.Server, int]:
    """A gRPC server bound to ``host:port`` (not started) and the port it got; OSError when the
    address cannot be bound. Messages may be as large as ``server.max_frame_size``."""
    options = [
        ("grpc.so_reuseport", 0),  # a taken port is an error, not a shared one
        ("grpc.max_receive_message_length", limits.max_frame_size),
        ("grpc.max_send_message_length", limits.max_frame_size),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="kserve-grpc"),
                         options=options)
    try:
        bound = server.add_insecure_port(grpc_address(host, port))
    except RuntimeError as exc:  # grpcio raises this for an address it cannot bind
        server.stop(None)
        raise OSError(str(exc)) from None
    if bound == 0:
        server.stop(None)
        raise OSError(f"cannot bind {grpc_address(host, port)}")
    return server, bound


def _peer_address(peer: str) -> str:
    """The source address of grpcio's peer string (``ipv4:1.2.3.4:5``, ``ipv6:%5B::1%5D:5``)."""
    _, _, rest = unquote(peer).partition(":")
    return address_key(rest.rsplit(":", 1)[0].strip("[]"))


def _infer_call(request: pb.ModelInferRequest) -> InferCall:
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise KServeError(ErrorCode.BAD_REQUEST, f"raw_input_contents has {len(raw)} entries for "
                          f"{len(request.inputs)} inputs (one per input, in order)")
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in inputs:
            raise KServeError(ErrorCode.BAD_REQUEST, f"input '{name}': given twice")
        shape = list(tensor.shape)
        if raw:
            inputs[name] = decode_raw(name, tensor.datatype, shape, raw[i])
            continue
        numpy_dtype(name, tensor.datatype)  # an unsupported datatype is refused first
        if tensor.datatype == "FP32":
            values = list(tensor.contents.fp32_contents)
        elif tensor.datatype == "FP64":
            values = list(tensor.contents.fp64_contents)
        elif tensor.datatype == "UINT8":
            values = list(tensor.contents.uint_contents)
        else:
            raise KServeError(ErrorCode.BAD_REQUEST, f"input '{name}': {tensor.datatype} data "
                              "travels in raw_input_contents (it has no typed contents field)")
        inputs[name] = decode_flat(name, tensor.datatype, shape, values)
    outputs = tuple(o.name for o in request.outputs) or None
    priority, timeout = (_int_parameter(request, n) for n in (PRIORITY, TIMEOUT))
    return InferCall(request.model_name, request.model_version, request.id, inputs, outputs,
                     priority, timeout)


def _int_parameter(request: pb.ModelInferRequest, name: str) -> int:
    """An integer request parameter (``uint64_param`` or ``int64_param``, as Triton's clients
    send them), 0 when absent; BAD_REQUEST naming it otherwise."""
    if name not in request.parameters:
        return 0
    parameter = request.parameters[name]
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in ("uint64_param", "int64_param"):
        raise KServeError(ErrorCode.BAD_REQUEST, f"infer request: parameter '{name}' must be an "
                          f"int64_param or uint64_param, got {kind or 'no value'}")
    return request_parameter(name, parameter.uint64_param if kind == "uint64_param"
                             else parameter.int64_param)


class GrpcFrontend:
    """The service's methods as gRPC handlers, each run in the trio loop."""

    def __init__(self, server: grpc.Server, service: KServeService, token: str | None,
                 throttle: AuthThrottle, trio_token: trio.lowlevel.TrioToken) -> None:
        self.server = server
        self.service = service
        self.token = token
        self.throttle = throttle
        self.trio_token = trio_token
        handlers = {
            "ServerLive": self._unary(self._live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": self._unary(self._ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": self._unary(self._model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": self._unary(self._server_metadata, pb.ServerMetadataRequest,
                                          pb.ServerMetadataResponse),
            "ModelMetadata": self._unary(self._model_metadata, pb.ModelMetadataRequest,
                                         pb.ModelMetadataResponse),
            "ModelInfer": self._unary(self._infer, pb.ModelInferRequest, pb.ModelInferResponse),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))

        self._stopped: threading.Event | None = None

    def start(self) -> None:
        self.server.start()

    def begin_stop(self, grace: float) -> None:
        """Refuse new calls; those in flight get ``grace`` seconds, then they are cancelled."""
        self._stopped = self.server.stop(grace)

    async def wait_stopped(self) -> None:
        """Until every call since :meth:`begin_stop` has ended (its answer sent)."""
        assert self._stopped is not None, "begin_stop first"
        await trio.to_thread.run_sync(self._stopped.wait, abandon_on_cancel=True)

    def _unary(self, method: Callable[[Req], Awaitable[Resp]], request_type: type[Req],
               response_type: type[Resp]) -> grpc.RpcMethodHandler:
        def handle(request: Req, context: grpc.ServicerContext) -> Resp:
            scope = trio.CancelScope()
            given = self._bearer(context) if self.token is not None else None

            def cancel() -> None:  # the call ended (answered, cancelled by the client, timed out)
                try:
                    self.trio_token.run_sync_soon(scope.cancel)
                except trio.RunFinishedError:
                    return

            async def run() -> Resp:
                with scope:
                    if self.token is not None:
                        await self._authenticate(_peer_address(context.peer()), given)
                    return await method(request)
                raise KServeError(ErrorCode.CANCELLED, "the call was cancelled by the client")

            context.add_callback(cancel)
            try:
                return trio.from_thread.run(run, trio_token=self.trio_token)
            except KServeError as exc:
                code, message = _CODES.get(exc.code, grpc.StatusCode.INTERNAL), exc.message
            except trio.RunFinishedError:
                code, message = grpc.StatusCode.UNAVAILABLE, "the daemon has stopped"
            context.abort(code, message)
            raise AssertionError("unreachable: context.abort raises")

        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString)

    @staticmethod
    def _bearer(context: grpc.ServicerContext) -> str | None:
        """The token of the call's ``authorization: Bearer <token>`` metadata, if any."""
        for key, value in context.invocation_metadata():
            if key == "authorization" and isinstance(value, str):
                scheme, _, given = value.partition(" ")
                return given.strip() if scheme.lower() == "bearer" else None
        return None

    async def _authenticate(self, address: str, given: str | None) -> None:
        """UNAUTHENTICATED unless ``given`` is the token; wrong tokens from one address are
        throttled as on the native TCP listener."""
        assert self.token is not None
        if not given:
            raise KServeError(ErrorCode.UNAUTHENTICATED, "this listener needs a token: send "
                              "'authorization: Bearer <token>' metadata")
        await self.throttle.acquire(address)
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise KServeError(ErrorCode.UNAUTHENTICATED, "wrong token")
        self.throttle.refund(address)

    # ------------------------------------------------------------------ the methods (trio thread)

    async def _live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    async def _ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    async def _model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, request.version))

    async def _server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        meta = self.service.server_metadata()
        return pb.ServerMetadataResponse(name=meta.name, version=meta.version,
                                         extensions=list(meta.extensions))

    async def _model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = await self.service.model_metadata(request.name, request.version)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta.name, versions=list(meta.versions), platform=meta.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in meta.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in meta.outputs])

    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        reply = await self.service.infer(_infer_call(request))
        tensor = pb.ModelInferResponse.InferOutputTensor
        return pb.ModelInferResponse(
            model_name=reply.model, model_version=reply.version, id=reply.id,
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in reply.outputs],
            raw_output_contents=[t.array.tobytes() for t in reply.outputs])
