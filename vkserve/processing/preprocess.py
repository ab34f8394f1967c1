"""Images into a model's input tensor, as a model's ``[preprocess]`` table says (blocking: the
scheduler calls :func:`prepare_inputs` in a worker thread).

What a request may send for the preprocessed input (any other dtype is a tensor, used as is):

- uint8 ``(H, W)`` (gray), ``(H, W, 1)``, ``(H, W, 3)`` (RGB order): one image of any size;
- uint8 ``(N, H, W, C)``: a client's batch of N images of one size;
- uint8 ``(bytes,)``: an encoded PNG / JPEG / ... file (decoded with Pillow, the ``images`` extra).

The steps, in the order ncnn's ``from_pixels_resize`` + ``substract_mean_normalize`` take them:
bilinear resize (pixel centres aligned, the result rounded to uint8; with ``keep_aspect`` the
image is scaled to fit and the rest padded with ``pad_value``, centred), the channel order the
model expects (RGB -> BGR swaps, RGB -> GRAY is ``(77 R + 150 G + 29 B) >> 8``, the
BT.601 weights in 8-bit fixed point as ncnn computes them, gray -> RGB repeats), ``(pixel - mean) * norm`` per channel in float32, HWC -> CHW. Each image's
:class:`Geometry` maps model-input coordinates back to its pixels (detection boxes, masks).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping

import numpy as np

from vkserve.processing.config import PixelFormat, Preprocess
from vkserve.processing.errors import ProcessingError

__all__ = ["Geometry", "decode_image", "letterbox", "prepare_image", "prepare_inputs",
           "resize_bilinear", "wants_preprocessing"]

#: Largest decoded image, in pixels (Pillow's own guard against decompression bombs is a warning).
MAX_PIXELS = 64 * 1024 * 1024
_GRAY_WEIGHTS = np.array([77, 150, 29], np.uint32)  # sum 256


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Where an image of ``source`` (H, W) lies in the model input of ``target`` (H, W): scaled
    by ``scale`` (y, x) to ``content`` (H, W) at ``offset`` (top, left)."""

    source: tuple[int, int]
    target: tuple[int, int]
    content: tuple[int, int]
    offset: tuple[int, int]

    @property
    def scale(self) -> tuple[float, float]:
        return (self.content[0] / self.source[0], self.content[1] / self.source[1])

    @classmethod
    def identity(cls, h: int, w: int) -> Geometry:
        return cls((h, w), (h, w), (h, w), (0, 0))


def wants_preprocessing(value: object) -> bool:
    """Is this request value an image (uint8) rather than a ready tensor?"""
    return isinstance(value, np.ndarray) and value.dtype == np.uint8


