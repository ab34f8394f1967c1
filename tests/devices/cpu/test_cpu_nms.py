"""The compiled NMS (``jit.nms``) picks exactly what the layers' definition
(``models.detection.nms_sorted``) picks: random, tied, duplicate, zero-area, inverted and NaN
boxes, several thresholds, both NaN rules; and yolov4-tiny's detection layer on the CPU engine
gives the definition's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vkserve.devices.cpu.executor import Plan
from vkserve.devices.cpu.jit import nms
from vkserve.devices.reference import random_inputs
from vkserve.models import detection
from vkserve.models.graph import load_model

MODELS = Path(__file__).resolve().parents[2] / "data" / "models"


def _boxes(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    b = rng.random((n, 4)).astype(np.float32)
    b[:, 2:] = b[:, :2] + rng.random((n, 2)).astype(np.float32) * 0.5
    if kind == "grid":  # ties, touching edges, zero areas
        b = np.round(b * 4) / 4
    elif kind == "duplicates":
        b[1::2] = b[0::2][: len(b[1::2])]
    elif kind == "inverted":
        b[::3, 2:] = b[::3, :2] - 0.1
    elif kind == "nan":  # NaN in each coordinate in turn
        for k in range(4):
            b[k::9, k] = np.nan
    return b


@pytest.mark.parametrize("kind", ["random", "grid", "duplicates", "inverted", "nan"])
@pytest.mark.parametrize("threshold", [0.0, 0.45, 0.9])
@pytest.mark.parametrize("nan_overlaps", [False, True])
def test_compiled_nms_picks_what_the_definition_picks(kind: str, threshold: float, nan_overlaps: bool) -> None:
    rng = np.random.default_rng(hash((kind, threshold, nan_overlaps)) % 2**32)
    for n in (0, 1, 2, 37, 600, 1500):
        boxes = _boxes(rng, n, kind)
        want = detection.nms_sorted(boxes, threshold, nan_overlaps)
        got = nms.nms_sorted(boxes, np.float32(threshold), nan_overlaps)
        assert got.tolist() == want, (n, len(want), len(got))


def test_yolov3_detection_layer_gives_the_definitions_rows() -> None:
    graph = load_model(MODELS / "yolov4-tiny.param", None, seed=0)
    plan = Plan(graph)
    inputs = random_inputs({n: plan.blob_shapes[n] for n in plan.input_names})
    layer = next(s.kernel for s in plan._program if s.kernel.layer.type == "Yolov3DetectionOutput")
    seen: list[list[np.ndarray]] = []
    forward = layer.forward

    def spy(xs: list[np.ndarray]) -> list[np.ndarray]:
        seen.append([x.copy() for x in xs])
        return forward(xs)

    layer.forward = spy
    got = plan.run(inputs)["output"]
    want = detection.detect(layer.p, layer.heads, seen[0])
    assert len(want) > 100  # random weights: hundreds of boxes kept, thousands of candidates
    np.testing.assert_array_equal(got, want)
