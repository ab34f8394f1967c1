"""The detection layers as ncnn defines them: Yolov3DetectionOutput, YoloDetectionOutput
(YOLOv2), DetectionOutput (SSD) and the SSD anchors of PriorBox.

Yolov3DetectionOutput: decode YOLO heads, sort by confidence, greedy NMS.

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

YoloDetectionOutput and DetectionOutput sort with ncnn's own quicksort, whose order of equal
scores is part of their output (`descending_order`); their NMS is `nms_sorted`, as above,
except that an IoU of NaN suppresses (`NAN_OVERLAPS`).
DetectionOutput's labels are class indices (0 is the background and never reported),
YoloDetectionOutput's are class + 1. All arithmetic is float32 in ncnn's operation order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from vkserve.models.layers import (
    UNSET,
    DetectionOutputParams,
    PriorBoxParams,
    Shape,
    YoloDetectionOutputParams,
    Yolov3DetectionOutputParams,
    mat_whdc,
)

NMS_BLOCK = 512
#: YoloDetectionOutput and DetectionOutput, as ncnn is built (-ffast-math), count an IoU of
#: NaN (0 / 0: two boxes of zero area, or cancelling areas of inverted boxes) as above the
#: threshold, so such a box is suppressed; Yolov3DetectionOutput keeps it (both measured).
NAN_OVERLAPS = True


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
             threshold: float, nan_overlaps: bool = False) -> np.ndarray:
    """(len(a), len(b)) mask of IoU(a_i, b_j) > threshold, in float32 as ncnn computes it
    (intersection 0 when one box lies entirely beyond an edge of the other, else the product
    of the overlap's width and height, then inter / union; for boxes with min <= max this is
    the usual clamped intersection, and inverted boxes get ncnn's value too). In place where
    possible: this matrix is most of the layer's time when thousands of boxes pass.
    `nan_overlaps`: an IoU of NaN (0 / 0, boxes of zero area) counts as above the threshold."""
    iw = np.minimum(a[:, None, 2], b[None, :, 2])
    iw -= np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3])
    ih -= np.maximum(a[:, None, 1], b[None, :, 1])
    iw *= ih  # intersection, unless apart:
    apart = np.greater(a[:, None, 0], b[None, :, 2])
    apart |= a[:, None, 2] < b[None, :, 0]
    apart |= a[:, None, 1] > b[None, :, 3]
    apart |= a[:, None, 3] < b[None, :, 1]
    iw[apart] = 0
    union = np.add(area_a[:, None], area_b[None, :], out=ih)
    union -= iw
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(iw, union, out=iw)
    return ~(iw <= threshold) if nan_overlaps else iw > threshold


def nms_sorted(boxes: np.ndarray, threshold: float, nan_overlaps: bool = False) -> list[int]:
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
            gone = overlaps(boxes[kept], areas[kept], blk, blk_area, threshold,
                            nan_overlaps).any(axis=0)
        else:
            gone = np.zeros(e - s, dtype=bool)
        inner = overlaps(blk, blk_area, blk, blk_area, threshold, nan_overlaps)
        for i in range(e - s):
            if gone[i]:
                continue
            picked.append(s + i)
            gone |= inner[i]  # earlier entries are already decided; only later ones matter
    return picked


def candidates(p: Yolov3DetectionOutputParams, hs: Sequence[Head], xs: Sequence[np.ndarray]) -> np.ndarray:
    """Every head's rows that pass the confidence threshold, best score first (ties in head,
    anchor and cell order): what the layer's NMS runs over."""
    rows = [decode(p, head, x) for head, x in zip(hs, xs)]
    dets = np.concatenate(rows, axis=0) if rows else np.zeros((0, 6), np.float32)
    return dets[np.argsort(-dets[:, 1], kind="stable")]


def detect(p: Yolov3DetectionOutputParams, hs: Sequence[Head], xs: Sequence[np.ndarray]) -> np.ndarray:
    """The layer's output rows for input heads ``xs`` (float32)."""
    dets = candidates(p, hs, xs)
    picked = nms_sorted(dets[:, 2:6], p.nms_threshold)
    return dets[picked].reshape(-1, 6)


