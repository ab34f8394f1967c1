"""Greedy non-maximum suppression, compiled: the CPU engine's form of
``vkserve.models.detection.nms_sorted`` (the layers' definition), same picks.

The definition computes IoU matrices a block of candidates at a time in numpy, so every
candidate is compared with every box kept before it, and the matrices are most of a detection
layer's time when thousands of boxes pass (yolov4-tiny with random weights: 2,100 candidates,
682 kept, 24 ms on one core of the 2-core box). Here each candidate is compared with the kept
boxes a chunk at a time and stops at the first chunk that suppresses it. The arithmetic is the definition's,
in float32 and in its order (no fused multiply-add: ``fastmath`` off), so the picks are equal
bit for bit, ties and degenerate boxes included.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: kept boxes compared with a candidate per vector pass (the pass stops at the first chunk that
#: suppresses it)
CHUNK = 64


@njit(cache=True, error_model="numpy", inline="always")
def _min(a, b):  # noqa: ANN001, ANN202
    """``np.minimum``: NaN if either is NaN."""
    m = b if b < a else a
    return b if b != b else m


@njit(cache=True, error_model="numpy", inline="always")
def _max(a, b):  # noqa: ANN001, ANN202
    """``np.maximum``: NaN if either is NaN."""
    m = b if b > a else a
    return b if b != b else m


@njit(cache=True, error_model="numpy")
def nms_sorted(boxes, threshold, nan_overlaps):  # noqa: ANN001, ANN201
    """Indices of the boxes greedy NMS keeps, ascending, for float32 (n, 4) ``boxes`` sorted by
    score (best first); ``threshold`` a float32 IoU; ``nan_overlaps``: an IoU of NaN
    suppresses. The kept boxes are held as columns, so a candidate's test against a chunk of
    them (IoU as ``models.detection.overlaps`` computes it: an intersection of 0 for boxes
    that lie apart) is one vectorized loop."""
    n = boxes.shape[0]
    kx0 = np.empty(n, dtype=np.float32)
    ky0 = np.empty(n, dtype=np.float32)
    kx1 = np.empty(n, dtype=np.float32)
    ky1 = np.empty(n, dtype=np.float32)
    karea = np.empty(n, dtype=np.float32)
    picked = np.empty(n, dtype=np.int64)
    zero = np.float32(0.0)
    kept = 0
    for i in range(n):
        x0, y0, x1, y1 = boxes[i, 0], boxes[i, 1], boxes[i, 2], boxes[i, 3]
        area = (x1 - x0) * (y1 - y0)
        suppressed = False
        for c0 in range(0, kept, CHUNK):
            hits = 0
            for j in range(c0, min(kept, c0 + CHUNK)):
                iw = _min(kx1[j], x1) - _max(kx0[j], x0)
                ih = _min(ky1[j], y1) - _max(ky0[j], y0)
                inter = iw * ih
                apart = (kx0[j] > x1) | (kx1[j] < x0) | (ky0[j] > y1) | (ky1[j] < y0)
                inter = zero if apart else inter
                iou = inter / (karea[j] + area - inter)
                hit = (not iou <= threshold) if nan_overlaps else iou > threshold
                hits += hit
            if hits:
                suppressed = True
                break
        if not suppressed:
            kx0[kept], ky0[kept], kx1[kept], ky1[kept], karea[kept] = x0, y0, x1, y1, area
            picked[kept] = i
            kept += 1
    return picked[:kept]
