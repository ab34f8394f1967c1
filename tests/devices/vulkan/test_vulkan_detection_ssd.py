"""PriorBox, DetectionOutput (SSD) and YoloDetectionOutput (YOLOv2) on Vulkan (lavapipe)
against the ncnn package, in fp32, fp16 storage and fp16 arithmetic.

- PriorBox (a constant of the plan) over its forms: within the mode's tolerance of ncnn;
- DetectionOutput and YoloDetectionOutput on controlled inputs (tests/support/
  detection_cases: fp16-exact values, clustered boxes, distinct or tied scores), decoded and
  masked on the device: ncnn's rows in ncnn's order, values within float32 rounding; a
  small one runs on the host tail;
- a small SSD end to end: detections matched to ncnn's, and on the device's own feeding
  tensors the layer's definition row for row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.detection_cases import (
    NUM_CLASS,
    assert_matched,
    assert_same_detections,
    ssd_inputs,
    ssd_net_lines,
    yolo_inputs,
)
from tests.support.params import param_text
from tests.support.vulkan_engine import MODES, check_against_ncnn, engine_device, storage_round
from vkserve.devices.capabilities import Precision
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models import detection
from vkserve.models.graph import Graph, load_model
from vkserve.models.weights import write_bin

__all__ = ["engine_device"]  # the fixture, imported for pytest

IDS = [m.value for m in MODES]

PRIORBOX = [
    ("PriorBox pb 2 1 f img out -23300=2,30.0,45.0 -23301=2,60.0,90.0 -23302=2,2.0,3.0 "
     "9=-233 10=-233 13=0.5", {"f": (3, 5, 7), "img": (3, 300, 280)}),
    ("PriorBox pb 1 1 f out -23300=1,30.0 -23302=2,2.0,0.5 7=0 8=1 9=300 10=200 11=16.0 "
     "12=20.0 13=0.5 14=1 15=1", {"f": (3, 5, 7)}),
    ("PriorBox pb 1 1 f out -23300=2,0.3,0.1 -23302=3,1.0,2.0,0.5 9=-233 10=-233 13=0.5 8=1",
     {"f": (3, 5, 7)}),
]


@pytest.mark.parametrize("precision", MODES, ids=IDS)
@pytest.mark.parametrize("case", range(len(PRIORBOX)))
def test_priorbox(tmp_path: Path, engine_device: VulkanDevice, case: int,
                  precision: Precision) -> None:
    line, shapes = PRIORBOX[case]
    check_against_ncnn(tmp_path, engine_device, line, shapes, precision)


def ncnn_and_graph(tmp_path: Path, lines: list[str], inputs: dict[str, np.ndarray],
                   outputs: list[str]) -> tuple[dict[str, np.ndarray], Graph]:
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    shapes = {k: v.shape for k, v in inputs.items()}
    param.write_text(param_text(shapes, lines))
    graph = load_model(param, None, shapes, seed=7)
    write_bin(graph.layers, bin_path)
    return run_ncnn(param, bin_path, inputs, outputs), graph


def run_plan(device: VulkanDevice, graph: Graph, inputs: dict[str, np.ndarray],
             precision: Precision, outputs: list[str], where: str = "host_finish"
             ) -> dict[str, np.ndarray]:
    """Run twice (the second run must repeat the first: counters are reset) and check where
    the detection layer ran (`host_finish`: decoded on the device; `host_tail`: on the host)."""
    with Plan(device, graph, None, precision, outputs=outputs) as plan:
        assert plan.summary()[where] == ["det"]
        got = plan.run(inputs)
        again = plan.run(inputs)
    for name in outputs:
        np.testing.assert_array_equal(got[name], again[name])
    return got


SSD_CASES = [
    ("4=0.1", {}),
    ("1=0.25 2=5 3=7 4=0.1", {}),
    ("1=0.45 4=0.2", {"ties": True}),
    ("1=0.45 4=0.1 5=0.2 6=0.2 7=0.1 8=0.1", {"mxnet": True}),
    ("1=0.45 4=0.1 2=1000 3=1000", {"edge": True}),
]


@pytest.mark.parametrize("precision", MODES, ids=IDS)
@pytest.mark.parametrize("case", range(len(SSD_CASES)))
def test_detection_output_controlled(tmp_path: Path, engine_device: VulkanDevice, case: int,
                                     precision: Precision) -> None:
    extra, form = SSD_CASES[case]
    mxnet = bool(form.get("mxnet"))
    inputs = ssd_inputs(np.random.default_rng(case), NUM_CLASS, mxnet=mxnet,
                        ties=bool(form.get("ties")), edge=bool(form.get("edge")))
    line = f"DetectionOutput det 3 1 loc conf prior out 0={-233 if mxnet else NUM_CLASS} {extra}"
    ref, graph = ncnn_and_graph(tmp_path, [line], inputs, ["out"])
    assert len(ref["out"]) > 3
    got = run_plan(engine_device, graph, inputs, precision, ["out"])["out"]
    assert_same_detections(got, ref["out"], 2e-6)


def test_small_detection_output_runs_on_the_host(tmp_path: Path,
                                                 engine_device: VulkanDevice) -> None:
    inputs = ssd_inputs(np.random.default_rng(4), NUM_CLASS)
    keep = 40  # priors: below MIN_ANCHORS
    inputs["loc"] = inputs["loc"][:4 * keep]
    inputs["conf"] = inputs["conf"][:NUM_CLASS * keep]
    inputs["prior"] = np.ascontiguousarray(inputs["prior"][:, :4 * keep])
    line = f"DetectionOutput det 3 1 loc conf prior out 0={NUM_CLASS} 4=0.1"
    ref, graph = ncnn_and_graph(tmp_path, [line], inputs, ["out"])
    got = run_plan(engine_device, graph, inputs, Precision.FP32, ["out"], "host_tail")["out"]
    assert_same_detections(got, ref["out"], 1e-6)


@pytest.mark.parametrize("precision", MODES, ids=IDS)
def test_yolo_detection_output_controlled(tmp_path: Path, engine_device: VulkanDevice,
                                          precision: Precision) -> None:
    inputs = yolo_inputs(np.random.default_rng(5), [(6, 7), (3, 4)], 3, 4)
    line = ("YoloDetectionOutput det 2 1 x0 x1 out 0=4 1=3 2=0.2 3=0.45 "
            "-23304=6,1.0,1.5,2.0,1.0,0.7,2.5")
    ref, graph = ncnn_and_graph(tmp_path, [line], inputs, ["out"])
    assert len(ref["out"]) > 10
    got = run_plan(engine_device, graph, inputs, precision, ["out"])["out"]
    assert_same_detections(got, ref["out"], 1e-5)


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_ARITHMETIC],
                         ids=["fp32", "fp16"])
def test_ssd_net_end_to_end(tmp_path: Path, engine_device: VulkanDevice,
                            precision: Precision) -> None:
    x = np.random.default_rng(2).uniform(-1, 1, (3, 24, 24)).astype(np.float32)
    names = ["out", "loc", "conf", "prior"]
    ref, graph = ncnn_and_graph(tmp_path, ssd_net_lines(), {"data": x}, names)
    got = run_plan(engine_device, graph, {"data": x}, precision, names)
    for name in ("loc", "conf", "prior"):
        scale = float(np.abs(ref[name]).max())
        np.testing.assert_allclose(got[name], ref[name].reshape(got[name].shape), rtol=0,
                                   atol=(1e-4 if precision is Precision.FP32 else 2e-2) * scale)
    assert len(ref["out"]) > 5
    assert_matched(got["out"], ref["out"])
    # on the device's own feeding tensors (as stored) the layer is its definition
    det = graph.layers[-1]
    want = detection.ssd_detect(det.params, [storage_round(got[b], precision) for b in det.inputs])
    assert_same_detections(got["out"], want, 1e-6)


def test_small_yolo_and_empty_outputs(tmp_path: Path, engine_device: VulkanDevice) -> None:
    """A YoloDetectionOutput of 36 anchors runs on the host tail; no detection gives (0, 6)
    rows on the device path (ncnn has no rows to compare: see the layers' docs)."""
    inputs = yolo_inputs(np.random.default_rng(6), [(3, 4)], 3, 4)
    line = ("YoloDetectionOutput det 1 1 x0 out 0=4 1=3 2=0.2 3=0.45 "
            "-23304=6,1.0,1.5,2.0,1.0,0.7,2.5")
    ref, graph = ncnn_and_graph(tmp_path, [line], inputs, ["out"])
    got = run_plan(engine_device, graph, inputs, Precision.FP32, ["out"], "host_tail")["out"]
    assert_same_detections(got, ref["out"], 1e-6)
    ssd = ssd_inputs(np.random.default_rng(0), NUM_CLASS)
    _, graph = ncnn_and_graph(tmp_path, [f"DetectionOutput det 3 1 loc conf prior out "
                                         f"0={NUM_CLASS} 4=0.9"], ssd, [])
    assert run_plan(engine_device, graph, ssd, Precision.FP32, ["out"])["out"].shape == (0, 6)
