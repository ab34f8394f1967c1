"""The sans-I/O wire layer: framing, schema validation and tensors (no sockets)."""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vkserve.client.connection import ClientConnection
from vkserve.client.errors import (
    DeadlineExceeded,
    NotFound,
    Overloaded,
    ServerError,
    error_from_info,
)
from vkserve.client.paths import TcpAddress, UnixAddress, client_socket_candidates, default_socket_path, parse_address
from vkserve.client.protocol import (
    ALLOWED_DTYPES,
    DEFAULT_MAX_FRAME_SIZE,
    AuthRequest,
    BadRequest,
    BadResponse,
    CancelRequest,
    ErrorCode,
    ErrorInfo,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    InferRequest,
    ListModelsRequest,
    LoadModelRequest,
    MalformedFrame,
    Op,
    PingRequest,
    ProtocolError,
    Response,
    ShmRegisterRequest,
    ShmUnregisterRequest,
    StatusRequest,
    TensorError,
    UnloadModelRequest,
    decode_infer_result,
    decode_tensor,
    encode_frame,
    encode_infer_result,
    encode_tensor,
    parse_request,
    parse_response,
)


def frame_of_payload(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def decode_all(decoder: FrameDecoder) -> list[dict[str, Any]]:
    return list(decoder)


# ============================================================================ framing


MESSAGES = [
    {"v": 1, "id": 1, "op": "ping"},
    {"v": 1, "id": 2, "op": "status", "nested": {"a": [1, 2.5, None, True], "b": b"\x00\x01"}},
    {"v": 1, "id": 3, "op": "infer", "model": "m", "inputs": {}, "text": "héllo"},
]


def test_frame_header_is_big_endian_length() -> None:
    frame = encode_frame({"a": 1})
    payload = msgpack.packb({"a": 1})
    assert frame == struct.pack(">I", len(payload)) + payload
    assert frame[:4] == len(payload).to_bytes(4, "big")


def test_split_at_every_byte_boundary() -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        got: list[dict[str, Any]] = []
        for part in (stream[:cut], stream[cut:]):
            decoder.feed(part)
            got += decode_all(decoder)
        assert got == MESSAGES, cut
        assert decoder.buffered == 0


def test_byte_at_a_time_and_three_way_splits() -> None:
    stream = b"".join(encode_frame(m) for m in MESSAGES)
    decoder = FrameDecoder()
    got: list[dict[str, Any]] = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        got += decode_all(decoder)
    assert got == MESSAGES
    for a in range(0, len(stream), 3):
        for b in range(a, len(stream), 5):
            decoder = FrameDecoder()
            got = []
            for part in (stream[:a], stream[a:b], stream[b:]):
                decoder.feed(part)
                got += decode_all(decoder)
            assert got == MESSAGES


def test_partial_frame_waits_for_more() -> None:
    frame = encode_frame(MESSAGES[1])
    decoder = FrameDecoder()
    decoder.feed(frame[:-1])
    assert decoder.next_message() is None
    assert decoder.buffered == len(frame) - 1
    decoder.feed(frame[-1:])
    assert decoder.next_message() == MESSAGES[1]


def test_oversized_length_rejected_from_the_header_alone() -> None:
    decoder = FrameDecoder(max_frame_size=1000)
    decoder.feed(b"\x00\x00")  # half a header: nothing to judge yet
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(struct.pack(">I", 1001)[2:])  # completes the header; no payload byte sent
    assert (info.value.size, info.value.limit) == (1001, 1000)
    assert isinstance(info.value, FrameError) and isinstance(info.value, ProtocolError)
    assert decoder.buffered == 0  # nothing of it is kept
    with pytest.raises(FrameTooLarge):  # fatal: the stream cannot be resynchronised
        decoder.feed(encode_frame({"a": 1}))
    with pytest.raises(FrameTooLarge):
        decoder.next_message()


def test_oversized_frame_behind_a_good_one() -> None:
    decoder = FrameDecoder(max_frame_size=100)
    decoder.feed(encode_frame({"a": 1}) + struct.pack(">I", 2**32 - 1))
    assert decoder.next_message() == {"a": 1}
    with pytest.raises(FrameTooLarge):
        decoder.next_message()


def test_frame_exactly_at_limit_is_accepted() -> None:
    payload = msgpack.packb({"d": b"x" * 50})
    decoder = FrameDecoder(max_frame_size=len(payload))
    decoder.feed(frame_of_payload(payload))
    assert decoder.next_message() == {"d": b"x" * 50}


def test_default_limit_is_64_mib() -> None:
    assert DEFAULT_MAX_FRAME_SIZE == 64 * 1024 * 1024
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLarge):
        decoder.feed(struct.pack(">I", DEFAULT_MAX_FRAME_SIZE + 1))


