"""PriorBox, DetectionOutput (SSD) and YoloDetectionOutput (YOLOv2) on the CPU engine against
the ncnn package.

- PriorBox over its forms and params: the definition (fp32) within an ulp or two of ncnn
  (ncnn is built with -ffast-math), the engine (bf16 storage) within the verify tolerance;
- DetectionOutput and YoloDetectionOutput on controlled inputs (tests/support/detection_cases:
  bf16-exact values, clustered boxes, distinct or deliberately tied scores): the engine gives
  ncnn's rows in ncnn's order (ties included), values within float32 rounding;
- a small SSD (Convolution heads, Permute, Flatten, Concat, PriorBox, Softmax,
  DetectionOutput) end to end with random weights: detections matched to ncnn's;
- the load errors of unusable params and shapes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.cpu_engine import check_against_ncnn
from tests.support.detection_cases import (
    NUM_CLASS,
    assert_matched,
    assert_same_detections,
    ssd_inputs,
    ssd_net_lines,
    yolo_inputs,
)
from tests.support.params import param_text
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.reference import run_ncnn
from vkserve.models import detection
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model, parse_param_text
from vkserve.models.layers import ShapeError
from vkserve.models.weights import write_bin

PRIORBOX = [
    # caffe form, image size from input 1, max sizes, flip
    ("2 1 f img out -23300=2,30.0,45.0 -23301=2,60.0,90.0 -23302=2,2.0,3.0 9=-233 10=-233 "
     "13=0.5", {"f": (3, 5, 7), "img": (3, 300, 280)}),
    # given image size and steps, no flip, clip, no max sizes
    ("1 1 f out -23300=1,30.0 -23302=2,2.0,0.5 7=0 8=1 9=300 10=200 11=16.0 12=20.0 13=0.5",
     {"f": (3, 5, 7)}),
    # mmdetection steps and centres, custom variances
    ("2 1 f img out -23300=1,30.0 -23301=1,60.0 -23302=1,2.0 9=-233 10=-233 13=0.5 14=1 15=1 "
     "3=0.3 4=0.4 5=0.5 6=0.6", {"f": (3, 7, 9), "img": (3, 301, 287)}),
    # mxnet MultiBoxPrior: default steps with clip, then given steps
    ("1 1 f out -23300=2,0.3,0.1 -23302=3,1.0,2.0,0.5 9=-233 10=-233 13=0.5 8=1",
     {"f": (3, 5, 7)}),
    ("1 1 f out -23300=2,0.3,0.1 -23302=3,1.0,2.0,0.5 9=-233 10=-233 11=0.1 12=0.15 13=0.5",
     {"f": (8, 6)}),
]


def ncnn_run(tmp_path: Path, lines: list[str], inputs: dict[str, np.ndarray],
             outputs: list[str]) -> tuple[dict[str, np.ndarray], object]:
    """ncnn's outputs and the loaded graph (seeded weights, shared through a .bin)."""
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    shapes = {k: v.shape for k, v in inputs.items()}
    param.write_text(param_text(shapes, lines))
    graph = load_model(param, None, shapes, seed=7)
    write_bin(graph.layers, bin_path)
    return run_ncnn(param, bin_path, inputs, outputs), graph


def engine_run(graph: object, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    plan = Plan(graph, {k: v.shape for k, v in inputs.items()}, outputs=outputs)
    return plan.run(inputs)


@pytest.mark.parametrize("case", range(len(PRIORBOX)))
def test_priorbox(tmp_path: Path, case: int) -> None:
    args, shapes = PRIORBOX[case]
    line = f"PriorBox pb {args}"
    rng = np.random.default_rng(case)
    inputs = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in shapes.items()}
    ref, graph = ncnn_run(tmp_path, [line], inputs, ["out"])
    layer = graph.layers[-1]
    want = detection.prior_boxes(layer.params, [shapes[b] for b in layer.inputs])
    assert want.shape == ref["out"].shape == graph.blob_shapes["out"]
    np.testing.assert_allclose(want, ref["out"], rtol=3e-7, atol=1e-7)
    check_against_ncnn(tmp_path, line, shapes, rng)


SSD_CASES = [
    ("4=0.1", {}),  # nms_threshold, nms_top_k and keep_top_k at their defaults
    ("1=0.25 2=5 3=7 4=0.1", {}),  # nms_top_k and keep_top_k cut
    ("1=0.45 2=300 3=100 4=0.2", {"ties": True}),
    ("1=0.45 4=0.1 5=0.2 6=0.2 7=0.1 8=0.1", {"mxnet": True}),  # variances from the params
    ("1=0.45 4=0.1 2=1000 3=1000", {"edge": True}),
]


@pytest.mark.parametrize("case", range(len(SSD_CASES)))
def test_detection_output_controlled(tmp_path: Path, case: int) -> None:
    extra, form = SSD_CASES[case]
    mxnet = bool(form.get("mxnet"))
    inputs = ssd_inputs(np.random.default_rng(case), NUM_CLASS, mxnet=mxnet,
                        ties=bool(form.get("ties")), edge=bool(form.get("edge")))
    num_class = -233 if mxnet else NUM_CLASS
    line = f"DetectionOutput det 3 1 loc conf prior out 0={num_class} {extra}"
    ref, graph = ncnn_run(tmp_path, [line], inputs, ["out"])
    assert len(ref["out"]) > 3
    assert_same_detections(engine_run(graph, inputs, ["out"])["out"], ref["out"], 1e-6)


