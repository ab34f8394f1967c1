"""Yolov3DetectionOutput as ncnn defines it: decode YOLO heads, sort by confidence, greedy NMS.

The layer is sequential post-processing, so its definition is this numpy (fp32) code: the CPU
engine runs it as the layer's kernel, and the Vulkan engine decodes on the GPU with the same
per-head constants (`heads`) and finishes on the host, or runs `detect` where its shaders
cannot take the layer.

The confidence is ncnn's formula as it actually computes it (checked against the ncnn package):
``1 / (1 + exp(-objectness) * (1 + exp(-max_class_logit)))``, which is not the product of the
two sigmoids its comment suggests. Candidates are sorted by confidence (stable: ties keep
their anchor order, heads in input order) and suppressed class-agnostically when their
float32 IoU with a kept box exceeds ``nms_threshold``.

Output rows are (label + 1, confidence, xmin, ymin, xmax, ymax) in [0, 1] image coordinates
(ncnn's layout); the row count depends on the data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from vkserve.models.layers import Shape, Yolov3DetectionOutputParams

NMS_BLOCK = 512


@dataclasses.dataclass(frozen=True)
class Head:
    """Decode constants of one input head of shape (num_box * (5 + num_class), h, w)."""

    h: int
    w: int
    base: int  # the head's first anchor index in the concatenation of all heads' anchors
    bias_w: np.ndarray  # (num_box,) anchor widths and heights, float32
    bias_h: np.ndarray
    net_w: int  # the network input size the anchors are relative to
    net_h: int


def heads(p: Yolov3DetectionOutputParams, in_shapes: Sequence[Shape]) -> list[Head]:
    """Per input head: its anchors (``mask`` entries b * num_box ...) and network size
    (``int(anchors_scale[b] * w)`` in float32, as ncnn). The shapes must have passed
    ``p.infer_shapes``."""
    biases = np.asarray(p.biases, dtype=np.float32)
    mask = np.asarray(p.mask, dtype=np.float32).astype(np.int64)
    scales = np.asarray(p.anchors_scale, dtype=np.float32)
    out, base = [], 0
    for b, (_, h, w) in enumerate(in_shapes):
        anchor = mask[b * p.num_box:(b + 1) * p.num_box]
        out.append(Head(h, w, base, biases[anchor * 2], biases[anchor * 2 + 1],
                        int(scales[b] * np.float32(w)), int(scales[b] * np.float32(h))))
        base += p.num_box * h * w
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def decode(p: Yolov3DetectionOutputParams, head: Head, x: np.ndarray) -> np.ndarray:
    """The rows of one head whose confidence passes the threshold, in anchor order."""
    h, w = head.h, head.w
    x = x.reshape(p.num_box, 5 + p.num_class, h, w)
    cls = x[:, 5:]
    label = cls.argmax(axis=1)
    with np.errstate(over="ignore"):
        # ncnn's expression, parenthesised as it ships:
        # 1 / (1 + exp(-box) * (1 + exp(-class))), not sigmoid(box) * sigmoid(class)
        conf = 1.0 / (1.0 + np.exp(-x[:, 4]) * (1.0 + np.exp(-cls.max(axis=1))))
    keep = conf >= np.float32(p.confidence_threshold)
    gy, gx = np.mgrid[0:h, 0:w].astype(np.float32)
    cx = (gx + _sigmoid(x[:, 0])) / np.float32(w)
    cy = (gy + _sigmoid(x[:, 1])) / np.float32(h)
    with np.errstate(over="ignore"):
        bw = np.exp(x[:, 2]) * head.bias_w[:, None, None] / np.float32(head.net_w)
        bh = np.exp(x[:, 3]) * head.bias_h[:, None, None] / np.float32(head.net_h)
    det = np.stack(
        [label + 1.0, conf, cx - bw * 0.5, cy - bh * 0.5, cx + bw * 0.5, cy + bh * 0.5], axis=-1
    )
    return det[keep].astype(np.float32)


def overlaps(a: np.ndarray, area_a: np.ndarray, b: np.ndarray, area_b: np.ndarray,
             threshold: float) -> np.ndarray:
    """(len(a), len(b)) mask of IoU(a_i, b_j) > threshold, in float32 as ncnn computes it
    (intersection 0 when the boxes do not overlap, then inter / union). In place where
    possible: this matrix is most of the layer's time when thousands of boxes pass."""
    iw = np.minimum(a[:, None, 2], b[None, :, 2])
    iw -= np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3])
    ih -= np.maximum(a[:, None, 1], b[None, :, 1])
    np.maximum(iw, 0, out=iw)
    np.maximum(ih, 0, out=ih)
    iw *= ih  # intersection
    union = np.add(area_a[:, None], area_b[None, :], out=ih)
    union -= iw
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(iw, union, out=iw)
    return iw > threshold


def nms_sorted(boxes: np.ndarray, threshold: float) -> list[int]:
    """Greedy NMS over score-sorted (n, 4) boxes: keep a box unless IoU > threshold with a kept one.

    Exact greedy order, computed a block of candidates at a time: the block is first checked
    against every box kept so far in one vectorised IoU matrix, then resolved in order with
    the block's own IoU matrix (a Python step per candidate, no per-pair work in Python).
    """
    n = len(boxes)
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    picked: list[int] = []
    for s in range(0, n, NMS_BLOCK):
        e = min(n, s + NMS_BLOCK)
        blk, blk_area = boxes[s:e], areas[s:e]
        if picked:
            kept = np.asarray(picked)
            gone = overlaps(boxes[kept], areas[kept], blk, blk_area, threshold).any(axis=0)
        else:
            gone = np.zeros(e - s, dtype=bool)
        inner = overlaps(blk, blk_area, blk, blk_area, threshold)
        for i in range(e - s):
            if gone[i]:
                continue
            picked.append(s + i)
            gone |= inner[i]  # earlier entries are already decided; only later ones matter
    return picked


def detect(p: Yolov3DetectionOutputParams, hs: Sequence[Head], xs: Sequence[np.ndarray]) -> np.ndarray:
    """The layer's output rows for input heads ``xs`` (float32)."""
    rows = [decode(p, head, x) for head, x in zip(hs, xs)]
    dets = np.concatenate(rows, axis=0) if rows else np.zeros((0, 6), np.float32)
    dets = dets[np.argsort(-dets[:, 1], kind="stable")]
    picked = nms_sorted(dets[:, 2:6], p.nms_threshold)
    return dets[picked].reshape(-1, 6)
