"""The `shapes` data set: 32x32 RGB pictures of one shape each, drawn with Pillow (no torch
here, so vkserve's venv can regenerate the test set: tools/eval_shapes.py).

One shape of ``CLASSES`` per picture, at a random place, size (circumradius 22..42 % of the
side), rotation and colour on a random background colour (the two differ by at least 150 in
the sum of channel differences), drawn at 4x and reduced with a box filter (anti-aliased),
then Gaussian pixel noise (sigma 8). Deterministic for a seed.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle", "star", "cross")
SIZE = 32
SUPERSAMPLE = 4
MEAN = 127.5  # the model's input is (pixel - MEAN) * NORM, as its [preprocess] says
NORM = 1 / 127.5
NOISE_SIGMA = 8.0


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a square, triangle, star or cross of circumradius ``r`` turned by ``angle``."""
    if kind == "square":
        radii, step = [r] * 4, math.pi / 2
    elif kind == "triangle":
        radii, step = [r] * 3, 2 * math.pi / 3
    elif kind == "star":
        radii, step = [r, 0.45 * r] * 5, math.pi / 5
    else:  # cross: a plus sign with arms a third of its width
        a, b = r / 3, r
        corners = [(a, b), (a, a), (b, a), (b, -a), (a, -a), (a, -b),
                   (-a, -b), (-a, -a), (-b, -a), (-b, a), (-a, a), (-a, b)]
        c, s = math.cos(angle), math.sin(angle)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in corners]
    return [(cx + rad * math.cos(angle + i * step), cy + rad * math.sin(angle + i * step))
            for i, rad in enumerate(radii)]


def _colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A background and a shape colour that differ clearly in at least one channel sum."""
    while True:
        bg = rng.integers(0, 256, 3)
        fg = rng.integers(0, 256, 3)
        if np.abs(bg.astype(int) - fg.astype(int)).sum() >= 150:
            return tuple(int(v) for v in bg), tuple(int(v) for v in fg)


def draw(kind: str, rng: np.random.Generator) -> np.ndarray:
    """One picture of ``kind``: uint8 (SIZE, SIZE, 3) RGB."""
    big = SIZE * SUPERSAMPLE
    bg, fg = _colours(rng)
    image = Image.new("RGB", (big, big), bg)
    pen = ImageDraw.Draw(image)
    r = rng.uniform(0.22, 0.42) * big
    cx, cy = (rng.uniform(r, big - r) for _ in range(2))
    if kind == "circle":
        pen.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)
    else:
        pen.polygon(_polygon(kind, cx, cy, r, rng.uniform(0, 2 * math.pi)), fill=fg)
    small = np.asarray(image.resize((SIZE, SIZE), Image.Resampling.BOX), np.float32)
    noisy = small + rng.normal(0, NOISE_SIGMA, small.shape)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def make_set(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` pictures (N, SIZE, SIZE, 3) uint8 with balanced labels (N,) int64."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(count) % len(CLASSES))
    return np.stack([draw(CLASSES[k], rng) for k in labels]), labels.astype(np.int64)
