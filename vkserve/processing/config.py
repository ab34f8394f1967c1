"""The ``[preprocess]`` and ``[postprocess]`` tables of a model's ``config.toml``, validated
into frozen settings at scan time (``vkserve.scheduler.registry`` calls these).

    [preprocess]              # the model accepts images: uint8 HWC / HW arrays, or PNG/JPEG bytes
    input = "data"            # which model input (default: the model's only input)
    pixel_format = "RGB"      # channel order the model expects: "RGB" | "BGR" | "GRAY"
    resize = [H, W]           # target size (default: the input's H, W from model.param/[inputs])
    keep_aspect = false       # true: scale to fit, letterbox-pad the rest with pad_value
    pad_value = 0             # the padding's pixel value, 0..255
    mean = [m0, m1, m2]       # value = (pixel - mean) * norm, per channel (ncnn's convention)
    norm = [n0, n1, n2]       # (one value each for GRAY; defaults 0 and 1)

    [postprocess]
    kind = "topk"             # "topk" | "detection" | "segmentation"
    output = "prob"           # which output (default: the model's only / first output)
    top_k = 5                 # topk: how many classes
    labels = "labels.txt"     # one label per line, line N names class N (in the model folder)
    threshold = 0.5           # detection: minimum score; segmentation of 1 channel: foreground

Every error names the file, the table and the key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from vkserve.client.meaning import MeaningKind
from vkserve.processing.errors import ProcessingError

__all__ = ["PixelFormat", "Postprocess", "Preprocess", "parse_postprocess", "parse_preprocess"]

PRE_KEYS = ("input", "pixel_format", "resize", "keep_aspect", "pad_value", "mean", "norm")
POST_KEYS = ("kind", "output", "top_k", "labels", "threshold")
#: Keys that only one kind reads: giving them for another kind is an error, not ignored.
_KIND_KEYS = {"top_k": (MeaningKind.TOPK,),
              "threshold": (MeaningKind.DETECTION, MeaningKind.SEGMENTATION)}
MAX_SIDE = 16384


class PixelFormat(StrEnum):
    RGB = "RGB"
    BGR = "BGR"
    GRAY = "GRAY"

    @property
    def channels(self) -> int:
        return 1 if self is PixelFormat.GRAY else 3


@dataclasses.dataclass(frozen=True)
class Preprocess:
    input: str
    pixel_format: PixelFormat = PixelFormat.RGB
    size: tuple[int, int] | None = None  # (H, W); None: the image's own size
    keep_aspect: bool = False
    pad_value: int = 0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    norm: tuple[float, ...] = (1.0, 1.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Postprocess:
    kind: MeaningKind
    output: str
    top_k: int = 5
    labels: tuple[str, ...] | None = None
    threshold: float = 0.5

    def label(self, index: int) -> str | None:
        if self.labels is None or not 0 <= index < len(self.labels):
            return None
        return self.labels[index]


class _Table:
    """One table's raw values and how to complain about them."""

    def __init__(self, where: str, table: str, raw: object, known: tuple[str, ...]) -> None:
        self.where = f"{where}: [{table}]"
        if not isinstance(raw, dict):
            raise ProcessingError(f"{where}: '{table}' must be a table ([{table}]), got {raw!r}")
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ProcessingError(f"{self.where}: unknown key(s) {', '.join(map(repr, unknown))} "
                           f"(known: {', '.join(known)})")
        self.raw: dict[str, Any] = raw

    def bad(self, key: str, expected: str) -> ProcessingError:
        return ProcessingError(f"{self.where} key '{key}': expected {expected}, got {self.raw[key]!r}")

    def choice(self, key: str, default: str, options: tuple[str, ...]) -> str:
        value = self.raw.get(key, default)
        if value not in options:
            raise self.bad(key, f"one of {', '.join(map(repr, options))}")
        return value

    def name(self, key: str, names: list[str], what: str, *, first: bool = False) -> str:
        """The value of ``key``, one of ``names``; absent: the only one (or with ``first`` the
        first one)."""
        if key not in self.raw:
            if len(names) == 1 or (first and names):
                return names[0]
            raise ProcessingError(f"{self.where}: key '{key}' is needed: the model has {len(names)} "
                           f"{what}s ({', '.join(names)})")
        value = self.raw[key]
        if value not in names:
            raise self.bad(key, f"one of the model's {what}s ({', '.join(names)})")
        return value

    def finite(self, key: str, default: float) -> float:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.bad(key, "a finite number")
        return float(value)


