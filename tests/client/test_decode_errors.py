"""Decode errors, sans-I/O (issue 11): every malformed tensor, device name or payload is a
validation error that names the field (never a numpy or int() exception); error codes travel
once; model errors name the file once, by the model's folder."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vkserve.client import BadRequestError, ServerError, Unavailable
from vkserve.client.errors import error_from_info
from vkserve.client.protocol import (
    MAX_NDIM,
    BadRequest,
    ErrorCode,
    ErrorInfo,
    FrameDecoder,
    MalformedFrame,
    TensorError,
    decode_tensor,
    parse_request,
    unpack_payload,
)
from vkserve.client.tensors import MAX_ELEMENTS
from vkserve.models.binfile import read_bin
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import read_param
from vkserve.scheduler import BadInput
from vkserve.scheduler.registry import read_model_folder


def infer_with(tensor: object, rid: int = 3) -> dict:
    return {"v": 1, "id": rid, "op": "infer", "model": "m", "inputs": {"x": tensor}}


@pytest.mark.parametrize("shape", [
    [0, 2**32, 2**32], [0, 2**64 - 1], [2**64 - 1], [0] * 31 + [2**63], [2**16, 2**16 + 1],
    [2**33, 0], [1] * MAX_NDIM + [1],
])
def test_shapes_numpy_refuses_are_bad_requests_for_their_id(shape: list[int]) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request(infer_with({"dtype": "float32", "shape": shape, "data": b""}, rid=11))
    assert info.value.request_id == 11 and info.value.field == "inputs.x.shape"


def test_empty_tensors_with_bounded_dims_still_decode() -> None:
    arr = decode_tensor({"dtype": "float32", "shape": [0, 2**16, 2**16], "data": b""})
    assert arr.shape == (0, 2**16, 2**16) and arr.size == 0
    assert decode_tensor({"dtype": "uint8", "shape": [0, MAX_ELEMENTS], "data": b""}).size == 0


@settings(max_examples=300, deadline=None)
@given(shape=st.lists(st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2, 2**31, 2**32]),
                      max_size=MAX_NDIM + 1),
       dtype=st.sampled_from(["float32", "uint8", "bool", "float64"]),
       data=st.binary(max_size=64))
def test_decode_tensor_raises_only_tensor_errors(shape: list[int], dtype: str, data: bytes) -> None:
    try:
        arr = decode_tensor({"dtype": dtype, "shape": shape, "data": data})
    except TensorError:
        return
    assert list(arr.shape) == shape


@pytest.mark.parametrize("name", ["9" * 5000, "\u0663", "\uff13", "3\n", " 3", "-1", "", "CPU",
                                  "1234567", "0x1"])
def test_device_names_outside_ascii_indices_and_cpu_are_bad_requests(name: str) -> None:
    msg = {"v": 1, "id": 5, "op": "load_model", "name": "m", "devices": ["0", name]}
    with pytest.raises(BadRequest) as info:
        parse_request(msg)
    assert info.value.request_id == 5 and info.value.field == "devices"
    assert "item 1" in str(info.value) and len(str(info.value)) < 200


def test_ascii_device_indices_and_cpu_are_accepted() -> None:
    req = parse_request({"v": 1, "id": 5, "op": "load_model", "name": "m", "devices": ["0", "12", "cpu"]})
    assert req.devices == ["0", "12", "cpu"]


def test_nesting_too_deep_names_the_reason() -> None:
    with pytest.raises(MalformedFrame, match="nested deeper than 1024 levels"):
        unpack_payload(b"\x81\xa1a" + b"\x91" * 2000 + b"\xc0")
    with pytest.raises(MalformedFrame, match="reserved type byte"):
        unpack_payload(b"\xc1")
    decoder = FrameDecoder(1 << 20)  # the stream goes on after it
    payload = msgpack.packb({"ok": 1})
    decoder.feed(struct.pack(">I", 1025) + b"\x91" * 1025 + struct.pack(">I", len(payload)) + payload)
    with pytest.raises(MalformedFrame, match="nested deeper"):
        decoder.next_message()
    assert decoder.next_message() == {"ok": 1}


def test_error_codes_appear_once_in_client_errors() -> None:
    exc = error_from_info(ErrorInfo(ErrorCode.BAD_REQUEST, "field 'x': bad"))
    assert isinstance(exc, BadRequestError)
    assert (exc.code, exc.message, str(exc)) == ("BAD_REQUEST", "field 'x': bad", "BAD_REQUEST: field 'x': bad")
    assert str(error_from_info(ErrorInfo(ErrorCode.UNAVAILABLE, "bye"))) == "UNAVAILABLE: bye"
    assert isinstance(error_from_info(ErrorInfo(ErrorCode.UNAVAILABLE, "bye")), Unavailable)
    assert str(error_from_info(ErrorInfo("NEW_CODE", "m"))) == "NEW_CODE: m"
    assert type(error_from_info(ErrorInfo("NEW_CODE", "m"))) is ServerError
    # The scheduler's error keeps its code apart from its message: the daemon sends .message.
    inner = BadInput("model 'm': unknown input 'y'")
    assert inner.message == "model 'm': unknown input 'y'" and inner.code == "BAD_REQUEST"


def test_model_file_errors_name_the_file_by_its_base_name(tmp_path: Path) -> None:
    param = tmp_path / "model.param"
    param.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(ModelFormatError) as info:
        read_param(param)
    assert info.value.file == "model.param" and str(tmp_path) not in str(info.value)
    with pytest.raises(ModelFormatError) as info:
        read_param(tmp_path / "missing.param")
    assert info.value.file == "missing.param"
    (tmp_path / "model.bin").mkdir()
    with pytest.raises(ModelFormatError) as info:
        read_bin([], tmp_path / "model.bin")
    assert info.value.file == "model.bin" and "cannot read" in str(info.value)


def test_a_broken_model_folder_is_named_once(tmp_path: Path) -> None:
    folder = tmp_path / "garbage"
    folder.mkdir()
    (folder / "model.param").write_bytes(b"\xff\xfe garbage")
    spec = read_model_folder(folder)
    assert spec.error is not None and spec.error.startswith("garbage/model.param: not UTF-8 text")
    assert "//" not in spec.error and str(tmp_path) not in spec.error


def test_numpy_arrays_round_trip_unchanged() -> None:  # the bounds do not touch real tensors
    from vkserve.client.protocol import encode_tensor

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert np.array_equal(decode_tensor(encode_tensor(x)), x)
