"""KServe v2 over HTTP/REST, sans I/O: a whole request in, a whole response out.

No sockets here (``http_server`` moves bytes with h11): :func:`authorize` checks a request's
head, :func:`answer` maps a complete request to its response through the shared
:class:`~vkserve.daemon.kserve.service.KServeService`. Endpoints::

    GET  /v2                                   server metadata
    GET  /v2/health/live | /v2/health/ready    200, or 503 when not ready
    GET  /v2/models/{name}[/versions/{v}]      model metadata
    GET  /v2/models/{name}[/versions/{v}]/ready
    POST /v2/models/{name}[/versions/{v}]/infer
    POST /v2/repository/index                  body {"ready": bool} optional

Infer bodies are JSON, or JSON followed by binary tensors (the binary-data extension: the JSON's
length in ``Inference-Header-Content-Length``, each binary input's length in its
``binary_data_size`` parameter, in input order). Outputs are binary when the request says so
(``binary_data`` on the output, or ``binary_data_output`` on the request), else JSON lists.
The request's ``parameters`` may carry Triton's ``priority`` and ``timeout`` (microseconds).
Errors are ``{"error": "..."}`` with 400 (bad request), 401 (token), 404 (unknown model or
path), 405, 503 (not ready, overloaded, shutting down), 504 (deadline) or 500.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import re
from urllib.parse import unquote

import numpy as np

from vkserve.client.protocol import ErrorCode
from vkserve.daemon.kserve.service import (
    PRIORITY,
    TIMEOUT,
    InferCall,
    InferReply,
    KServeError,
    KServeService,
    ModelMetadata,
    TensorMetadata,
    decode_flat,
    decode_raw,
    request_parameter,
)

__all__ = ["HEADER_LENGTH", "HttpRequest", "HttpResponse", "OutputForm", "answer", "authorize",
           "encode_reply", "error_response", "parse_infer", "status_of"]

#: The binary-data extension's header: bytes of JSON at the start of the body.
HEADER_LENGTH = "inference-header-content-length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"

_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CANCELLED: 499,
    ErrorCode.INTERNAL: 500,
    ErrorCode.DEVICE_ERROR: 500,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
}
_MODEL_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
                         r"(?P<action>/ready|/infer)?$")


def status_of(code: ErrorCode) -> int:
    return _STATUS.get(code, 500)


@dataclasses.dataclass(frozen=True)
class HttpRequest:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]  # names lower-case
    body: bytes = b""

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclasses.dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def json_response(status: int, value: object) -> HttpResponse:
    body = json.dumps(value, separators=(",", ":")).encode()
    return HttpResponse(status, (("content-type", JSON_TYPE),), body)


def error_response(code: ErrorCode, message: str) -> HttpResponse:
    response = json_response(status_of(code), {"error": message})
    if code is ErrorCode.UNAUTHENTICATED:
        response = dataclasses.replace(response, headers=(*response.headers,
                                                          ("www-authenticate", "Bearer")))
    return response


def _empty(status: int) -> HttpResponse:
    return HttpResponse(status, (), b"")


def authorize(headers: tuple[tuple[str, str], ...], token: str | None) -> HttpResponse | None:
    """None when the request may go on (no token needed, or ``Authorization: Bearer <token>``
    carries it), else the 401 to send."""
    if token is None:
        return None
    given = dict(headers).get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return error_response(ErrorCode.UNAUTHENTICATED,
                              "this listener needs a token: send 'Authorization: Bearer <token>'")
    if not hmac.compare_digest(value.strip().encode(), token.encode()):
        return error_response(ErrorCode.UNAUTHENTICATED, "wrong token")
    return None


async def answer(request: HttpRequest, service: KServeService) -> HttpResponse:
    """The response to one complete request; nothing raises out of it but bugs."""
    try:
        return await _route(request, service)
    except KServeError as exc:
        return error_response(exc.code, exc.message)


def _method(request: HttpRequest, allowed: str) -> None:
    if request.method != allowed and not (allowed == "GET" and request.method == "HEAD"):
        raise _MethodNotAllowed(allowed)


class _MethodNotAllowed(Exception):
    def __init__(self, allowed: str) -> None:
        super().__init__(allowed)
        self.allowed = allowed


async def _route(request: HttpRequest, service: KServeService) -> HttpResponse:
    path = request.target.split("?", 1)[0].rstrip("/") or "/"
    try:
        if path == "/v2":
            _method(request, "GET")
            meta = service.server_metadata()
            return json_response(200, {"name": meta.name, "version": meta.version,
                                       "extensions": list(meta.extensions)})
        if path == "/v2/health/live":
            _method(request, "GET")
            return _empty(200 if service.live() else 503)
        if path == "/v2/health/ready":
            _method(request, "GET")
            return _empty(200 if service.ready() else 503)
        if path == "/v2/repository/index":
            _method(request, "POST")
            return _index(request, service)
        match = _MODEL_PATH.match(path)
        if match is None:
            return error_response(ErrorCode.NOT_FOUND, f"no such endpoint: {path} (KServe v2: /v2, "
                                  "/v2/health/{live,ready}, /v2/models/NAME[/ready|/infer], "
                                  "/v2/repository/index)")
        name, version = unquote(match["name"]), unquote(match["version"] or "")
        if match["action"] == "/ready":
            _method(request, "GET")
            return _empty(200 if service.model_ready(name, version) else 503)
        if match["action"] == "/infer":
            _method(request, "POST")
            service.model(name, version)  # an unknown model is 404 whatever the body
            call, form = parse_infer(request, name, version)
            return encode_reply(await service.infer(call), form)
        _method(request, "GET")
        return json_response(200, _metadata_json(await service.model_metadata(name, version)))
    except _MethodNotAllowed as exc:
        response = error_response(ErrorCode.BAD_REQUEST,
                                  f"{request.method} {path}: method not allowed (use {exc.allowed})")
        return dataclasses.replace(response, status=405,
                                   headers=(*response.headers, ("allow", exc.allowed)))


def _metadata_json(meta: ModelMetadata) -> dict[str, object]:
    def tensors(items: tuple[TensorMetadata, ...]) -> list[dict[str, object]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

    return {"name": meta.name, "versions": list(meta.versions), "platform": meta.platform,
            "inputs": tensors(meta.inputs), "outputs": tensors(meta.outputs)}


def _load_json(data: bytes, what: str) -> dict[str, object]:
    try:
        value = json.loads(data) if data.strip() else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise KServeError(ErrorCode.BAD_REQUEST, f"{what}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise KServeError(ErrorCode.BAD_REQUEST, f"{what}: expected a JSON object")
    return value


def _index(request: HttpRequest, service: KServeService) -> HttpResponse:
    body = _load_json(request.body, "repository index request")
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise KServeError(ErrorCode.BAD_REQUEST, "repository index: 'ready' must be a boolean")
    entries = service.repository_index(ready_only=ready)
    return json_response(200, [{"name": e.name, "version": e.version, "state": e.state,
                                "reason": e.reason} for e in entries])


def _parameters(value: object, where: str) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise KServeError(ErrorCode.BAD_REQUEST, f"{where}: 'parameters' must be an object")
    return value


def _split_body(request: HttpRequest) -> tuple[bytes, memoryview]:
    """The JSON part and the binary part of an infer body."""
    if request.header("content-encoding") not in (None, "identity"):
        raise KServeError(ErrorCode.BAD_REQUEST, f"Content-Encoding "
                          f"{request.header('content-encoding')!r} is not supported (send identity)")
    length = request.header(HEADER_LENGTH)
    if length is None:
        return request.body, memoryview(b"")
    if not length.isdigit() or int(length) > len(request.body):
        raise KServeError(ErrorCode.BAD_REQUEST, f"Inference-Header-Content-Length {length!r}: "
                          f"expected a byte count of at most the body's {len(request.body)}")
    n = int(length)
    return request.body[:n], memoryview(request.body)[n:]


def parse_infer(request: HttpRequest, model: str, version: str) -> tuple[InferCall, OutputForm]:
    """An infer request body as an :class:`InferCall` and how its outputs go back
    (BAD_REQUEST naming what is wrong)."""
    head, binary = _split_body(request)
    body = _load_json(head, "infer request")
    raw_inputs = body.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise KServeError(ErrorCode.BAD_REQUEST, "infer request: 'inputs' must be a non-empty list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, item in enumerate(raw_inputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise KServeError(ErrorCode.BAD_REQUEST, f"infer request: inputs[{i}] needs a 'name'")
        name = item["name"]
        if name in inputs:
            raise KServeError(ErrorCode.BAD_REQUEST, f"input '{name}': given twice")
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise KServeError(ErrorCode.BAD_REQUEST, f"input '{name}': 'datatype' must be a string")
        size = _parameters(item.get("parameters"), f"input '{name}'").get("binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0 or offset + size > len(binary):
                raise KServeError(ErrorCode.BAD_REQUEST,
                                  f"input '{name}': binary_data_size {size!r} does not fit the "
                                  f"{len(binary) - offset} bytes of binary data left")
            inputs[name] = decode_raw(name, datatype, item.get("shape"), binary[offset:offset + size])
            offset += size
        elif "data" in item:
            inputs[name] = decode_flat(name, datatype, item.get("shape"), item["data"])
        else:
            raise KServeError(ErrorCode.BAD_REQUEST,
                              f"input '{name}': no 'data' and no binary_data_size parameter")
    if offset != len(binary):
        raise KServeError(ErrorCode.BAD_REQUEST, f"infer request: {len(binary) - offset} bytes of "
                          "binary data that no input's binary_data_size claims")
    parameters = _parameters(body.get("parameters"), "infer request")
    outputs, form = _requested_outputs(body.get("outputs"), parameters.get("binary_data_output") is True)
    rid = body.get("id", "")
    if not isinstance(rid, str):
        raise KServeError(ErrorCode.BAD_REQUEST, "infer request: 'id' must be a string")
    priority, timeout = (request_parameter(n, parameters.get(n, 0)) for n in (PRIORITY, TIMEOUT))
    return InferCall(model, version, rid, inputs, outputs, priority, timeout), form


@dataclasses.dataclass(frozen=True)
class OutputForm:
    """Which outputs go back as binary data: the named ones' own ``binary_data`` parameter,
    else the request's ``binary_data_output`` (False without one)."""

    default: bool = False
    named: tuple[tuple[str, bool], ...] = ()

    def binary(self, name: str) -> bool:
        return dict(self.named).get(name, self.default)


