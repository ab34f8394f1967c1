"""Inputs and nets for the SSD / YOLOv2 detection tests (CPU and Vulkan engines).

Controlled inputs give deterministic NMS on every engine: every value is exact in bf16 and
fp16 (so storage changes nothing; priors are multiples of 1/128, the variances 1/8 and 1/4, class
scores multiples of 1/1024 below 1/4),
boxes come in clusters (near-duplicates with IoU above
~0.6, two half-shifted members with IoU ~1/3, clusters apart with IoU 0), and scores are
distinct (or deliberately tied, to check ncnn's sort order of ties).
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.reference import match_detections

SSD_CLUSTERS = 3  # per side: 9 clusters
SSD_MEMBERS = 8  # per cluster: 72 priors
BOX = 0.1875


def ssd_priors(rng: np.random.Generator) -> np.ndarray:
    """(num_prior, 4) prior boxes in clusters (see the module doc)."""
    boxes = []
    for gy in range(SSD_CLUSTERS):
        for gx in range(SSD_CLUSTERS):
            cx, cy = 0.1875 + 0.3125 * gx, 0.1875 + 0.3125 * gy  # multiples of 1/16
            shifts = [tuple(rng.integers(-1, 2, 2) / 128) for _ in range(SSD_MEMBERS - 2)]
            shifts += [(BOX / 2, 0.0), (0.0, BOX / 2)]
            for dx, dy in shifts:
                x, y = cx + dx, cy + dy
                boxes.append((x - BOX / 2, y - BOX / 2, x + BOX / 2, y + BOX / 2))
    return np.asarray(rng.permutation(np.asarray(boxes)), np.float32)


# Boxes (in 64ths, placed right of the clusters) for ncnn's overlap rule at its edges: an
# inverted box (min > max) inside a box (IoU 0.69 by ncnn's rule: suppressed), one inverted in x
# only (negative IoU), a touching pair, and zero-area boxes (IoU 0 / 0 among them: suppressed).
EDGE_BOXES = np.array([
    (20, 20, 32, 32), (31, 31, 21, 21), (36, 40, 34, 46), (32, 40, 48, 48),
    (0, 0, 8, 8), (8, 0, 16, 8), (0, 20, 0, 28), (4, 52, 4, 52), (40, 60, 48, 60),
], np.float32) / 64 + np.array([1.25, 0, 1.25, 0], np.float32)


def ssd_inputs(rng: np.random.Generator, num_class: int, *, mxnet: bool = False,
               ties: bool = False, edge: bool = False) -> dict[str, np.ndarray]:
    """loc, conf and prior for DetectionOutput: caffe layout (conf prior-major, 1-D; prior
    (2, 4n) with variances) or mxnet's (conf (num_class, n), prior (n, 4)). Class scores are
    multiples of 1/1024 below 1 / num_class (8 significant bits at most), distinct within a
    class, or with `ties` only 8 values; the background takes the rest of 1 (it is never
    reported, and not exact in bf16). `edge` appends EDGE_BOXES (with zero offsets, so the
    decoded boxes are the priors)."""
    pb = ssd_priors(rng)
    if edge:
        pb = np.concatenate([pb, EDGE_BOXES])
    n = len(pb)
    top = 1024 // num_class
    if ties:
        k = rng.integers(0, 8, (n, num_class - 1)) * (top // 8)
    else:
        k = np.stack([rng.permutation(top)[:n] for _ in range(num_class - 1)], axis=1)
    cls = k / 1024.0
    conf = np.concatenate([1.0 - cls.sum(axis=1, keepdims=True), cls], axis=1).astype(np.float32)
    loc = (rng.integers(-4, 5, (n, 4)) / 16.0).astype(np.float32)
    if edge:
        loc[-len(EDGE_BOXES):] = 0
    if mxnet:
        return {"loc": loc.ravel(), "conf": np.ascontiguousarray(conf.T), "prior": pb}
    var = np.tile(np.array([0.125, 0.125, 0.25, 0.25], np.float32), n)  # bf16-exact
    return {"loc": loc.ravel(), "conf": conf.ravel(), "prior": np.stack([pb.ravel(), var])}


def yolo_inputs(rng: np.random.Generator, shapes: list[tuple[int, int]], num_box: int,
                num_class: int) -> dict[str, np.ndarray]:
    """Inputs x0, x1, ... of (num_box * (5 + num_class), h, w): every cell's class logits are
    one 3.0 and zeros (so every softmax maximum is the same number), objectness logits are
    distinct multiples of 1/8 (distinct confidences, well apart), offsets multiples of 1/8."""
    cells = sum(num_box * h * w for h, w in shapes)
    obj = iter(rng.permutation(np.arange(-cells // 2, cells - cells // 2)) / 8.0)
    out = {}
    for i, (h, w) in enumerate(shapes):
        x = np.zeros((num_box, 5 + num_class, h, w), np.float32)
        x[:, 0:2] = rng.integers(-8, 9, (num_box, 2, h, w)) / 8.0
        x[:, 2:4] = rng.integers(-6, 7, (num_box, 2, h, w)) / 8.0
        x[:, 4] = np.fromiter(obj, np.float32, num_box * h * w).reshape(num_box, h, w)
        best = rng.integers(0, num_class, (num_box, h, w))
        np.put_along_axis(x[:, 5:], best[:, None], 3.0, axis=1)
        out[f"x{i}"] = x.reshape(-1, h, w)
    return out


def assert_same_detections(got: np.ndarray, ref: np.ndarray, atol: float) -> None:
    """The same rows in the same order: labels equal, scores and boxes within `atol`."""
    got, ref = got.reshape(-1, 6), ref.reshape(-1, 6)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_array_equal(got[:, 0], ref[:, 0])
    np.testing.assert_allclose(got[:, 1:], ref[:, 1:], rtol=0, atol=atol)


def assert_matched(got: np.ndarray, ref: np.ndarray, fraction: float = 0.9) -> None:
    """At least `fraction` of the longer list matched (same label, IoU >= 0.9, close score)."""
    got, ref = got.reshape(-1, 6), ref.reshape(-1, 6)
    matched = match_detections(got, ref)
    assert len(ref) > 0 and matched >= fraction * max(len(got), len(ref)), (
        matched, len(got), len(ref))


NUM_CLASS = 4


def ssd_net_lines(conf_thr: float = 0.3) -> list[str]:
    """A small SSD: two feature maps (12x12, 6x6 for a 24x24 input), a loc and a conf head
    each (Convolution -> Permute to h, w, c -> Flatten), PriorBox on each (the image size
    from the input; the second with clip and two aspect ratios), Concat, Softmax over the
    classes and DetectionOutput. Inputs: data (3, 24, 24); output: out."""
    c = NUM_CLASS
    lines = [
        "Split sd 1 3 data d0 d1 d2",
        "Convolution c1 1 1 d0 f1a 0=8 1=3 3=2 4=1 5=1 6=216 9=1",
        "Split s1 1 4 f1a f1 f1b f1c f1d",
        "Convolution c2 1 1 f1 f2a 0=8 1=3 3=2 4=1 5=1 6=576 9=1",
        "Split s2 1 3 f2a f2b f2c f2d",
    ]
    for i, (feat, img, priors, pb) in enumerate(
            (("f1b", "d1", 4, "-23300=1,6.0 -23301=1,12.0 -23302=1,2.0"),
             ("f2b", "d2", 6, "-23300=1,12.0 -23301=1,20.0 -23302=2,2.0,3.0 8=1"))):
        f = ("f1c", "f2c")[i]
        g = ("f1d", "f2d")[i]
        lines += [
            f"Convolution loc{i} 1 1 {feat} l{i} 0={4 * priors} 1=3 4=1 5=1 6={72 * 4 * priors}",
            f"Permute lp{i} 1 1 l{i} lp{i} 0=3",
            f"Flatten lf{i} 1 1 lp{i} lf{i}",
            f"Convolution conf{i} 1 1 {f} k{i} 0={c * priors} 1=3 4=1 5=1 6={72 * c * priors}",
            f"Permute kp{i} 1 1 k{i} kp{i} 0=3",
            f"Flatten kf{i} 1 1 kp{i} kf{i}",
            f"PriorBox pb{i} 2 1 {g} {img} pri{i} {pb} 9=-233 10=-233 13=0.5",
        ]
    lines += [
        "Concat lc 2 1 lf0 lf1 loc 0=0",
        "Concat kc 2 1 kf0 kf1 confs 0=0",
        "Concat pc 2 1 pri0 pri1 prior 0=1",
        f"Reshape kr 1 1 confs kr 0={c} 1=-1",
        "Softmax ks 1 1 kr ks 0=1 1=1",
        "Flatten kfl 1 1 ks conf",
        f"DetectionOutput det 3 1 loc conf prior out 0={c} 1=0.45 2=100 3=60 4={conf_thr}",
    ]
    return lines
