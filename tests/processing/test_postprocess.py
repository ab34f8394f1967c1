"""[postprocess]: top-k with labels, detection rows back into the sent image's pixels (the
letterbox undone), segmentation masks at the image's size, and the reply field's wire form."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from vkserve.client.meaning import (
    Box,
    ClassScore,
    Detections,
    MeaningError,
    MeaningKind,
    SegmentationMask,
    TopK,
    meanings_from_wire,
    meanings_to_wire,
)
from vkserve.processing.config import Postprocess
from vkserve.processing.errors import ProcessingError
from vkserve.processing.postprocess import detections, explain, segmentation_mask, top_k
from vkserve.processing.preprocess import Geometry, letterbox

LABELS = ("cat", "dog", "fox", "owl")


def test_top_k_is_best_first_with_labels() -> None:
    post = Postprocess(MeaningKind.TOPK, "prob", top_k=3, labels=LABELS[:3])
    got = top_k(post, np.array([[0.1, 0.5, 0.05, 0.35]], np.float32), "m")
    assert [(c.index, c.label) for c in got.classes] == [(1, "dog"), (3, None), (0, "cat")]
    assert [round(c.score, 6) for c in got.classes] == [0.5, 0.35, 0.1]
    with pytest.raises(ProcessingError, match=r"model 'm': \[postprocess\] kind = 'topk' needs a "
                                              r"score vector.*output 'prob' has shape \[2, 3\]"):
        top_k(post, np.zeros((2, 3), np.float32), "m")


def test_detection_rows_map_back_through_the_letterbox() -> None:
    """An image of 200 x 100 (H x W) letterboxed into 64 x 64: content 64 x 32 at column 16.
    A box over the whole content is the whole image; one over its middle, the image's middle."""
    geo = letterbox((200, 100), (64, 64), keep_aspect=True)
    assert (geo.content, geo.offset) == ((64, 32), (0, 16))
    rows = np.array([
        [1, 0.9, 16 / 64, 0.0, 48 / 64, 1.0],        # the whole content
        [2, 0.3, 0.0, 0.0, 0.1, 0.1],                # under the threshold
        [3, 0.95, 24 / 64, 0.25, 40 / 64, 0.75],     # the middle half
        [0, 0.6, 0.0, 0.5, 0.2, 1.2],                # in the padding, clipped to the image
    ], np.float32)
    post = Postprocess(MeaningKind.DETECTION, "out", labels=LABELS, threshold=0.5)
    got = detections(post, rows, geo, "m")
    assert [(b.index, b.label) for b in got.boxes] == [(3, "owl"), (1, "dog"), (0, "cat")]
    owl, dog, cat = got.boxes
    assert (dog.x0, dog.y0, dog.x1, dog.y1) == pytest.approx((0, 0, 100, 200))
    assert (owl.x0, owl.y0, owl.x1, owl.y1) == pytest.approx((25, 50, 75, 150))
    assert (cat.x0, cat.x1, cat.y1) == pytest.approx((0, 0, 200))
    assert owl.score == pytest.approx(0.95)
    raw = detections(post, rows, None, "m")  # no geometry: the output's own coordinates
    assert (raw.boxes[0].x0, raw.boxes[0].y1) == pytest.approx((24 / 64, 0.75))
    assert detections(post, np.zeros((0,), np.float32), geo, "m") == Detections(())
    with pytest.raises(ProcessingError, match=r"rows of \[label, score, x0, y0, x1, y1\]"):
        detections(post, np.zeros((3, 5), np.float32), geo, "m")


