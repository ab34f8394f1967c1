"""Yolov3DetectionOutput on Vulkan (devices/vulkan/layers/detection.py) against the layer's
definition (models/detection.py), on lavapipe.

- yolov4-tiny's real feeding tensors (random weights): same rows in the same order, values
  equal up to float32 rounding of the decode; and the NMS over the GPU's own candidates is
  the definition's NMS exactly;
- random boxes with tied scores, duplicates, touching, nested and threshold-edge pairs: the
  overlap mask is numpy's float32 `IoU > threshold` bit for bit, and the kept rows are
  `nms_sorted`'s;
- routing: small layers, devices without doubles and a layer reading the host-side output.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.paths import MODELS_DIR
from tests.support.vulkan_engine import cpu_forward, engine_device, graph_of, storage_round
from vkserve.devices.capabilities import Precision
from vkserve.devices.cpu.executor import Plan as CpuPlan
from vkserve.devices.reference import random_inputs
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.dispatch import dispatch
from vkserve.devices.vulkan.engine.plan import Plan, PlanError
from vkserve.devices.vulkan.layers import detection as vdet
from vkserve.devices.vulkan.shader_registry import builtin_shader
from vkserve.models import detection
from vkserve.models.detection import nms_sorted, overlaps
from vkserve.models.graph import load_model

__all__ = ["engine_device"]  # the fixture, imported for pytest

YOLO = MODELS_DIR / "yolov4-tiny.param"


def capture_candidates(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """Record the decoded candidates (by slot) every finish_on_host call sees."""
    seen: list[np.ndarray] = []
    original = vdet.VulkanYolov3DetectionOutput.candidates

    def candidates(self, raw):  # type: ignore[no-untyped-def]
        rec = original(self, raw)
        seen.append(rec.copy())
        return rec

    monkeypatch.setattr(vdet.VulkanYolov3DetectionOutput, "candidates", candidates)
    return seen


def nms_of_records(rec: np.ndarray, threshold: float) -> np.ndarray:
    """The definition's sort and NMS applied to candidate records: rows in anchor-index order
    (the heads' concatenation), stable sort by -confidence, nms_sorted."""
    rows = rec[np.argsort(rec[:, 6], kind="stable")][:, [4, 5, 0, 1, 2, 3]]
    rows = rows[np.argsort(-rows[:, 1], kind="stable")]
    return rows[nms_sorted(rows[:, 2:6], threshold)].reshape(-1, 6)


def by_score_then_box(rows: np.ndarray) -> np.ndarray:
    """Rows by descending score, equal scores by their box: the GPU numbers candidates in
    another order than the definition's decode, so candidates that tie in score may come in
    either order before the NMS (which keeps both: the threshold is infinite here)."""
    box = np.round(rows[:, 2:6], 4)
    return rows[np.lexsort((box[:, 3], box[:, 2], box[:, 1], box[:, 0], -rows[:, 1]))]


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_ARITHMETIC],
                         ids=["fp32", "fp16"])