def parse_preprocess(where: str, raw: object, inputs: Mapping[str, list[int]]) -> Preprocess:
    """``raw`` is the ``[preprocess]`` table; ``inputs`` the model's input shapes as metadata
    shows them (-1: any size; []: any shape), for defaults and checks."""
    t = _Table(where, "preprocess", raw, PRE_KEYS)
    blob = t.name("input", list(inputs), "input")
    fmt = PixelFormat(t.choice("pixel_format", "RGB", tuple(f.value for f in PixelFormat)))
    dims = inputs[blob]
    if dims and len(dims) != 3:
        raise ProcessingError(f"{t.where}: input '{blob}' has shape {dims}; images need a 3-dimensional "
                       "input (channels, height, width)")
    if dims and dims[0] not in (-1, fmt.channels):
        raise ProcessingError(f"{t.where} key 'pixel_format': {fmt.value} gives {fmt.channels} "
                       f"channel(s), input '{blob}' takes {dims[0]} (shape {dims})")
    size: tuple[int, int] | None = None
    if "resize" in t.raw:
        value = t.raw["resize"]
        if not (isinstance(value, list) and len(value) == 2
                and all(type(n) is int and 1 <= n <= MAX_SIDE for n in value)):
            raise t.bad("resize", f"[height, width], each from 1 to {MAX_SIDE}")
        size = (value[0], value[1])
    elif dims and dims[1] > 0 and dims[2] > 0:
        size = (dims[1], dims[2])
    keep_aspect = t.raw.get("keep_aspect", False)
    if not isinstance(keep_aspect, bool):
        raise t.bad("keep_aspect", "true or false")
    if keep_aspect and size is None:
        raise ProcessingError(f"{t.where} key 'keep_aspect': needs a target size (give 'resize', or "
                       f"a fixed height and width for input '{blob}' in [inputs])")
    pad = t.raw.get("pad_value", 0)
    if type(pad) is not int or not 0 <= pad <= 255:
        raise t.bad("pad_value", "an integer pixel value from 0 to 255")

    def per_channel(key: str, default: float) -> tuple[float, ...]:
        value = t.raw.get(key, [default] * fmt.channels)
        if not (isinstance(value, list) and len(value) == fmt.channels and all(
                not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
                for v in value)):
            raise t.bad(key, f"{fmt.channels} number(s), one per {fmt.value} channel")
        return tuple(float(v) for v in value)

    return Preprocess(input=blob, pixel_format=fmt, size=size, keep_aspect=keep_aspect,
                      pad_value=pad, mean=per_channel("mean", 0.0), norm=per_channel("norm", 1.0))


def parse_postprocess(where: str, raw: object, folder: Path,
                      outputs: Mapping[str, tuple[int, ...]]) -> Postprocess:
    """``raw`` is the ``[postprocess]`` table; labels are read from ``folder`` (blocking)."""
    t = _Table(where, "postprocess", raw, POST_KEYS)
    if "kind" not in t.raw:
        raise ProcessingError(f"{t.where}: key 'kind' is needed (one of "
                       f"{', '.join(k.value for k in MeaningKind)})")
    kind = MeaningKind(t.choice("kind", "", tuple(k.value for k in MeaningKind)))
    for key, kinds in _KIND_KEYS.items():
        if key in t.raw and kind not in kinds:
            raise ProcessingError(f"{t.where} key '{key}': applies to kind = "
                           f"{' or '.join(repr(k.value) for k in kinds)} only (this is {kind.value!r})")
    output = t.name("output", list(outputs), "output", first=True)
    top_k = t.raw.get("top_k", 5)
    if type(top_k) is not int or top_k < 1:
        raise t.bad("top_k", "an integer >= 1")
    labels: tuple[str, ...] | None = None
    if "labels" in t.raw:
        name = t.raw["labels"]
        if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
            raise t.bad("labels", "a file name inside the model folder")
        try:
            text = (folder / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ProcessingError(f"{t.where} key 'labels': cannot read {folder.name}/{name}: {exc}") from None
        labels = tuple(line.strip() for line in text.splitlines())
        while labels and not labels[-1]:
            labels = labels[:-1]
        shape = outputs[output]
        classes = _class_count(kind, shape)
        if classes is not None and len(labels) < classes:
            raise ProcessingError(f"{t.where} key 'labels': {folder.name}/{name} has {len(labels)} "
                           f"label(s), output '{output}' (shape {list(shape)}) has {classes} classes")
    return Postprocess(kind=kind, output=output, top_k=top_k, labels=labels,
                       threshold=t.finite("threshold", 0.5))


def _class_count(kind: MeaningKind, shape: tuple[int, ...]) -> int | None:
    """Classes a known output shape has (topk: its elements; segmentation: its channels)."""
    if not shape or any(d < 0 for d in shape):
        return None
    if kind is MeaningKind.TOPK:
        return math.prod(shape)
    if kind is MeaningKind.SEGMENTATION and len(shape) == 3 and shape[0] > 1:
        return shape[0]
    return None
