"""Yolov3DetectionOutput: decode YOLO heads, sort by confidence, class-agnostic greedy NMS.

The confidence is ncnn's formula as it actually computes it (checked against the ncnn package):
``1 / (1 + exp(-objectness) * (1 + exp(-max_class_logit)))``, which is not the product of the
two sigmoids its comment suggests.

Output rows are (label + 1, confidence, xmin, ymin, xmax, ymax) in [0, 1] image coordinates
(ncnn's layout); the row count depends on the data, so the result lives outside the arena
and stays fp32.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.kernels.base import Kernel, Shape, UnsupportedError, register, sigmoid

NMS_BLOCK = 512


def _overlaps(a: np.ndarray, area_a: np.ndarray, b: np.ndarray, area_b: np.ndarray, threshold: float) -> np.ndarray:
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
            gone = _overlaps(boxes[kept], areas[kept], blk, blk_area, threshold).any(axis=0)
        else:
            gone = np.zeros(e - s, dtype=bool)
        inner = _overlaps(blk, blk_area, blk, blk_area, threshold)
        for i in range(e - s):
            if gone[i]:
                continue
            picked.append(s + i)
            gone |= inner[i]  # earlier entries are already decided; only later ones matter
    return picked


@register("Yolov3DetectionOutput")
class Yolov3DetectionOutput(Kernel):
    dynamic = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        p = self.p
        per_box = 5 + p.num_class
        for s in in_shapes:
            if len(s) != 3 or s[0] != p.num_box * per_box:
                raise UnsupportedError(f"input {s} is not {p.num_box} boxes x {per_box} channels")
        self.biases = np.asarray(p.biases, dtype=np.float32)
        self.mask = np.asarray(p.mask, dtype=np.float32).astype(np.int64)
        self.anchors_scale = np.asarray(p.anchors_scale, dtype=np.float32)
        if len(self.mask) < p.num_box * len(in_shapes) or len(self.anchors_scale) < len(in_shapes):
            raise UnsupportedError("mask/anchors_scale shorter than the inputs need")
        return [(0, 6)]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        rows = []
        for b, x in enumerate(xs):
            _, h, w = x.shape
            x = x.reshape(p.num_box, 5 + p.num_class, h, w)
            net_w = int(np.float32(self.anchors_scale[b]) * np.float32(w))
            net_h = int(np.float32(self.anchors_scale[b]) * np.float32(h))
            anchor = self.mask[b * p.num_box : (b + 1) * p.num_box]
            bias_w = self.biases[anchor * 2][:, None, None]
            bias_h = self.biases[anchor * 2 + 1][:, None, None]
            cls = x[:, 5:]
            label = cls.argmax(axis=1)
            with np.errstate(over="ignore"):
                # ncnn's expression, parenthesised as it ships:
                # 1 / (1 + exp(-box) * (1 + exp(-class))), not sigmoid(box) * sigmoid(class)
                conf = 1.0 / (1.0 + np.exp(-x[:, 4]) * (1.0 + np.exp(-cls.max(axis=1))))
            keep = conf >= np.float32(p.confidence_threshold)
            gy, gx = np.mgrid[0:h, 0:w].astype(np.float32)
            cx = (gx + sigmoid(x[:, 0])) / np.float32(w)
            cy = (gy + sigmoid(x[:, 1])) / np.float32(h)
            with np.errstate(over="ignore"):
                bw = np.exp(x[:, 2]) * bias_w / np.float32(net_w)
                bh = np.exp(x[:, 3]) * bias_h / np.float32(net_h)
            det = np.stack(
                [label + 1.0, conf, cx - bw * 0.5, cy - bh * 0.5, cx + bw * 0.5, cy + bh * 0.5], axis=-1
            )
            rows.append(det[keep].astype(np.float32))
        dets = np.concatenate(rows, axis=0) if rows else np.zeros((0, 6), np.float32)
        dets = dets[np.argsort(-dets[:, 1], kind="stable")]
        picked = nms_sorted(dets[:, 2:6], p.nms_threshold)
        return [dets[picked].reshape(-1, 6)]
