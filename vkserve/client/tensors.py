"""Tensors on the wire: ``{"dtype": str, "shape": [int, ...], "data": bin}``, or, on a Unix
socket whose peer registered a shared-memory region, ``{"dtype", "shape", "shm": {"region": str,
"offset": int}}``: the bytes lie in the region (see ``vkserve.client.shm``), not in the frame.

Data is little-endian and C-ordered. Only plain numeric dtypes travel (no object, void,
string or complex kinds), so nothing on the wire can make us unpickle or interpret code.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALLOWED_DTYPES",
    "MAX_ELEMENTS",
    "MAX_NDIM",
    "ShmResolver",
    "TensorError",
    "decode_tensor",
    "decode_tensors",
    "encode_tensor",
    "encode_tensors",
]

#: Wire dtype names (numpy names); every one is stored little-endian.
ALLOWED_DTYPES: frozenset[str] = frozenset(
    {
        "bool",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
    }
)
MAX_NDIM = 32
#: Upper bound on a tensor's element count, and on the product of its non-zero dimensions
#: (which numpy checks even for an empty array): a frame carries at most 2**32 - 1 bytes, so
#: no real tensor comes near it, and every shape within it is one numpy can represent.
MAX_ELEMENTS = 2**32


class TensorError(ValueError):
    """A tensor failed validation. ``field`` names where, relative to the tensor (``""`` = itself)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.detail = message


class ShmResolver(Protocol):
    """The shared-memory regions a tensor may refer to (one side's registered regions)."""

    def view(self, region: str, offset: int, nbytes: int) -> memoryview:
        """``nbytes`` of ``region`` from ``offset``; TensorError naming the field when the
        region is unknown or the range does not lie inside it."""
        ...


def _wire_dtype(name: str) -> np.dtype[Any]:
    return np.dtype(name).newbyteorder("<")


#: the allowed dtypes in the wire's (little-endian) byte order -> their names (numpy works
#: ``dtype.name`` out in Python on every access: ~5 us, per tensor sent)
_WIRE_NAMES: dict[np.dtype[Any], str] = {_wire_dtype(n): n for n in ALLOWED_DTYPES}


def encode_tensor(array: npt.ArrayLike) -> dict[str, Any]:
    """Describe ``array`` as a wire tensor, sharing its memory when it is already C-contiguous
    and little-endian (``data`` is then a memoryview over the array, packed without a copy).

    Non-contiguous arrays are made contiguous and big-endian ones are byte-swapped (copies).
    Raises TensorError for dtypes outside :data:`ALLOWED_DTYPES`.
    """
    arr = np.asarray(array)
    name = _WIRE_NAMES.get(arr.dtype)
    if name is None:  # not an allowed dtype in little-endian order
        name = arr.dtype.name
        if name not in ALLOWED_DTYPES or arr.dtype.fields is not None:
            raise TensorError("dtype", f"unsupported dtype {arr.dtype!s}; allowed: {sorted(ALLOWED_DTYPES)}")
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
            arr = arr.astype(_wire_dtype(name))
    if arr.ndim > MAX_NDIM:
        raise TensorError("shape", f"at most {MAX_NDIM} dimensions, got {arr.ndim}")
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # not ascontiguousarray: that turns 0-d arrays into 1-d
    # A flat uint8 view gives a 'B'-format buffer for every dtype (incl. 0-d and zero-size).
    data = memoryview(arr.reshape(-1).view(np.uint8))
    return {"dtype": name, "shape": list(arr.shape), "data": data}


def shm_tensor(array: npt.NDArray[Any], region: str, offset: int) -> dict[str, Any]:
    """The wire form of ``array`` written at ``offset`` of shared-memory ``region``."""
    return {"dtype": array.dtype.name, "shape": list(array.shape),
            "shm": {"region": region, "offset": offset}}