def test_encode_refuses_frames_above_the_limit() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame({"d": b"x" * 200}, max_frame_size=100)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xc1", id="never-used-byte"),
        pytest.param(b"\x92\x01", id="truncated-array"),
        pytest.param(msgpack.packb({"a": 1}) + b"\x01", id="extra-data"),
        pytest.param(b"\xc6\xff\xff\xff\xff", id="bin32-claims-4GiB"),
        pytest.param(b"\xdd\x7f\xff\xff\xff", id="array32-claims-2G-items"),
        pytest.param(b"\x81\xa1\xff\x01", id="invalid-utf8-key"),
        pytest.param(msgpack.packb({1: "int key"}), id="int-map-key"),
        pytest.param(b"\x91" * 5000 + b"\xc0", id="too-deep"),
    ],
)
def test_garbage_payload_is_malformed_and_stream_continues(payload: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(frame_of_payload(payload) + encode_frame({"after": True}))
    with pytest.raises(MalformedFrame):
        decoder.next_message()
    assert decoder.next_message() == {"after": True}


@pytest.mark.parametrize("value", [[1, 2], 7, "str", b"bin", None, 1.5, True])
def test_non_map_payload_is_malformed(value: Any) -> None:
    decoder = FrameDecoder()
    decoder.feed(frame_of_payload(msgpack.packb(value, use_bin_type=True)))
    with pytest.raises(MalformedFrame, match="must be a msgpack map"):
        decoder.next_message()


# ============================================================================ schema


X = {"dtype": "float32", "shape": [2], "data": np.array([1, 2], "<f4").tobytes()}


def infer_msg(**over: Any) -> dict[str, Any]:
    msg = {"v": 1, "id": 7, "op": "infer", "model": "digits", "inputs": {"x": dict(X)}}
    msg.update(over)
    return msg


def test_parse_every_op() -> None:
    base = {"v": 1, "id": 5}
    assert parse_request({**base, "op": "ping"}) == PingRequest(5)
    assert parse_request({**base, "op": "status"}) == StatusRequest(5)
    assert parse_request({**base, "op": "list_models"}) == ListModelsRequest(5)
    assert parse_request({**base, "op": "load_model", "name": "m"}) == LoadModelRequest(5, "m")
    assert parse_request({**base, "op": "load_model", "name": "m", "devices": ["cpu"]}) == LoadModelRequest(
        5, "m", ["cpu"]
    )
    assert parse_request({**base, "op": "unload_model", "name": "m"}) == UnloadModelRequest(5, "m")
    assert parse_request({**base, "op": "cancel", "target": 4}) == CancelRequest(5, 4)
    assert parse_request({**base, "op": "auth", "token": "s3cret"}) == AuthRequest(5, "s3cret")
    assert parse_request({**base, "op": "shm_register", "name": "r", "size": 64}) == ShmRegisterRequest(5, "r", 64)
    assert parse_request({**base, "op": "shm_unregister", "name": "r"}) == ShmUnregisterRequest(5, "r")
    assert {o.value for o in Op} == {
        "infer", "load_model", "unload_model", "list_models", "status", "cancel", "ping", "auth",
        "shm_register", "shm_unregister",
    }


def test_parse_infer_defaults_and_all_fields() -> None:
    req = parse_request(infer_msg())
    assert isinstance(req, InferRequest)
    assert (req.id, req.model, req.priority, req.deadline, req.timeout, req.outputs) == (
        7, "digits", 0, None, None, None
    )
    np.testing.assert_array_equal(req.inputs["x"], [1, 2])
    req = parse_request(infer_msg(priority=-3, deadline=1e9, timeout=2, outputs=["prob"]))
    assert isinstance(req, InferRequest)
    assert (req.priority, req.deadline, req.timeout, req.outputs) == (-3, 1e9, 2.0, ["prob"])
    assert isinstance(req.timeout, float)


def test_effective_deadline_is_the_earlier_one() -> None:
    make = lambda **kw: InferRequest(1, "m", {}, **kw)  # noqa: E731
    assert make().effective_deadline(100.0) is None
    assert make(timeout=5.0).effective_deadline(100.0) == 105.0
    assert make(deadline=103.0).effective_deadline(100.0) == 103.0
    assert make(deadline=103.0, timeout=1.0).effective_deadline(100.0) == 101.0


def test_unknown_fields_are_ignored() -> None:
    req = parse_request(infer_msg(extra={"anything": [1]}, trace_id="abc"))
    assert isinstance(req, InferRequest)
    req2 = parse_request({"v": 1, "id": 1, "op": "ping", "future_flag": True})
    assert req2 == PingRequest(1)


def _x(**over: Any) -> dict[str, Any]:
    return {"x": {**X, **over}}


BAD_REQUESTS = [
    # (message, field, id expected on the error)
    ({"id": 7, "op": "ping"}, "v", 7),
    ({"v": 2, "id": 7, "op": "ping"}, "v", 7),
    ({"v": "1", "id": 7, "op": "ping"}, "v", 7),
    ({"v": 1, "op": "ping"}, "id", None),
    ({"v": 1, "id": 0, "op": "ping"}, "id", None),
    ({"v": 1, "id": -1, "op": "ping"}, "id", None),
    ({"v": 1, "id": True, "op": "ping"}, "id", None),
    ({"v": 1, "id": "7", "op": "ping"}, "id", None),
    ({"v": 1, "id": 2**64, "op": "ping"}, "id", None),
    ({"v": 1, "id": 7}, "op", 7),
    ({"v": 1, "id": 7, "op": 3}, "op", 7),
    ({"v": 1, "id": 7, "op": "reboot"}, "op", 7),
    (infer_msg(model=None), "model", 7),
    (infer_msg(model=5), "model", 7),
    (infer_msg(model=""), "model", 7),
    (infer_msg(inputs=None), "inputs", 7),
    (infer_msg(inputs=[X]), "inputs", 7),
    (infer_msg(inputs={"x": [1, 2]}), "inputs.x", 7),
    (infer_msg(inputs=_x(dtype=None)), "inputs.x.dtype", 7),
    (infer_msg(inputs=_x(dtype="object")), "inputs.x.dtype", 7),
    (infer_msg(inputs=_x(dtype="complex64")), "inputs.x.dtype", 7),
    (infer_msg(inputs=_x(dtype="<f4")), "inputs.x.dtype", 7),
    (infer_msg(inputs=_x(shape=2)), "inputs.x.shape", 7),
    (infer_msg(inputs=_x(shape=[2.0])), "inputs.x.shape", 7),
    (infer_msg(inputs=_x(shape=[True, 2])), "inputs.x.shape", 7),
    (infer_msg(inputs=_x(shape=[-2, -1])), "inputs.x.shape", 7),
    (infer_msg(inputs=_x(shape=[1] * 33, data=X["data"][:4])), "inputs.x.shape", 7),
    (infer_msg(inputs=_x(data=None)), "inputs.x.data", 7),
    (infer_msg(inputs=_x(data="text")), "inputs.x.data", 7),
    (infer_msg(inputs=_x(data=b"\x00" * 7)), "inputs.x.data", 7),
    (infer_msg(inputs=_x(shape=[3])), "inputs.x.data", 7),
    (infer_msg(inputs={"b": {"dtype": "bool", "shape": [2], "data": b"\x01\x02"}}), "inputs.b.data", 7),
    (infer_msg(priority=1.5), "priority", 7),
    (infer_msg(priority=True), "priority", 7),
    (infer_msg(priority=2**63), "priority", 7),
    (infer_msg(deadline="soon"), "deadline", 7),
    (infer_msg(deadline=math.nan), "deadline", 7),
    (infer_msg(deadline=math.inf), "deadline", 7),
    (infer_msg(timeout=-1), "timeout", 7),
    (infer_msg(timeout=False), "timeout", 7),
    (infer_msg(outputs="prob"), "outputs", 7),
    (infer_msg(outputs=[1]), "outputs", 7),
    ({"v": 1, "id": 7, "op": "load_model"}, "name", 7),
    ({"v": 1, "id": 7, "op": "load_model", "name": "m", "devices": "gpu0"}, "devices", 7),
    ({"v": 1, "id": 7, "op": "unload_model", "name": 1}, "name", 7),
    ({"v": 1, "id": 7, "op": "cancel"}, "target", 7),
    ({"v": 1, "id": 7, "op": "cancel", "target": "3"}, "target", 7),
    ({"v": 1, "id": 7, "op": "auth", "token": b"bytes"}, "token", 7),
]


@pytest.mark.parametrize(("msg", "field", "request_id"), BAD_REQUESTS)
def test_schema_errors_name_the_field(msg: dict[str, Any], field: str, request_id: int | None) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request(msg)
    assert info.value.field == field
    assert str(info.value).startswith(f"field {field!r}: ")
    assert info.value.request_id == request_id
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_schema_error_message_format() -> None:
    with pytest.raises(BadRequest, match=r"^field 'inputs\.x\.shape': expected list of"):
        parse_request(infer_msg(inputs=_x(shape="2")))


def test_request_round_trips_through_a_frame() -> None:
    requests = [
        PingRequest(1),
        StatusRequest(2),
        ListModelsRequest(3),
        LoadModelRequest(4, "m", ["0", "cpu"]),  # device indices (ASCII digits) or "cpu"
        UnloadModelRequest(5, "m"),
        CancelRequest(6, 1),
        AuthRequest(7, "tok"),
    ]
    decoder = FrameDecoder()
    decoder.feed(b"".join(encode_frame(r.to_message()) for r in requests))
    assert [parse_request(m) for m in decoder] == requests

    eye = np.eye(3, dtype=np.float16)
    infer = InferRequest(2**64 - 1, "m", {"a": eye}, priority=5, timeout=0.5, outputs=["o"])
    decoder.feed(encode_frame(infer.to_message()))
    got = parse_request(next(decoder))
    assert isinstance(got, InferRequest)
    assert (got.id, got.model, got.priority, got.timeout, got.outputs, got.deadline) == (
        2**64 - 1, "m", 5, 0.5, ["o"], None
    )
    np.testing.assert_array_equal(got.inputs["a"], np.eye(3, dtype=np.float16))


def test_responses_round_trip_and_validate() -> None:
    ok = Response.success(3, encode_infer_result({"y": np.arange(4, dtype=np.int32)}, device="cpu"))
    err = Response.failure(4, ErrorCode.OVERLOADED, "queue full")
    decoder = FrameDecoder()
    decoder.feed(encode_frame(ok.to_message()) + encode_frame(err.to_message()))
    r1, r2 = (parse_response(m) for m in decoder)
    assert r1.ok and r1.id == 3 and r1.result["device"] == "cpu"
    np.testing.assert_array_equal(decode_infer_result(r1.result)["y"], np.arange(4))
    assert not r2.ok and r2.error == ErrorInfo(ErrorCode.OVERLOADED, "queue full")
    assert Response.success(1).to_message() == {"v": 1, "id": 1, "ok": True, "result": {}}


def test_unknown_error_code_is_kept_as_string() -> None:
    r = parse_response({"v": 1, "id": 1, "ok": False, "error": {"code": "QUOTA", "message": "m"}})
    assert r.error == ErrorInfo("QUOTA", "m")
    exc = error_from_info(r.error)
    assert type(exc) is ServerError and exc.code == "QUOTA" and exc.message == "m"


def test_error_codes_map_to_exception_classes() -> None:
    assert {c.value for c in ErrorCode} == {
        "BAD_REQUEST", "NOT_FOUND", "OVERLOADED", "DEADLINE_EXCEEDED", "CANCELLED",
        "DEVICE_ERROR", "UNAVAILABLE", "INTERNAL", "UNAUTHENTICATED",
    }
    for code in ErrorCode:
        exc = error_from_info(ErrorInfo(code, "why"))
        assert isinstance(exc, ServerError) and type(exc) is not ServerError
        assert exc.code is code and exc.message == "why"
    assert isinstance(error_from_info(ErrorInfo(ErrorCode.OVERLOADED, "")), Overloaded)
    assert isinstance(error_from_info(ErrorInfo(ErrorCode.NOT_FOUND, "")), NotFound)
    assert isinstance(error_from_info(ErrorInfo(ErrorCode.DEADLINE_EXCEEDED, "")), DeadlineExceeded)


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        ({"v": 1, "id": 1}, "ok"),
        ({"v": 1, "id": 1, "ok": 1}, "ok"),
        ({"v": 1, "ok": True}, "id"),
        ({"v": 3, "id": 1, "ok": True}, "v"),
        ({"v": 1, "id": 1, "ok": False}, "error"),
        ({"v": 1, "id": 1, "ok": False, "error": {"message": "m"}}, "error.code"),
        ({"v": 1, "id": 1, "ok": False, "error": {"code": "INTERNAL"}}, "error.message"),
    ],
)
def test_bad_responses_name_the_field(msg: dict[str, Any], field: str) -> None:
    with pytest.raises(BadResponse) as info:
        parse_response(msg)
    assert info.value.field == field