def test_segmentation_mask_is_the_argmax_at_the_images_size() -> None:
    rng = np.random.default_rng(1)
    scores = rng.random((3, 8, 8)).astype(np.float32)
    post = Postprocess(MeaningKind.SEGMENTATION, "seg")
    plain = segmentation_mask(post, scores, None, "m").mask
    np.testing.assert_array_equal(plain, scores.argmax(0))
    assert plain.dtype == np.uint8
    # a 4 x 8 (H x W) image letterboxed into 8 x 8: rows 2..5 hold it; each image pixel is a
    # 1 x 1 block of the 8 x 8 output (scale 1), so the mask is those rows
    geo = letterbox((4, 8), (8, 8), keep_aspect=True)
    assert (geo.content, geo.offset) == ((4, 8), (2, 0))
    np.testing.assert_array_equal(segmentation_mask(post, scores, geo, "m").mask, plain[2:6])
    # a 16 x 16 image stretched onto the 8 x 8 input: each output pixel covers 2 x 2
    big = segmentation_mask(post, scores, Geometry((16, 16), (8, 8), (8, 8), (0, 0)), "m").mask
    np.testing.assert_array_equal(big, np.kron(plain, np.ones((2, 2), np.uint8)))
    one = segmentation_mask(Postprocess(MeaningKind.SEGMENTATION, "seg", threshold=0.5),
                            scores[:1], None, "m").mask
    np.testing.assert_array_equal(one, (scores[0] >= 0.5).astype(np.uint8))


def test_explain_per_item_of_a_batch_and_absent_outputs() -> None:
    post = Postprocess(MeaningKind.TOPK, "prob", top_k=1)
    prob = np.array([[0.2, 0.8], [0.9, 0.1]], np.float32)
    got = explain(post, {"prob": prob}, (None, None), True, "m")
    assert [m.classes[0].index for m in got if isinstance(m, TopK)] == [1, 0]
    assert explain(post, {"other": prob}, (None,), False, "m") == ()


def test_wire_round_trip_through_msgpack() -> None:
    meanings = (TopK((ClassScore(2, "fox", 0.75), ClassScore(0, None, 0.25))),
                Detections((Box(1, "dog", 0.9, 1.0, 2.0, 30.5, 40.0),)),
                SegmentationMask(np.arange(12, dtype=np.uint8).reshape(3, 4)))
    wire = msgpack.unpackb(msgpack.packb(meanings_to_wire(meanings)))
    got = meanings_from_wire(wire)
    assert got[:2] == meanings[:2]
    assert isinstance(got[2], SegmentationMask)
    np.testing.assert_array_equal(got[2].mask, meanings[2].mask)
    assert meanings_from_wire(None) == ()


@pytest.mark.parametrize(("wire", "words"), [
    ({"kind": "topk"}, "postprocess: expected a list"),
    ([{"kind": "topk", "classes": [[1, "a"]]}], "postprocess[0].classes: expected a list of 3-element lists"),
    ([{"kind": "topk", "classes": [[1.5, "a", 0.1]]}], "postprocess[0].classes[0]: expected an int"),
    ([{"kind": "detection", "boxes": [[1, 2, 0.1, 0, 0, 1, 1]]}], "postprocess[0].boxes[0]: expected a str or nil"),
    ([{"kind": "segmentation", "mask": {"dtype": "uint8", "shape": [4], "data": b"abcd"}}],
     "postprocess[0].mask: expected 2 dimensions"),
    ([{"kind": "pose"}], "postprocess[0].kind: expected one of topk, detection, segmentation, got 'pose'"),
])
def test_bad_wire_is_named(wire: object, words: str) -> None:
    with pytest.raises(MeaningError) as err:
        meanings_from_wire(wire)
    assert words in str(err.value)


def test_masks_of_many_classes_are_uint16_and_save_as_16_bit_png(tmp_path) -> None:
    from PIL import Image

    from vkserve.cli.commands._meanings import save_mask

    scores = np.zeros((300, 2, 3), np.float32)
    scores[299, 0, 0] = scores[257, 1, 2] = 1.0
    seg = segmentation_mask(Postprocess(MeaningKind.SEGMENTATION, "seg"), scores, None, "m")
    assert seg.mask.dtype == np.uint16 and seg.mask[0, 0] == 299 and seg.mask[1, 2] == 257
    save_mask((seg,), str(tmp_path / "m.png"))
    with Image.open(tmp_path / "m.png") as png:
        np.testing.assert_array_equal(np.asarray(png), seg.mask)