def test_detection_output_ignores_a_fourth_input(tmp_path: Path) -> None:
    inputs = ssd_inputs(np.random.default_rng(9), NUM_CLASS)
    inputs["extra"] = np.zeros(5, np.float32)
    line = f"DetectionOutput det 4 1 loc conf prior extra out 0={NUM_CLASS} 4=0.1"
    ref, graph = ncnn_run(tmp_path, [line], inputs, ["out"])
    assert_same_detections(engine_run(graph, inputs, ["out"])["out"], ref["out"], 1e-6)


def test_no_detection_gives_no_rows(tmp_path: Path) -> None:
    """ncnn has no rows to compare here (an empty Mat; YoloDetectionOutput hands on its
    input): both layers give (0, 6)."""
    inputs = ssd_inputs(np.random.default_rng(0), NUM_CLASS)
    _, graph = ncnn_run(tmp_path, [f"DetectionOutput det 3 1 loc conf prior out 0={NUM_CLASS} "
                                   "4=0.9"], inputs, [])
    assert engine_run(graph, inputs, ["out"])["out"].shape == (0, 6)
    inputs = yolo_inputs(np.random.default_rng(0), [(3, 4)], 3, 4)
    _, graph = ncnn_run(tmp_path, ["YoloDetectionOutput det 1 1 x0 out 0=4 1=3 2=0.9999 "
                                   "-23304=6,1.0,1.5,2.0,1.0,0.7,2.5"], inputs, [])
    assert engine_run(graph, inputs, ["out"])["out"].shape == (0, 6)


@pytest.mark.parametrize("extra", ["2=0.2 3=0.45", "2=0.05 3=0.3"])
def test_yolo_detection_output_controlled(tmp_path: Path, extra: str) -> None:
    inputs = yolo_inputs(np.random.default_rng(5), [(6, 7), (3, 4)], 3, 4)
    line = (f"YoloDetectionOutput det 2 1 x0 x1 out 0=4 1=3 {extra} "
            "-23304=6,1.0,1.5,2.0,1.0,0.7,2.5")
    ref, graph = ncnn_run(tmp_path, [line], inputs, ["out"])
    assert len(ref["out"]) > 10
    assert_same_detections(engine_run(graph, inputs, ["out"])["out"], ref["out"], 2e-6)


def test_ssd_net_end_to_end(tmp_path: Path) -> None:
    x = np.random.default_rng(2).uniform(-1, 1, (3, 24, 24)).astype(np.float32)
    names = ["out", "loc", "conf", "prior"]
    ref, graph = ncnn_run(tmp_path, ssd_net_lines(), {"data": x}, names)
    got = engine_run(graph, {"data": x}, names)
    for name in ("loc", "conf", "prior"):
        scale = float(np.abs(ref[name]).max())
        np.testing.assert_allclose(got[name], ref[name].reshape(got[name].shape), rtol=0,
                                   atol=0.02 * scale)
    assert len(ref["out"]) > 5
    assert_matched(got["out"], ref["out"])
    # on the engine's own feeding tensors the layer is its definition exactly
    det = graph.layers[-1]
    want = detection.ssd_detect(det.params, [got[b] for b in det.inputs])
    np.testing.assert_array_equal(got["out"], want)


@pytest.mark.parametrize("line, error", [
    ("PriorBox pb 1 1 f out 9=-233 10=-233", "param 0 \\(min_sizes\\)"),
    ("PriorBox pb 1 1 f out -23300=2,1.0,2.0 -23301=1,3.0", "param 1 \\(max_sizes\\)"),
    ("DetectionOutput det 3 1 f f f out 2=-1", "param 0 \\(num_class\\)"),
    ("DetectionOutput det 3 1 f f f out 0=3 2=-1", "param 2 \\(nms_top_k\\)"),
    ("DetectionOutput det 3 1 f f f out 0=3 3=-1", "param 3 \\(keep_top_k\\)"),
    ("YoloDetectionOutput det 1 1 f out 1=2 -23304=2,1.0,1.0", "param 4 \\(biases\\)"),
])
def test_bad_params(line: str, error: str) -> None:
    with pytest.raises(ModelFormatError, match=error):
        parse_param_text(param_text({"f": (4, 4)}, [line]), "t.param")


@pytest.mark.parametrize("line, shapes, error", [
    ("PriorBox pb 1 1 f out -23300=1,30.0 -23301=1,60.0 9=-233 10=-233", {"f": (3, 4, 4)},
     "needs the image as input 1"),
    ("PriorBox pb 1 1 f out -23300=1,30.0", {"f": (3, 4, 4)}, "image_width\\) is 0"),
    ("PriorBox pb 1 1 f out -23300=1,0.3 9=-233 10=-233", {"f": (3, 4, 4)},
     "mxnet form needs at least one"),
    ("DetectionOutput det 3 1 l c p out 0=3", {"l": (16,), "c": (12,), "p": (2, 16)}, ""),
    ("DetectionOutput det 3 1 l c p out 0=3", {"l": (16,), "c": (13,), "p": (2, 16)},
     "need 16 locations and 12 confidences"),
    ("DetectionOutput det 3 1 l c p out 0=3", {"l": (16,), "c": (12,), "p": (16,)},
     "priorbox must be 2-D"),
    ("DetectionOutput det 3 1 l c p out 0=-233", {"l": (16,), "c": (3, 4), "p": (2, 16)},
     "mxnet form"),
    ("YoloDetectionOutput det 1 1 f out 0=2 1=2 -23304=4,1.0,1.0,1.0,1.0", {"f": (13, 3, 3)},
     "expected 2 x \\(5 \\+ 2\\) channels"),
])
def test_bad_shapes(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]],
                    error: str) -> None:
    param = tmp_path / "case.param"
    param.write_text(param_text(shapes, [line]))
    if not error:
        load_model(param, None, shapes)
        return
    with pytest.raises((ShapeError, ModelFormatError), match=error):
        load_model(param, None, shapes)
