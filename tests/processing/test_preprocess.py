"""[preprocess] numerics against the ncnn package (``Mat.from_pixels_resize`` +
``substract_mean_normalize``: the reference), the letterbox geometry, batches, encoded files
and the errors for images that are not."""

from __future__ import annotations

import io

import ncnn
import numpy as np
import pytest
from PIL import Image

from vkserve.processing.config import PixelFormat, Preprocess
from vkserve.processing.errors import ProcessingError
from vkserve.processing.preprocess import letterbox, prepare_image, prepare_inputs

MEAN = (104.0, 117.0, 123.0)
NORM = (0.017, 0.0175, 0.0171)
#: ncnn resizes in 11-bit fixed point, this module in float: a pixel may differ by one level.
LEVEL = 1.0
PIXEL_TYPE = {PixelFormat.RGB: ncnn.Mat.PixelType.PIXEL_RGB,
              PixelFormat.BGR: ncnn.Mat.PixelType.PIXEL_RGB2BGR,
              PixelFormat.GRAY: ncnn.Mat.PixelType.PIXEL_RGB2GRAY}


def ncnn_reference(rgb: np.ndarray, fmt: PixelFormat, h: int, w: int,
                   mean: tuple[float, ...], norm: tuple[float, ...]) -> np.ndarray:
    mat = ncnn.Mat.from_pixels_resize(rgb, PIXEL_TYPE[fmt], rgb.shape[1], rgb.shape[0], w, h)
    mat.substract_mean_normalize(list(mean), list(norm))
    return np.array(mat)


def image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth gradient with noise: bilinear steps are visible, not only noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) * 127 / max(h + w - 2, 1)], 2)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("fmt", list(PixelFormat))
@pytest.mark.parametrize(("src", "dst"), [((37, 53), (20, 24)), ((48, 64), (48, 64)),
                                          ((30, 20), (90, 71)), ((224, 224), (7, 5))])
def test_matches_ncnn_from_pixels_resize_and_normalize(fmt: PixelFormat, src, dst) -> None:
    rgb = image(*src, seed=src[0])
    channels = fmt.channels
    mean, norm = MEAN[:channels], NORM[:channels]
    ours, geo = prepare_image(Preprocess("data", fmt, dst, mean=mean, norm=norm), rgb)
    ref = ncnn_reference(rgb, fmt, *dst, mean, norm)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (channels, *dst)
    assert geo.source == src and geo.target == geo.content == dst and geo.offset == (0, 0)
    levels = np.abs(ours - ref) / np.asarray(norm, np.float32)[:, None, None]
    assert levels.max() <= LEVEL + 1e-3
    assert (levels > 0.01).mean() < 0.25  # most pixels agree exactly
    if src == dst:
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)  # no resize: exact


def test_gray_sources_feed_rgb_models_and_gray_models() -> None:
    gray = image(16, 12)[:, :, 0]
    got, _ = prepare_inputs(Preprocess("data", PixelFormat.RGB, (16, 12)), {"data": gray}, "m")
    rgb = got["data"]
    assert rgb.shape == (3, 16, 12)
    for c in range(3):
        np.testing.assert_array_equal(rgb[c], gray.astype(np.float32))
    one, _ = prepare_image(Preprocess("data", PixelFormat.GRAY, None, mean=(0.0,), norm=(1.0,)),
                           gray[:, :, None])
    np.testing.assert_array_equal(one[0], gray.astype(np.float32))


@pytest.mark.parametrize(("src", "content", "offset"), [
    ((100, 50), (64, 32), (0, 16)),   # tall: scaled to the height, pillarboxed
    ((30, 90), (21, 64), (21, 0)),    # wide: letterboxed (21.33 rows, rounded)
    ((64, 64), (64, 64), (0, 0)),     # same aspect: no padding
    ((8, 8), (64, 64), (0, 0)),       # upscaled to fit
])
def test_letterbox_geometry_and_padding(src, content, offset) -> None:
    geo = letterbox(src, (64, 64), keep_aspect=True)
    assert (geo.content, geo.offset, geo.target) == (content, offset, (64, 64))
    rgb = image(*src, seed=3)
    pre = Preprocess("data", PixelFormat.BGR, (64, 64), keep_aspect=True, pad_value=114,
                     mean=MEAN, norm=NORM)
    ours, got = prepare_image(pre, rgb)
    assert got == geo
    top, left = offset
    inside = np.zeros((64, 64), bool)
    inside[top:top + content[0], left:left + content[1]] = True
    pad = (114 - np.asarray(MEAN, np.float32)) * np.asarray(NORM, np.float32)
    np.testing.assert_allclose(ours[:, ~inside], np.repeat(pad[:, None], (~inside).sum(), 1), rtol=1e-6)
    ref = ncnn_reference(rgb, PixelFormat.BGR, *content, MEAN, NORM)
    levels = np.abs(ours[:, top:top + content[0], left:left + content[1]] - ref)
    assert (levels / np.asarray(NORM, np.float32)[:, None, None]).max() <= LEVEL + 1e-3


def test_stretch_ignores_aspect() -> None:
    geo = letterbox((100, 50), (64, 64), keep_aspect=False)
    assert (geo.content, geo.offset) == ((64, 64), (0, 0)) and geo.scale == (0.64, 1.28)


def test_png_and_jpeg_bytes_decode_like_the_pixels() -> None:
    rgb = image(20, 30)
    pre = Preprocess("data", PixelFormat.RGB, (10, 15))
    want, _ = prepare_image(pre, rgb)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    got, geos = prepare_inputs(pre, {"data": np.frombuffer(buf.getvalue(), np.uint8)}, "m")
    np.testing.assert_array_equal(got["data"], want)
    assert geos[0].source == (20, 30)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=95)
    jpeg, _ = prepare_inputs(pre, {"data": np.frombuffer(buf.getvalue(), np.uint8)}, "m")
    assert np.abs(jpeg["data"] - want).mean() < 6  # lossy, but the same picture


def test_a_batch_of_images_becomes_nchw() -> None:
    batch = np.stack([image(12, 12, seed=s) for s in range(3)])
    pre = Preprocess("data", PixelFormat.BGR, (6, 6), mean=MEAN, norm=NORM)
    got, geos = prepare_inputs(pre, {"data": batch, "other": np.ones(2, np.float32)}, "m")
    assert got["data"].shape == (3, 3, 6, 6) and len(geos) == 3
    assert got["other"].dtype == np.float32  # other inputs pass through
    for i in range(3):
        np.testing.assert_array_equal(got["data"][i], prepare_image(pre, batch[i])[0])


@pytest.mark.parametrize(("value", "words"), [
    (np.zeros((4, 4, 2), np.uint8), "got shape [4, 4, 2]"),
    (np.zeros((0, 4), np.uint8), "got shape [0, 4, 1]"),
    (np.frombuffer(b"GIF89a-broken", np.uint8), "not a readable image file (13 bytes)"),
    (np.zeros((2, 0, 4, 3), np.uint8), "item 0"),
])
def test_bad_images_name_the_model_and_input(value: np.ndarray, words: str) -> None:
    with pytest.raises(ProcessingError) as err:
        prepare_inputs(Preprocess("img", PixelFormat.RGB, (4, 4)), {"img": value}, "net")
    assert str(err.value).startswith("model 'net': input 'img'") and words in str(err.value)
