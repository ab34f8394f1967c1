"""What a model's outputs mean, as the daemon's ``[postprocess]`` table computes it, and its
wire form (sans-I/O; shared by the daemon and the clients).

An infer result of a model with ``[postprocess]`` carries ``"postprocess"``: a list with one
map per item (one for a plain request, N for a client's batch of N), each one of

- ``{"kind": "topk", "classes": [[index, label, score], ...]}`` (best first; ``label`` is nil
  without a labels file);
- ``{"kind": "detection", "boxes": [[index, label, score, x0, y0, x1, y1], ...]}`` (scores at
  or above the threshold, best first; pixels of the image the request sent);
- ``{"kind": "segmentation", "mask": tensor}`` (per-pixel class index, uint8 or uint16, H x W).

Older clients ignore the field; a request that leaves the postprocessed output out (``outputs``)
gets none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from .tensors import ShmResolver, TensorError, decode_tensor, encode_tensor

__all__ = ["Box", "ClassScore", "Detections", "Meaning", "MeaningKind", "SegmentationMask", "TopK",
           "MeaningError", "meanings_from_wire", "meanings_to_wire"]


class MeaningKind(StrEnum):
    TOPK = "topk"
    DETECTION = "detection"
    SEGMENTATION = "segmentation"


class MeaningError(ValueError):
    """A ``postprocess`` field that does not match the schema (names the item and field)."""


@dataclass(frozen=True, slots=True)
class ClassScore:
    index: int
    label: str | None
    score: float


@dataclass(frozen=True, slots=True)
class TopK:
    classes: tuple[ClassScore, ...]
    kind = MeaningKind.TOPK


@dataclass(frozen=True, slots=True)
class Box:
    """A detected object: class ``index`` (the model's label value), its label, the score and
    the corners in pixels of the image the request sent."""

    index: int
    label: str | None
    score: float
    x0: float
    y0: float
    x1: float
    y1: float


@dataclass(frozen=True, slots=True)
class Detections:
    boxes: tuple[Box, ...]
    kind = MeaningKind.DETECTION


@dataclass(frozen=True, slots=True, eq=False)
class SegmentationMask:
    mask: np.ndarray  # (H, W) class index per pixel
    kind = MeaningKind.SEGMENTATION


Meaning = TopK | Detections | SegmentationMask


def meanings_to_wire(meanings: tuple[Meaning, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in meanings:
        if isinstance(m, TopK):
            out.append({"kind": m.kind.value,
                        "classes": [[c.index, c.label, c.score] for c in m.classes]})
        elif isinstance(m, Detections):
            out.append({"kind": m.kind.value,
                        "boxes": [[b.index, b.label, b.score, b.x0, b.y0, b.x1, b.y1]
                                  for b in m.boxes]})
        else:
            out.append({"kind": m.kind.value, "mask": encode_tensor(m.mask)})
    return out


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MeaningError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _index(value: object, where: str) -> int:
    if type(value) is not int:
        raise MeaningError(f"{where}: expected an int, got {value!r}")
    return value


def _label(value: object, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MeaningError(f"{where}: expected a str or nil, got {value!r}")
    return value


def _rows(item: dict[str, Any], key: str, width: int, where: str) -> list[list[Any]]:
    rows = item.get(key)
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == width
                                             for r in rows):
        raise MeaningError(f"{where}.{key}: expected a list of {width}-element lists")
    return rows


def meanings_from_wire(value: object, shm: ShmResolver | None = None) -> tuple[Meaning, ...]:
    """Decode a result's ``postprocess`` field (absent: ``()``), or raise MeaningError."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MeaningError("postprocess: expected a list")
    out: list[Meaning] = []
    for i, item in enumerate(value):
        where = f"postprocess[{i}]"
        if not isinstance(item, dict):
            raise MeaningError(f"{where}: expected a map")
        kind = item.get("kind")
        if kind == MeaningKind.TOPK:
            out.append(TopK(tuple(
                ClassScore(_index(r[0], f"{where}.classes[{j}]"), _label(r[1], f"{where}.classes[{j}]"),
                           _number(r[2], f"{where}.classes[{j}]"))
                for j, r in enumerate(_rows(item, "classes", 3, where)))))
        elif kind == MeaningKind.DETECTION:
            out.append(Detections(tuple(
                Box(_index(r[0], f"{where}.boxes[{j}]"), _label(r[1], f"{where}.boxes[{j}]"),
                    *(_number(v, f"{where}.boxes[{j}]") for v in r[2:]))
                for j, r in enumerate(_rows(item, "boxes", 7, where)))))
        elif kind == MeaningKind.SEGMENTATION:
            try:
                mask = decode_tensor(item.get("mask"), shm)
            except TensorError as exc:
                raise MeaningError(f"{where}.mask: {exc}") from None
            if mask.ndim != 2:
                raise MeaningError(f"{where}.mask: expected 2 dimensions, got shape {mask.shape}")
            out.append(SegmentationMask(mask))
        else:
            raise MeaningError(f"{where}.kind: expected one of "
                               f"{', '.join(k.value for k in MeaningKind)}, got {kind!r}")
    return tuple(out)
