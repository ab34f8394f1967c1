"""A model's outputs read as its ``[postprocess]`` table says: top-k classes, detected boxes or
a segmentation mask (``vkserve.client.meaning`` holds the types and their wire form).

Boxes and masks come in the pixels of the image the request sent: the preprocessing's
:class:`~vkserve.processing.preprocess.Geometry` undoes the resize and the letterbox. Without
a geometry (a model without ``[preprocess]``) boxes stay in the output's own coordinates and
masks at the output's size.

Detection outputs are rows ``[label, score, x0, y0, x1, y1]`` with corners in [0, 1] of the
model input (ncnn's DetectionOutput / YoloDetectionOutput / Yolov3DetectionOutput layout); the
label is the row's class value (SSD: 0 is the background; YOLO: class + 1), which also indexes
the labels file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vkserve.client.meaning import (
    Box,
    ClassScore,
    Detections,
    Meaning,
    MeaningKind,
    SegmentationMask,
    TopK,
)
from vkserve.processing.config import Postprocess
from vkserve.processing.errors import ProcessingError
from vkserve.processing.preprocess import Geometry

__all__ = ["explain", "top_k", "detections", "segmentation_mask"]


def _problem(model: str, post: Postprocess, array: np.ndarray, wants: str) -> ProcessingError:
    return ProcessingError(f"model '{model}': [postprocess] kind = {post.kind.value!r} needs {wants}; "
                    f"output '{post.output}' has shape {list(array.shape)}")


def top_k(post: Postprocess, scores: np.ndarray, model: str) -> TopK:
    flat = np.squeeze(scores)
    if flat.ndim != 1:
        raise _problem(model, post, scores, "a score vector (one dimension above 1)")
    order = np.argsort(-flat, kind="stable")[:post.top_k]
    return TopK(tuple(ClassScore(i, post.label(i), s)
                      for i, s in zip(order.tolist(), flat[order].tolist())))


def detections(post: Postprocess, rows: np.ndarray, geometry: Geometry | None,
               model: str) -> Detections:
    if rows.size == 0:
        return Detections(())
    if rows.shape[-1] != 6 or rows.ndim > 3 or (rows.ndim == 3 and rows.shape[0] != 1):
        raise _problem(model, post, rows, "rows of [label, score, x0, y0, x1, y1]")
    table = rows.reshape(-1, 6).astype(np.float64)
    kept = table[table[:, 1] >= post.threshold]
    kept = kept[np.argsort(-kept[:, 1], kind="stable")]
    corners = kept[:, 2:6]
    if geometry is not None:
        (th, tw), (top, left) = geometry.target, geometry.offset
        sy, sx = geometry.scale
        h, w = geometry.source
        xs = ((corners[:, [0, 2]] * tw - left) / sx).clip(0, w)
        ys = ((corners[:, [1, 3]] * th - top) / sy).clip(0, h)
        corners = np.stack([xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]], axis=1)
    return Detections(tuple(
        Box(int(row[0]), post.label(int(row[0])), float(row[1]), *map(float, box))
        for row, box in zip(kept, corners, strict=True)))


def segmentation_mask(post: Postprocess, scores: np.ndarray, geometry: Geometry | None,
                      model: str) -> SegmentationMask:
    maps = scores[None] if scores.ndim == 2 else scores
    if maps.ndim != 3:
        raise _problem(model, post, scores, "(classes, height, width) scores")
    if maps.shape[0] == 1:
        mask = (maps[0] >= post.threshold).astype(np.uint8)
    else:
        mask = np.argmax(maps, axis=0).astype(np.uint8 if maps.shape[0] <= 256 else np.uint16)
    if geometry is not None:
        mask = _to_source(mask, geometry)
    return SegmentationMask(np.ascontiguousarray(mask))


def _to_source(mask: np.ndarray, geo: Geometry) -> np.ndarray:
    """The mask (at the output's resolution of the model input) sampled at the source image's
    pixel centres (nearest)."""
    sy, sx = geo.scale

    def index(n_source: int, scale: float, offset: int, target: int, n_mask: int) -> np.ndarray:
        at_input = offset + (np.arange(n_source) + 0.5) * scale
        return np.floor(at_input * n_mask / target).astype(np.intp).clip(0, n_mask - 1)

    rows = index(geo.source[0], sy, geo.offset[0], geo.target[0], mask.shape[0])
    cols = index(geo.source[1], sx, geo.offset[1], geo.target[1], mask.shape[1])
    return mask[rows[:, None], cols[None, :]]


def explain(post: Postprocess, outputs: Mapping[str, np.ndarray],
            geometries: Sequence[Geometry | None], batched: bool, model: str) -> tuple[Meaning, ...]:
    """One meaning per item: ``geometries`` has one entry per item (a client's batch: its
    outputs are stacked along a new first dimension). ``()`` when the postprocessed output was
    not asked for."""
    array = outputs.get(post.output)
    if array is None:
        return ()
    items = list(array) if batched else [array]
    out: list[Meaning] = []
    for item, geo in zip(items, geometries, strict=True):
        if post.kind is MeaningKind.TOPK:
            out.append(top_k(post, item, model))
        elif post.kind is MeaningKind.DETECTION:
            out.append(detections(post, item, geo, model))
        else:
            out.append(segmentation_mask(post, item, geo, model))
    return tuple(out)