def decode_tensor(obj: Any, shm: ShmResolver | None = None) -> npt.NDArray[Any]:
    """Turn a wire tensor into a read-only ndarray that shares memory with ``obj["data"]`` (or
    with the shared-memory region it names, through ``shm``).

    Copy the result (``arr.copy()``) if you need to write to it.
    """
    if not isinstance(obj, dict):
        raise TensorError("", f"expected tensor map, got {type(obj).__name__}")
    dtype_name = obj.get("dtype")
    if not isinstance(dtype_name, str):
        raise TensorError("dtype", "expected str")
    if dtype_name not in ALLOWED_DTYPES:
        raise TensorError("dtype", f"unsupported dtype {dtype_name!r}; allowed: {sorted(ALLOWED_DTYPES)}")
    shape = _check_shape(obj.get("shape"))
    dtype = _wire_dtype(dtype_name)
    expected = math.prod(shape) * dtype.itemsize
    ref = obj.get("shm")
    if ref is not None:
        data: Any = _shm_data(ref, expected, shm)
    else:
        data = obj.get("data")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TensorError("data", "expected bin")
    nbytes = memoryview(data).nbytes
    if nbytes != expected:
        raise TensorError("data", f"expected {expected} bytes for shape {shape} {dtype_name}, got {nbytes}")
    try:
        arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    except (ValueError, TypeError) as exc:  # the checks above should make this unreachable
        raise TensorError("shape", f"numpy refused shape {shape}: {exc}") from None
    if dtype_name == "bool" and arr.size and arr.view(np.uint8).max() > 1:
        raise TensorError("data", "bool tensor holds bytes other than 0 and 1")
    return arr


def _shm_data(ref: Any, nbytes: int, shm: ShmResolver | None) -> memoryview:
    if shm is None:
        raise TensorError("shm", "shared memory needs a Unix-socket connection and a region "
                                 "registered on it (op 'shm_register')")
    if not isinstance(ref, dict) or not isinstance(ref.get("region"), str):
        raise TensorError("shm.region", "expected str")
    offset = ref.get("offset")
    if type(offset) is not int or offset < 0:
        raise TensorError("shm.offset", "expected int >= 0")
    return shm.view(ref["region"], offset, nbytes)


def _check_shape(shape: Any) -> list[int]:
    """``shape`` as a list of dims, each and their product bounded (before numpy sees them)."""
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(type(d) is int and d >= 0 for d in shape):
        raise TensorError("shape", f"expected list of at most {MAX_NDIM} non-negative int")
    product = 1
    for d in shape:
        if d > MAX_ELEMENTS:
            raise TensorError("shape", f"dimension {d} above the limit of {MAX_ELEMENTS}")
        product *= d or 1  # zero dims too: numpy still multiplies the others out
        if product > MAX_ELEMENTS:
            raise TensorError("shape", f"the non-zero dimensions of {shape} multiply to more than "
                                       f"{MAX_ELEMENTS}")
    return shape


def encode_tensors(arrays: Mapping[str, npt.ArrayLike]) -> dict[str, dict[str, Any]]:
    """Encode a name → array mapping; a TensorError's field is prefixed with the name."""
    out: dict[str, dict[str, Any]] = {}
    for name, array in arrays.items():
        if not isinstance(name, str):
            raise TensorError("", f"tensor names must be str, got {type(name).__name__}")
        try:
            out[name] = encode_tensor(array)
        except TensorError as exc:
            raise TensorError(_join(name, exc.field), exc.detail) from None
    return out


def decode_tensors(obj: Any, shm: ShmResolver | None = None) -> dict[str, npt.NDArray[Any]]:
    """Decode a name → wire tensor map; a TensorError's field is prefixed with the name."""
    if not isinstance(obj, dict):
        raise TensorError("", f"expected map of name to tensor, got {type(obj).__name__}")
    out: dict[str, npt.NDArray[Any]] = {}
    for name, tensor in obj.items():
        if not isinstance(name, str):
            raise TensorError("", "tensor names must be str")
        try:
            out[name] = decode_tensor(tensor, shm)
        except TensorError as exc:
            raise TensorError(_join(name, exc.field), exc.detail) from None
    return out


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)