def test_yolov4_tiny_feeding_tensors(engine_device: VulkanDevice, precision: Precision,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(YOLO, None)
    det = next(lay for lay in model.layers if lay.type == "Yolov3DetectionOutput")
    shapes = {b: model.blob_shapes[b] for b in det.inputs}
    # the model's own feeding tensors (CPU engine, seeded input), as the device stores them
    inputs = random_inputs({n: model.blob_shapes[n] for n in model.input_names})
    cpu_plan = CpuPlan(model, {n: a.shape for n, a in inputs.items()}, outputs=det.inputs)
    feeding = cpu_plan.run(inputs)
    feeding = {b: storage_round(feeding[b], precision) for b in det.inputs}

    tokens = next(t for t in (ln.split() for ln in YOLO.read_text().splitlines())
                  if t[:2] == [det.type, det.name])
    line = " ".join([*tokens[:4], *det.inputs, "out", *tokens[4 + len(det.inputs) + 1:]])
    graph = graph_of([line], shapes)
    seen = capture_candidates(monkeypatch)
    with Plan(engine_device, graph, None, precision) as plan:
        assert plan.summary()["host_finish"] == [det.name] and plan.summary()["host_tail"] == []
        got = plan.run(feeding)["out"]
    want = cpu_forward(graph, feeding)["out"]
    assert len(want) > 500  # random weights: hundreds of boxes survive
    assert got.shape == want.shape
    np.testing.assert_array_equal(got[:, 0], want[:, 0])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # the GPU's candidates are the definition's decode (up to rounding); the NMS over them is exact
    (rec,) = seen
    monkeypatch.setattr(detection, "nms_sorted", lambda b, t: range(len(b)))
    decoded = detection.detect(det.params, detection.heads(det.params, list(shapes.values())),
                               [feeding[b] for b in det.inputs])
    assert len(rec) == len(decoded)
    np.testing.assert_allclose(by_score_then_box(nms_of_records(rec, np.inf))[:, 1:],
                               by_score_then_box(decoded)[:, 1:], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got, nms_of_records(rec, det.params.nms_threshold))


def random_boxes(rng: np.random.Generator, n: int, threshold: float) -> np.ndarray:
    """(n, 4) boxes: grid coordinates (shared edges, touching and nested boxes, exact IoU
    values such as 0.5 and 9/20), duplicates, random floats, zero-area boxes, and boxes
    (0, 0, 1, a) nested in (0, 0, 1, 1) with float32 IoU a on each side of the threshold
    (the float32 just below numpy's cut and the next one up included)."""
    x0 = rng.integers(0, 24, n) / 8.0
    y0 = rng.integers(0, 24, n) / 8.0
    boxes = np.stack([x0, y0, x0 + rng.integers(1, 12, n) / 8.0,
                      y0 + rng.integers(1, 12, n) / 8.0], axis=1)
    k = n // 8
    boxes[:k] = boxes[rng.integers(0, n, k)]  # duplicates
    f = rng.uniform(0, 3, (k, 2))
    boxes[k:2 * k] = np.concatenate([f, f + rng.uniform(1e-3, 1.5, (k, 2))], axis=1)
    touch = boxes[2 * k:3 * k].copy()  # share an edge with a box of the grid part
    touch[:, [0, 2]] += (touch[:, 2] - touch[:, 0])[:, None]
    boxes[3 * k:4 * k] = touch
    # nested pairs with IoU exactly 9/20 (0.45) and 1/2
    boxes[4 * k] = (0, 0, 3, 3)
    boxes[4 * k + 1] = (0, 0, 4, 5)
    boxes[4 * k + 2] = (1, 1, 2, 2)
    boxes[4 * k + 3] = (1, 1, 3, 2)
    boxes[4 * k + 4] = (5, 5, 5, 6)  # zero area
    boxes[4 * k + 5] = (5, 5, 5, 6)
    thr, _ = vdet.threshold_split(threshold)
    a = np.float32(thr) + np.arange(-20, 21, dtype=np.float32) * np.spacing(np.float32(thr))
    edge = 5 * k
    boxes[edge] = (0, 0, 1, 1)
    boxes[edge + 1:edge + 1 + len(a)] = np.stack([0 * a, 0 * a, 0 * a + 1, a], axis=1)
    return boxes.astype(np.float32)


@pytest.fixture(scope="module")
def mask_spirv(engine_device: VulkanDevice) -> bytes:
    return compile_glsl(builtin_shader("detection_mask").source, caps=engine_device.caps,
                        precision=Precision.FP32, name="detection_mask.comp")


@pytest.mark.parametrize("threshold", [0.45, 0.5, 1 / 3, 0.7, 0.3000001])
@pytest.mark.parametrize("seed", [0, 1])
def test_mask_and_nms_on_random_boxes(engine_device: VulkanDevice, mask_spirv: bytes,
                                      threshold: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, capacity = 700, 720
    boxes = random_boxes(rng, n, threshold)
    rec = np.zeros((capacity, 8), np.float32)
    rec[:n, 0:4] = boxes
    rec[:n, 4] = rng.integers(1, 4, n)  # label + 1
    rec[:n, 5] = rng.integers(0, 12, n) / 16.0 + 0.25  # many tied scores
    rec[:n, 6] = rng.permutation(4 * n)[:n]  # anchor indices, slots in arbitrary order
    rec[n:] = np.nan  # past the counter: never read
    words = -(-capacity // 32)
    split = vdet.threshold_split(threshold)
    assert split is not None
    counter = np.array([n], np.uint32)
    mask = np.full(capacity * words, 0xDEADBEEF, np.uint32)
    _, _, mask = dispatch(engine_device.ctx, mask_spirv, [counter, rec, mask],
                          global_size=(capacity, words, 1), local_size=(64, 1, 1),
                          push_constants=[words, *split])
    mask = mask.reshape(capacity, words)
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    want = overlaps(boxes, areas, boxes, areas, threshold)
    bits = np.unpackbits(mask[:n].view(np.uint8), axis=1, bitorder="little")[:, :n].astype(bool)
    np.testing.assert_array_equal(bits, want)
    got = vdet.detections_from_mask(rec[:n], mask.view(np.uint8), words * 4)
    np.testing.assert_array_equal(got, nms_of_records(rec[:n], threshold))


def test_threshold_split_matches_numpy() -> None:
    for threshold in (0.45, 0.5, 1 / 3, 0.3000001, 0.7, 1.0):
        thr, half = vdet.threshold_split(threshold)
        t = np.float32(thr)
        up = np.nextafter(t, np.float32(np.inf))
        assert not (np.array([t]) > threshold)[0] and (np.array([up]) > threshold)[0]
        assert float(up) - float(t) == 2 * half
    assert vdet.threshold_split(float("nan")) is None and vdet.threshold_split(0.0) is None


DET = ("Yolov3DetectionOutput det 1 1 x out 0=2 1=2 2=0.3 3=0.45 "
       "-23304=4,10.0,14.0,23.0,27.0 -23305=2,0.0,1.0 -23306=1,32.0")


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_STORAGE,
                                       Precision.FP16_ARITHMETIC], ids=lambda p: p.value)
def test_plan_runs_detection_on_the_device(engine_device: VulkanDevice,
                                           precision: Precision) -> None:
    graph = graph_of(["Sigmoid s 1 1 x0 x", DET], {"x0": (14, 12, 12)})
    x0 = np.random.default_rng(3).uniform(-4, 4, (14, 12, 12)).astype(np.float32)
    with Plan(engine_device, graph, None, precision, outputs=["out", "x"]) as plan:
        assert plan.summary()["host_finish"] == ["det"]
        got = plan.run({"x0": x0})
        again = plan.run({"x0": x0})  # the counter is reset every run
    # the definition on the device's own feeding tensor (as stored: fp16 in the fp16 modes)
    p = graph.layers[-1].params
    want = detection.detect(p, detection.heads(p, [(14, 12, 12)]), [got["x"]])
    assert len(want) > 10
    np.testing.assert_array_equal(got["out"], again["out"])
    assert got["out"].shape == want.shape
    np.testing.assert_array_equal(got["out"][:, 0], want[:, 0])
    np.testing.assert_allclose(got["out"], want, rtol=0, atol=1e-6)


def test_host_tail_without_doubles_or_for_small_layers(engine_device: VulkanDevice,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(4).uniform(-4, 4, (14, 12, 12)).astype(np.float32)
    graph = graph_of([DET], {"x": (14, 12, 12)})
    want = cpu_forward(graph, {"x": x})["out"]
    monkeypatch.setitem(engine_device.caps.features, "shaderFloat64", 0)
    with Plan(engine_device, graph, None, Precision.FP32) as plan:
        assert plan.summary()["host_tail"] == ["det"] and plan.summary()["host_finish"] == []
        np.testing.assert_array_equal(plan.run({"x": x})["out"], want)
    monkeypatch.undo()
    small = graph_of([DET], {"x": (14, 4, 4)})  # 32 anchors: below MIN_ANCHORS
    with Plan(engine_device, small, None, Precision.FP32) as plan:
        assert plan.summary()["host_tail"] == ["det"]


def test_a_layer_reading_the_host_output_is_refused(engine_device: VulkanDevice) -> None:
    graph = graph_of([DET, "Sigmoid s 1 1 out y"], {"x": (14, 12, 12)})
    with pytest.raises(PlanError, match="reads a host-side output"):
        Plan(engine_device, graph, None, Precision.FP32)
