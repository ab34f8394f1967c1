"""An ncnn .bin: every layer's weights in load order, read from the file when they are used.

`read_bin` reads only the storage tags and works out where each weight lies, so a short or
malformed file fails at load, naming the layer and the weight. The values stay in the file:
a layer's `StoredWeights` reads a weight each time it is indexed and keeps nothing, so the
engines, which turn weights into their own layouts layer by layer (the CPU engine's packed bf16
panels, a Vulkan Plan's device buffer), hold one layer's fp32 values at a time instead of the
whole model's (vgg16: 528 MiB of fp32 read whole before its CPU Plan packed any of it).

The file's identity when `read_bin` ran (device, inode, size, modification time) is checked on
every read: a .bin replaced or rewritten since is an error that names it, never other numbers.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
from collections.abc import Iterator, Sequence
from typing import BinaryIO, Protocol, overload

import numpy as np

from vkserve.models.errors import ModelFormatError, Where
from vkserve.models.layers import LayerParams, WeightSpec

log = logging.getLogger(__name__)

TAG_FP32 = 0x00000000
TAG_FP16 = 0x01306B47
TAG_INT8 = 0x000D4B38
TAG_FP32_RAW = 0x0002C056


def _align4(n: int) -> int:
    return (n + 3) & ~3


class Encoding(enum.Enum):
    """How a weight's values are stored."""

    FP32 = "fp32"
    FP16 = "fp16"
    TABLE = "table"  # a 256-entry fp32 table, then one uint8 index per value


@dataclasses.dataclass(frozen=True)
class Stored:
    """Where one weight's values lie: `count` values in `encoding` from byte `offset` (past
    its storage tag, if it has one)."""

    offset: int
    encoding: Encoding
    count: int

    @property
    def nbytes(self) -> int:
        """Bytes in the file, the padding to 4 bytes included."""
        if self.encoding is Encoding.FP32:
            return 4 * self.count
        if self.encoding is Encoding.FP16:
            return _align4(2 * self.count)
        return 1024 + _align4(self.count)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclasses.dataclass(frozen=True)
class BinFile:
    """A .bin as `read_bin` found it."""

    path: str
    identity: tuple[int, int, int, int]

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def read(self, stored: Stored, where: Where, what: str) -> np.ndarray:
        """One weight's values as flat float32 (fp16 and table values widened)."""
        try:
            with open(self.path, "rb") as f:
                if _identity(os.fstat(f.fileno())) != self.identity:
                    raise ModelFormatError.at(
                        where, f"{what}: {self.name} changed since the model was loaded (its size, "
                               f"time or inode differ); reload the model")
                f.seek(stored.offset)
                if stored.encoding is Encoding.FP32:
                    return _read_values(f, "<f4", stored.count, where, what).astype(np.float32, copy=False)
                if stored.encoding is Encoding.FP16:
                    return _read_values(f, "<f2", stored.count, where, what).astype(np.float32)
                table = _read_values(f, "<f4", 256, where, what)
                index = _read_values(f, "u1", stored.count, where, what)
                return table[index].astype(np.float32, copy=False)
        except OSError as exc:
            raise ModelFormatError.at(where, f"{what}: cannot read {self.name}: {exc.strerror}") from exc


def _read_values(f: BinaryIO, dtype: str, count: int, where: Where, what: str) -> np.ndarray:
    """`count` values of `dtype` from the file's position straight into a new array."""
    out = np.empty(count, dtype)
    view = memoryview(out).cast("B")
    done = 0
    while done < out.nbytes:
        got = f.readinto(view[done:])
        if not got:  # checked at load: shorter now means changed while being read
            raise ModelFormatError.at(where, f"{what}: the file ended at offset {f.tell()} while being read")
        done += got
    return out


class StoredWeights(Sequence[np.ndarray]):
    """A layer's weights left in its .bin: each one read when indexed (a fresh float32 array),
    nothing kept."""

    def __init__(self, file: BinFile, where: Where, specs: Sequence[WeightSpec], stored: Sequence[Stored]) -> None:
        self.file = file
        self.where = where
        self.specs = tuple(specs)
        self.stored = tuple(stored)

    def __len__(self) -> int:
        return len(self.stored)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.file.read(self.stored[index], self.where, self.specs[index].name)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    @property
    def elements(self) -> int:
        """Values in all of them, without reading any."""
        return sum(s.count for s in self.stored)


def _locate(f: BinaryIO, size: int, offset: int, spec: WeightSpec, where: Where) -> Stored:
    """Where weight `spec` lies when it starts at `offset` (its tag read; sizes checked)."""

    def need(nbytes: int, what: str) -> None:
        left = size - offset
        if nbytes > left:
            raise ModelFormatError.at(
                where, f"{what}: expected {nbytes} bytes at offset {offset}, only {left} left "
                       f"(file is {size} bytes)")

    if not spec.flagged:
        stored = Stored(offset, Encoding.FP32, spec.count)
        need(stored.nbytes, spec.name)
        return stored
    need(4, f"{spec.name} storage tag")
    f.seek(offset)
    tag = int.from_bytes(f.read(4), "little")
    what = f"{spec.name} ({spec.count} elements, tag 0x{tag:08X})"
    if tag == TAG_INT8:
        raise ModelFormatError.at(where, f"{spec.name}: int8 weights are not supported")
    encoding = (Encoding.FP16 if tag == TAG_FP16 else Encoding.FP32 if tag in (TAG_FP32, TAG_FP32_RAW)
                else Encoding.TABLE)  # any other tag: a quantization table
    offset += 4
    stored = Stored(offset, encoding, spec.count)
    need(stored.nbytes, what)
    return stored


class WeightedLayer(Protocol):
    """What `read_bin` needs of a layer (``models.graph.Layer``, which imports this module)."""

    params: LayerParams
    weights: Sequence[np.ndarray]

    def where(self, file: str) -> Where: ...


def read_bin(layers: Sequence[WeightedLayer], bin_path: str | os.PathLike[str]) -> None:
    """Give each layer `StoredWeights` in the .bin (raises when it is too short or holds a
    weight type the engines do not read)."""
    path = os.fspath(bin_path)
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            file = BinFile(path, _identity(st))
            offset = 0
            for layer in layers:
                where = layer.where(name)
                specs = layer.params.weight_specs()
                stored = []
                for spec in specs:
                    stored.append(_locate(f, st.st_size, offset, spec, where))
                    offset = stored[-1].offset + stored[-1].nbytes
                layer.weights = StoredWeights(file, where, specs, stored)
    except OSError as exc:  # named by its base name, as read_param does
        raise ModelFormatError(name, None, None, f"cannot read: {exc.strerror}") from exc
    if offset != st.st_size:
        log.warning("%s: %d trailing bytes after the last weight are ignored (as ncnn does)",
                    path, st.st_size - offset)