# ---------------------------------------------------------------------------------------------
# ncnn's sort (YoloDetectionOutput, DetectionOutput)


def descending_order(scores: np.ndarray) -> np.ndarray:
    """The permutation ncnn's in-place quicksort applies to `scores` (descending; pivot the
    middle element, Hoare partition). Distinct scores have one descending order, so numpy
    sorts them; with ties the quicksort itself is replayed, since it decides their order."""
    n = len(scores)
    if n < 2 or len(np.unique(scores)) == n:
        return np.argsort(-scores, kind="stable")
    s = scores.tolist()
    perm = list(range(n))
    ranges = [(0, n - 1)]
    while ranges:
        lo, hi = ranges.pop()
        pivot = s[(lo + hi) // 2]
        i, j = lo, hi
        while i <= j:
            while s[i] > pivot:
                i += 1
            while s[j] < pivot:
                j -= 1
            if i <= j:
                s[i], s[j] = s[j], s[i]
                perm[i], perm[j] = perm[j], perm[i]
                i += 1
                j -= 1
        if lo < j:
            ranges.append((lo, j))
        if i < hi:
            ranges.append((i, hi))
    return np.asarray(perm, dtype=np.intp)


def _rows(label: np.ndarray, score: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    return np.concatenate([label[:, None], score[:, None], boxes], axis=1).astype(np.float32)


def _sorted_nms(label: np.ndarray, score: np.ndarray, boxes: np.ndarray, threshold: float,
                top_k: int | None = None) -> np.ndarray:
    """Candidates in gathering order -> ncnn's sort, the first `top_k`, greedy NMS."""
    order = descending_order(score)[:top_k]
    picked = order[np.asarray(nms_sorted(boxes[order], threshold, NAN_OVERLAPS), dtype=np.intp)]
    return _rows(label[picked], score[picked], boxes[picked])


# ---------------------------------------------------------------------------------------------
# YoloDetectionOutput (YOLOv2 region layer)


def yolo_v2_detect(p: YoloDetectionOutputParams, xs: Sequence[np.ndarray]) -> np.ndarray:
    """The layer's rows for (c, h, w) inputs `xs` (float32). Candidates gather input by input,
    box by box, cell by cell (row-major); a cell is one when box_score * class_score >=
    confidence_threshold, with box_score = sigmoid(t_o) and the best class of the softmax
    over the class channels (the first maximum)."""
    labels, scores, boxes = [], [], []
    f32 = np.float32
    for x in xs:
        c, h, w = x.shape
        per_box = c // p.num_box
        gy, gx = np.mgrid[0:h, 0:w].astype(f32)
        for k in range(p.num_box):
            t = x[k * per_box:k * per_box + 5 + p.num_class].astype(f32)
            logits = t[5:]
            with np.errstate(over="ignore"):
                e = np.exp(logits - logits.max(axis=0))
            prob = e / e.sum(axis=0)
            label = prob.argmax(axis=0)
            conf = _sigmoid(t[4]) * prob.max(axis=0)
            keep = conf >= f32(p.confidence_threshold)
            cx = (gx + _sigmoid(t[0])) / f32(w)
            cy = (gy + _sigmoid(t[1])) / f32(h)
            with np.errstate(over="ignore"):
                bw = np.exp(t[2]) * f32(p.biases[2 * k]) / f32(w)
                bh = np.exp(t[3]) * f32(p.biases[2 * k + 1]) / f32(h)
            hw, hh = bw * f32(0.5), bh * f32(0.5)
            box = np.stack([cx - hw, cy - hh, cx + hw, cy + hh], axis=-1)
            labels.append(label[keep] + 1)
            scores.append(conf[keep])
            boxes.append(box[keep])
    return _sorted_nms(np.concatenate(labels).astype(f32), np.concatenate(scores).astype(f32),
                       np.concatenate(boxes).reshape(-1, 4).astype(f32), p.nms_threshold)


# ---------------------------------------------------------------------------------------------
# DetectionOutput (SSD)


def ssd_boxes(p: DetectionOutputParams, loc: np.ndarray, prior: np.ndarray,
              num_prior: int) -> np.ndarray:
    """(num_prior, 4) decoded boxes (CENTER_SIZE coding): location offsets scaled by the
    variances (priorbox row 1; the params in the mxnet form) around each prior box."""
    f32 = np.float32
    loc = loc.reshape(-1)[:4 * num_prior].reshape(num_prior, 4).astype(f32)
    if p.mxnet_style:
        pb = prior.reshape(-1)[:4 * num_prior].reshape(num_prior, 4).astype(f32)
        var = np.array([p.variance0, p.variance1, p.variance2, p.variance3], f32)[None, :]
    else:
        pb = prior[0, :4 * num_prior].reshape(num_prior, 4).astype(f32)
        var = prior[1, :4 * num_prior].reshape(num_prior, 4).astype(f32)
    pb_w = pb[:, 2] - pb[:, 0]
    pb_h = pb[:, 3] - pb[:, 1]
    pb_cx = (pb[:, 0] + pb[:, 2]) * f32(0.5)
    pb_cy = (pb[:, 1] + pb[:, 3]) * f32(0.5)
    cx = var[:, 0] * loc[:, 0] * pb_w + pb_cx
    cy = var[:, 1] * loc[:, 1] * pb_h + pb_cy
    with np.errstate(over="ignore"):
        hw = np.exp(var[:, 2] * loc[:, 2]) * pb_w * f32(0.5)
        hh = np.exp(var[:, 3] * loc[:, 3]) * pb_h * f32(0.5)
    return np.stack([cx - hw, cy - hh, cx + hw, cy + hh], axis=1)


def ssd_scores(p: DetectionOutputParams, conf: np.ndarray, num_prior: int,
               num_class: int) -> np.ndarray:
    """(num_prior, num_class) class scores: caffe's layout is prior-major, mxnet's class-major."""
    flat = conf.reshape(-1).astype(np.float32)
    if p.mxnet_style:
        return flat.reshape(num_class, num_prior).T
    return flat.reshape(num_prior, num_class)


def ssd_select(p: DetectionOutputParams, boxes: np.ndarray, scores: np.ndarray,
               nms: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None
               ) -> np.ndarray:
    """Per class 1.. (0 is the background): the priors whose score > confidence_threshold, in
    prior order, sorted, cut to nms_top_k and suppressed; then all classes' survivors (class
    by class) sorted and cut to keep_top_k. `nms(label, score, candidate priors)` may stand in
    for `_sorted_nms` on the boxes (the Vulkan engine walks its overlap mask instead)."""
    thr = np.float32(p.confidence_threshold)
    per_class = []
    for c in range(1, scores.shape[1]):
        cand = np.flatnonzero(scores[:, c] > thr)
        label = np.full(len(cand), c, np.float32)
        if nms is None:
            per_class.append(_sorted_nms(label, scores[cand, c], boxes[cand], p.nms_threshold,
                                         p.nms_top_k))
        else:
            per_class.append(nms(label, scores[cand, c], cand))
    rows = np.concatenate(per_class) if per_class else np.zeros((0, 6), np.float32)
    return rows[descending_order(rows[:, 1])[:p.keep_top_k]].reshape(-1, 6)


def ssd_detect(p: DetectionOutputParams, xs: Sequence[np.ndarray]) -> np.ndarray:
    """The layer's rows for inputs (location, confidence, priorbox, ...) in float32.

    Every prior is decoded: ncnn skips the priors whose background score is at least
    1 - confidence_threshold and leaves their boxes uninitialised, which only a confidence
    that is not a distribution (a class also above the threshold) can expose."""
    num_prior, num_class = p.layout([x.shape for x in xs])
    boxes = ssd_boxes(p, xs[0], xs[2], num_prior)
    return ssd_select(p, boxes, ssd_scores(p, xs[1], num_prior, num_class))


# ---------------------------------------------------------------------------------------------
# PriorBox


def prior_boxes(p: PriorBoxParams, in_shapes: Sequence[Shape]) -> np.ndarray:
    """The layer's output (float32; it depends on the input shapes only).

    Cells row by row; per cell its priors. mxnet form: every min size at ratio 1 (width
    scaled by h / w), then min_sizes[0] at aspect_ratios[1:] (sqrt); caffe form, per min
    size: the square box, sqrt(min * max) when max sizes are given, then each aspect ratio
    (and its transpose with flip), in pixels divided by the image size, and a second row of
    the four variances per box. Centres are offset * step + index * step, except that
    successive columns add step to the previous centre in float32 (as ncnn accumulates);
    clip clamps the boxes to [0, 1].

    ncnn is built with -ffast-math: its compiler turns the divisions by the image size and by
    w into multiplications by reciprocals (measured, so done here too) and may regroup other
    products, so values agree with ncnn's to an ulp or two, not always bit for bit."""
    f32 = np.float32
    shapes = list(in_shapes)
    w, h, _, _ = mat_whdc(shapes[0])
    mxnet = p.mxnet_style(len(shapes))
    if mxnet:
        step_w = f32(p.step_width) if p.step_width != UNSET else f32(1) / f32(w)
        step_h = f32(p.step_height) if p.step_height != UNSET else f32(1) / f32(h)
    else:
        image_w, image_h = p.image_size(shapes)
        steps = []
        for given, image, n in ((p.step_width, image_w, w), (p.step_height, image_h, h)):
            step = f32(given) if given != UNSET else f32(image) / f32(n)
            steps.append(np.ceil(step) if given == UNSET and p.step_mmdetection else step)
        step_w, step_h = steps
    offset = f32(p.offset)
    if not mxnet and p.center_mmdetection:
        x0, y0 = offset * (step_w - f32(1)), offset * (step_h - f32(1))
    else:
        x0, y0 = offset * step_w, offset * step_h
    cx = np.add.accumulate(np.concatenate([[x0], np.full(w - 1, step_w, f32)]).astype(f32))
    cy = y0 + np.arange(h, dtype=f32) * step_h
    half_w, half_h = _prior_half_sizes(p, mxnet, w, h)
    cx = cx[None, :, None]
    cy = cy[:, None, None]
    box = np.stack(np.broadcast_arrays(cx - half_w, cy - half_h, cx + half_w, cy + half_h),
                   axis=-1)
    if not mxnet:
        box *= f32(1) / np.array([image_w, image_h, image_w, image_h], f32)
    box = box.reshape(-1).astype(f32)
    if p.clip:
        box = np.clip(box, f32(0), f32(1))
    if mxnet:
        return box
    var = np.array([p.variance0, p.variance1, p.variance2, p.variance3], f32)
    return np.stack([box, np.tile(var, len(box) // 4)])


def _prior_half_sizes(p: PriorBoxParams, mxnet: bool, w: int, h: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Half the width and height of each prior of a cell, float32 as ncnn rounds them."""
    f32 = np.float32
    half = f32(0.5)
    hw: list[np.float32] = []
    hh: list[np.float32] = []
    if mxnet:
        inv_w = f32(1) / f32(w)
        for size in p.min_sizes:
            hw.append(f32(size) * f32(h) * inv_w * half)
            hh.append(f32(size) * half)
        size = f32(p.min_sizes[0])
        for ar in p.aspect_ratios[1:]:
            ratio = np.sqrt(f32(ar))
            hw.append(size * f32(h) * inv_w * ratio * half)
            hh.append(size / ratio * half)
        return np.array(hw, f32), np.array(hh, f32)
    for k, min_size in enumerate(p.min_sizes):
        sizes = [(f32(min_size), f32(min_size))]
        if p.max_sizes:
            s = np.sqrt(f32(min_size) * f32(p.max_sizes[k]))
            sizes.append((s, s))
        for ar in p.aspect_ratios:
            bw, bh = f32(min_size) * np.sqrt(f32(ar)), f32(min_size) / np.sqrt(f32(ar))
            sizes.append((bw, bh))
            if p.flip:
                sizes.append((bh, bw))
        for bw, bh in sizes:
            hw.append(bw * half)
            hh.append(bh * half)
    return np.array(hw, f32), np.array(hh, f32)