def _requested_outputs(value: object, default: bool) -> tuple[tuple[str, ...] | None, OutputForm]:
    if value is None:
        return None, OutputForm(default)
    if not isinstance(value, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                              for o in value):
        raise KServeError(ErrorCode.BAD_REQUEST,
                          "infer request: 'outputs' must be a list of objects with a 'name'")
    named = tuple((o["name"], _parameters(o.get("parameters"), f"output '{o['name']}'")
                   .get("binary_data", default) is True) for o in value)
    return tuple(n for n, _ in named) or None, OutputForm(default, named)


def encode_reply(reply: InferReply, form: OutputForm) -> HttpResponse:
    outputs: list[dict[str, object]] = []
    blobs: list[bytes] = []
    for t in reply.outputs:
        entry: dict[str, object] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if form.binary(t.name):
            data = t.array.tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            blobs.append(data)
        else:
            entry["data"] = t.array.ravel().tolist()
        outputs.append(entry)
    doc: dict[str, object] = {"model_name": reply.model, "model_version": reply.version,
                              "outputs": outputs}
    if reply.id:
        doc["id"] = reply.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return HttpResponse(200, (("content-type", JSON_TYPE),), head)
    return HttpResponse(200, (("content-type", BINARY_TYPE), (HEADER_LENGTH, str(len(head)))),
                        b"".join([head, *blobs]))