def test_bad_infer_result_names_the_field() -> None:
    with pytest.raises(BadResponse, match="'result.outputs.y.data'"):
        decode_infer_result({"outputs": {"y": {"dtype": "int8", "shape": [2], "data": b"\x00"}}})
    with pytest.raises(BadResponse, match="'result.outputs'"):
        decode_infer_result({})


def test_client_connection_ids_and_eof() -> None:
    conn = ClientConnection()
    assert [conn.next_id() for _ in range(3)] == [1, 2, 3]
    frame = encode_frame(Response.success(1, {"x": 1}).to_message())
    conn.receive_data(frame[:5])
    assert conn.next_response() is None
    with pytest.raises(FrameError):
        conn.receive_eof()
    conn.receive_data(frame[5:])
    resp = conn.next_response()
    assert resp is not None and resp.result == {"x": 1}
    conn.receive_eof()


# ============================================================================ tensors


SHAPES = [(), (0,), (3,), (2, 0, 3), (2, 3), (2, 3, 4)]


def sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    if dtype == "bool":
        return (np.arange(n) % 3 == 0).reshape(shape)
    info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
    base = np.linspace(float(info.min) / 2, float(info.max) / 2, n)
    return base.astype(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", sorted(ALLOWED_DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tensor_round_trip_every_dtype(dtype: str, shape: tuple[int, ...]) -> None:
    a = sample(dtype, shape)
    req = InferRequest(1, "m", {"a": a})
    decoder = FrameDecoder()
    decoder.feed(encode_frame(req.to_message()))
    got = parse_request(next(decoder))
    assert isinstance(got, InferRequest)
    b = got.inputs["a"]
    assert b.dtype == np.dtype(dtype) and b.shape == shape
    assert b.tobytes() == a.tobytes()
    assert not b.flags.writeable


@pytest.mark.parametrize("dtype", sorted(ALLOWED_DTYPES))
def test_non_contiguous_and_big_endian_arrays(dtype: str) -> None:
    base = sample(dtype, (4, 6))
    for a in (base.T, base[:, ::2], base[::-1], base.astype(np.dtype(dtype).newbyteorder(">"))):
        t = encode_tensor(a)
        assert t["dtype"] == dtype and t["shape"] == list(a.shape)
        b = decode_tensor({**t, "data": bytes(t["data"])})
        assert b.dtype.byteorder in "<=|"
        np.testing.assert_array_equal(b, a)
        assert b.flags.c_contiguous


def test_encode_shares_memory_with_contiguous_array() -> None:
    a = np.arange(1000, dtype=np.float32).reshape(10, 100)
    t = encode_tensor(a)
    assert isinstance(t["data"], memoryview)
    assert np.shares_memory(np.frombuffer(t["data"], np.uint8), a)


def test_decode_shares_memory_with_received_bytes() -> None:
    a = np.arange(1 << 16, dtype=np.float32)
    decoder = FrameDecoder()
    decoder.feed(encode_frame(InferRequest(1, "m", {"a": a}).to_message()))
    msg = next(decoder)
    data = msg["inputs"]["a"]["data"]
    req = parse_request(msg)
    assert isinstance(req, InferRequest)
    got = req.inputs["a"]
    assert np.shares_memory(got, np.frombuffer(data, np.uint8))
    assert got.base is not None and got.base.base is data  # reshape(view) over frombuffer(data)
    np.testing.assert_array_equal(got, a)


@pytest.mark.parametrize(
    "array",
    [
        np.array([object()], dtype=object),
        np.array([1 + 2j]),
        np.array(["text"]),
        np.zeros(2, dtype=[("a", "<i4")]),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
        np.zeros(1, dtype=np.longdouble) if np.dtype(np.longdouble).itemsize > 8 else np.zeros(1, "V8"),
        np.zeros([1] * 33),
    ],
    ids=["object", "complex", "str", "structured", "datetime", "longdouble", "33-dims"],
)
def test_encode_rejects_unsupported_arrays(array: np.ndarray) -> None:
    with pytest.raises(TensorError):
        encode_tensor(array)


# ============================================================================ addresses


def test_default_socket_path() -> None:
    assert str(default_socket_path({"RUNTIME_DIRECTORY": "/run/vkserve"}, 999)) == "/run/vkserve/vkserve.sock"
    assert str(default_socket_path({"RUNTIME_DIRECTORY": "/run/a:/run/b"}, 0)) == "/run/a/vkserve.sock"
    assert str(default_socket_path({"XDG_RUNTIME_DIR": "/run/user/1000"}, 1000)) == (
        "/run/user/1000/vkserve/vkserve.sock"
    )
    assert str(default_socket_path({}, 0)) == "/run/vkserve/vkserve.sock"
    assert str(default_socket_path({}, 1234)) == "/tmp/vkserve-1234/vkserve.sock"
    cands = client_socket_candidates({"VKSERVE_SOCKET": "/x.sock", "XDG_RUNTIME_DIR": "/r"}, 5)
    assert [str(p) for p in cands] == ["/x.sock", "/r/vkserve/vkserve.sock",
                                       "/run/vkserve/vkserve.sock"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("/run/vkserve/vkserve.sock", UnixAddress("/run/vkserve/vkserve.sock")),
        ("vkserve.sock", UnixAddress("vkserve.sock")),
        ("./a:b.sock", UnixAddress("./a:b.sock")),
        ("unix:///tmp/x.sock", UnixAddress("/tmp/x.sock")),
        ("unix:rel.sock", UnixAddress("rel.sock")),
        ("localhost:7000", TcpAddress("localhost", 7000)),
        ("tcp://10.0.0.2:7000", TcpAddress("10.0.0.2", 7000)),
        ("[::1]:7000", TcpAddress("::1", 7000)),
        ("tcp://[fe80::1]:1", TcpAddress("fe80::1", 1)),
    ],
)
def test_parse_address(spec: str, expected: object) -> None:
    assert parse_address(spec) == expected