def decode_image(data: np.ndarray, where: str) -> np.ndarray:
    """An encoded image file's bytes as uint8 (H, W) gray or (H, W, 3) RGB."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ProcessingError(f"{where}: encoded image bytes need Pillow in the daemon (pip install "
                       "'vkserve[images]'); or send the decoded pixels as a uint8 (H, W, 3) "
                       "array") from None
    try:
        with Image.open(io.BytesIO(data.tobytes())) as image:
            if image.width * image.height > MAX_PIXELS:
                raise ProcessingError(f"{where}: image of {image.width}x{image.height} pixels is larger "
                               f"than {MAX_PIXELS} pixels")
            gray = image.mode in ("1", "L", "LA", "I", "I;16", "F")
            return np.asarray(image.convert("L" if gray else "RGB"))
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ProcessingError(f"{where}: not a readable image file ({len(data)} bytes): {exc}") from None


def resize_bilinear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 (H, W, C) -> uint8 (height, width, C), bilinear with aligned pixel centres,
    edges clamped, rounded half up."""
    h, w = pixels.shape[:2]
    if (h, w) == (height, width):
        return pixels

    def axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.clip((np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5, 0, src - 1)
        lo = np.floor(pos).astype(np.intp)
        hi = np.minimum(lo + 1, src - 1)
        return lo, hi, (pos - lo).astype(np.float32)

    y0, y1, fy = axis(h, height)
    x0, x1, fx = axis(w, width)
    channels = pixels.shape[2]
    # rows of (width * channels) values: numpy's loops then run over whole rows, not pixels
    wy = fy[:, None]
    wx = np.repeat(fx, channels)[None, :]

    # only the source pixels the output samples are gathered (``take`` copies whole rows,
    # then whole pixels, far faster than fancy indexing) and widened to float
    top, bottom = pixels.take(y0, axis=0), pixels.take(y1, axis=0)

    def corner(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return rows.take(cols, axis=1).reshape(height, width * channels).astype(np.float32)

    left = corner(top, x0) * (1 - wy) + corner(bottom, x0) * wy
    right = corner(top, x1) * (1 - wy) + corner(bottom, x1) * wy
    out = left * (1 - wx) + right * wx
    return np.floor(out + 0.5).clip(0, 255).astype(np.uint8).reshape(height, width, channels)


def letterbox(source: tuple[int, int], target: tuple[int, int], keep_aspect: bool) -> Geometry:
    """Where an image of ``source`` size goes in ``target``: stretched over all of it, or (with
    ``keep_aspect``) scaled to fit and centred."""
    if not keep_aspect:
        return Geometry(source, target, target, (0, 0))
    scale = min(target[0] / source[0], target[1] / source[1])
    content = (min(target[0], max(1, round(source[0] * scale))),
               min(target[1], max(1, round(source[1] * scale))))
    return Geometry(source, target, content,
                    ((target[0] - content[0]) // 2, (target[1] - content[1]) // 2))


def _convert(pixels: np.ndarray, fmt: PixelFormat) -> np.ndarray:
    """RGB (3) or gray (1) channel HWC uint8 into the model's channel order."""
    if fmt is PixelFormat.GRAY:
        if pixels.shape[2] == 1:
            return pixels
        gray = (pixels.astype(np.uint32) @ _GRAY_WEIGHTS) >> 8
        return gray.astype(np.uint8)[:, :, None]
    if pixels.shape[2] == 1:
        return np.repeat(pixels, 3, axis=2)
    return pixels[:, :, ::-1] if fmt is PixelFormat.BGR else pixels


def prepare_image(pre: Preprocess, pixels: np.ndarray) -> tuple[np.ndarray, Geometry]:
    """One uint8 (H, W, C) image (C = 1 gray or 3 RGB) -> float32 (C', H', W') and its geometry."""
    source = (pixels.shape[0], pixels.shape[1])
    geo = letterbox(source, pre.size or source, pre.keep_aspect)
    resized = resize_bilinear(pixels, *geo.content)
    if geo.content != geo.target:
        canvas = np.full((*geo.target, pixels.shape[2]), pre.pad_value, np.uint8)
        top, left = geo.offset
        canvas[top:top + geo.content[0], left:left + geo.content[1]] = resized
        resized = canvas
    planes = np.ascontiguousarray(_convert(resized, pre.pixel_format).transpose(2, 0, 1))
    mean = np.asarray(pre.mean, np.float32)[:, None, None]
    norm = np.asarray(pre.norm, np.float32)[:, None, None]
    return (planes.astype(np.float32) - mean) * norm, geo


def _as_pixels(value: np.ndarray, where: str) -> np.ndarray:
    """One image as uint8 (H, W, C), C in (1, 3)."""
    if value.ndim == 1:
        value = decode_image(value, where)
    if value.ndim == 2:
        value = value[:, :, None]
    if value.ndim != 3 or value.shape[2] not in (1, 3) or 0 in value.shape:
        raise ProcessingError(f"{where}: a uint8 image is (H, W), (H, W, 1) or (H, W, 3) RGB, or an "
                       f"encoded file's bytes (1 dimension); got shape {list(value.shape)}")
    if value.shape[0] * value.shape[1] > MAX_PIXELS:
        raise ProcessingError(f"{where}: image of {value.shape[1]}x{value.shape[0]} pixels is larger "
                       f"than {MAX_PIXELS} pixels")
    return value


def prepare_inputs(pre: Preprocess, inputs: Mapping[str, np.ndarray], model: str
                   ) -> tuple[dict[str, np.ndarray], tuple[Geometry, ...]]:
    """The request's inputs with the image input converted (a batch of N images: an (N, C, H,
    W) tensor), and one geometry per image."""
    value = inputs[pre.input]
    where = f"model '{model}': input '{pre.input}'"
    if value.ndim == 4:
        if value.shape[0] == 0:
            raise ProcessingError(f"{where}: a batch of no images")
        prepared = [prepare_image(pre, _as_pixels(item, f"{where} item {i}"))
                    for i, item in enumerate(value)]
        tensor = np.stack([t for t, _ in prepared])
        geometries = tuple(g for _, g in prepared)
    else:
        tensor, geo = prepare_image(pre, _as_pixels(value, where))
        geometries = (geo,)
    return {**inputs, pre.input: tensor}, geometries