@pytest.mark.parametrize("spec", ["", "tcp://host", "tcp://host:0", "host:99999", "tcp://a/b:1", "unix:"])
def test_parse_address_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_address(spec)


# ============================================================================ properties


array_strategy = st.sampled_from(sorted(ALLOWED_DTYPES)).flatmap(
    lambda dt: hnp.arrays(
        np.dtype(dt),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
        elements=None,
    )
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrays=st.dictionaries(st.text(min_size=1, max_size=8), array_strategy, max_size=3),
    priority=st.integers(-(2**63), 2**63 - 1),
    timeout=st.none() | st.floats(0, 1e6),
    request_id=st.integers(1, 2**64 - 1),
    transpose=st.booleans(),
)
def test_property_infer_round_trip(
    arrays: dict[str, np.ndarray], priority: int, timeout: float | None, request_id: int, transpose: bool
) -> None:
    if transpose:
        arrays = {k: v.T for k, v in arrays.items()}
    req = InferRequest(request_id, "model", arrays, priority=priority, timeout=timeout)
    decoder = FrameDecoder()
    decoder.feed(encode_frame(req.to_message()))
    got = parse_request(next(decoder))
    assert isinstance(got, InferRequest)
    assert (got.id, got.priority, got.timeout) == (request_id, priority, timeout)
    assert got.inputs.keys() == arrays.keys()
    for name, a in arrays.items():
        b = got.inputs[name]
        assert b.dtype == a.dtype.newbyteorder("=") and b.shape == a.shape
        assert b.tobytes() == np.ascontiguousarray(a).tobytes()  # bit-exact, NaNs included


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=6))
def test_property_decoder_raises_only_its_own_errors(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_frame_size=200)
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    try:
        for lo, hi in zip(bounds, bounds[1:]):
            decoder.feed(data[lo:hi])
            while True:
                try:
                    msg = decoder.next_message()
                except MalformedFrame:
                    continue
                if msg is None:
                    break
                assert isinstance(msg, dict)
    except FrameTooLarge:
        pass


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["v", "id", "op", "model", "inputs", "priority", "deadline", "timeout", "outputs", "name",
          "devices", "target", "token", "ok", "result", "error"]
tensor_like = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from([*sorted(ALLOWED_DTYPES), "object", "c8"]) | msgpack_values,
        "shape": st.lists(st.integers(-2, 4), max_size=4) | msgpack_values,
        "data": st.binary(max_size=64) | msgpack_values,
    },
)
request_like = st.fixed_dictionaries(
    {
        "v": st.just(1) | msgpack_values,
        "id": st.integers(-1, 3) | msgpack_values,
        "op": st.sampled_from([o.value for o in Op]) | msgpack_values,
    },
    optional={
        **{f: msgpack_values for f in FIELDS[3:]},
        "inputs": st.dictionaries(st.text(max_size=4), tensor_like | msgpack_values, max_size=3),
        "error": st.fixed_dictionaries({}, optional={"code": st.text(max_size=5), "message": msgpack_values}),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=request_like)
def test_property_validation_raises_only_schema_errors(msg: dict[str, Any]) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(msg))
    wire = next(decoder)  # what a server really sees
    try:
        parse_request(wire)
    except BadRequest as exc:
        assert exc.field
    try:
        parse_response(wire)
    except BadResponse as exc:
        assert exc.field
