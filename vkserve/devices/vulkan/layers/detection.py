"""The detection layers on Vulkan: PriorBox is a constant computed at plan time; the detection
outputs (Yolov3DetectionOutput, YoloDetectionOutput, DetectionOutput) decode and build the NMS
overlap bitmask on the GPU and sort and walk on the host (host-finished layers, see
devices.vulkan.engine.plan). Yolov3DetectionOutput is described below; the other two differ
in their decode shader and their host part only (see their classes).

Semantics are the layer's (vkserve.models.detection): ncnn's confidence formula, the decode, a
stable sort by confidence, class-agnostic greedy NMS with numpy's float32 IoU; rows
(label + 1, confidence, xmin, ymin, xmax, ymax).

Dispatches (one command buffer with the rest of the model):

1. ``detection_reset`` zeroes the candidate counter;
2. ``detection_decode`` per input head: every anchor cell's confidence; a cell that passes
   the threshold is decoded and appended to ``records`` (slot from an atomic counter), with
   its anchor index (its row in the concatenation of all heads' candidates, before the sort);
3. ``detection_mask``: bit j of row i = IoU(candidate i, candidate j) > nms_threshold, over
   slots (torchvision's CUDA NMS mask in 32-bit words, but for every j: slots are unsorted).

After the fence the host reads back the counter, the records and the mask, sorts the slots by
(confidence descending, anchor index ascending) (the layer's stable sort) and walks
them greedily: a slot is kept unless its bit is set in the OR of the kept slots' rows (Python
ints as bitsets: one shift/test and one OR of ~n/32 words per step).

Identical to `vkserve.models.detection.detect` up to float32 rounding of the decode (GPU
exp/division are not correctly rounded): the IoU test itself is exact (see
detection_mask.comp). The Plan's host tail runs `detect` itself (`usable` False) on devices
without shaderFloat64, below MIN_ANCHORS (a few dozen boxes cost the host microseconds) or
above MAX_ANCHORS (the mask, anchors^2 / 8 bytes, is read back whole), and for thresholds or
anchor setups the shaders do not take.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.errors import UnsupportedError
from vkserve.devices.vulkan.layers.base import Dispatch, Shape, VulkanLayer, register
from vkserve.devices.vulkan.layers.shape import contiguous_strides, strided_copy
from vkserve.models import detection
from vkserve.models.graph import Layer

MIN_ANCHORS = 64
MAX_ANCHORS = 4096
MAX_BOX = 8  # anchor sizes in the YOLO decode shaders' push constants
RECORD_FLOATS = 8  # (xmin, ymin, xmax, ymax), (label + 1, conf, anchor index, 0)


def threshold_split(threshold: float) -> tuple[float, float] | None:
    """(thr, half_ulp) for detection_mask.comp: thr is the largest float32 t for which numpy's
    ``float32 array > threshold`` is false at t (the layer's comparison), and half_ulp
    half the step to the next float32. None where the shader cannot take it (not finite, or
    so small or large that half_ulp is not a normal float32)."""
    threshold = float(threshold)
    if not math.isfinite(threshold) or not 2.0 ** -100 <= abs(threshold) <= 2.0 ** 100:
        return None

    def passes(v: np.float32) -> bool:
        return bool((np.array([v], np.float32) > threshold)[0])

    inf = np.float32(np.inf)
    t = np.float32(threshold)
    while passes(t):
        t = np.nextafter(t, -inf)
    while not passes(np.nextafter(t, inf)):
        t = np.nextafter(t, inf)
    return float(t), (float(np.nextafter(t, inf)) - float(t)) / 2


def greedy_walk(order: Sequence[int], mask: np.ndarray, row_bytes: int, n: int) -> list[int]:
    """Greedy NMS over an overlap bitmask: visit slots in `order`, keep one unless a kept slot
    overlaps it. Row s of `mask` (uint8, little-endian 32-bit words, `row_bytes` per row)
    has bit j set when slots s and j overlap; only bits below `n` are read."""
    mb = memoryview(np.ascontiguousarray(mask)).cast("B")
    nbytes = -(-n // 32) * 4
    frombytes = int.from_bytes
    removed = 0
    keep: list[int] = []
    for s in order:
        if removed >> s & 1:
            continue
        keep.append(s)
        o = s * row_bytes
        removed |= frombytes(mb[o:o + nbytes], "little")
    return keep


def stable_order(rec: np.ndarray) -> np.ndarray:
    """Yolov3DetectionOutput's sort of candidate records: confidence descending, ties in
    anchor-index order."""
    return np.lexsort((rec[:, 6], -rec[:, 5]))


def ncnn_order(rec: np.ndarray) -> np.ndarray:
    """YoloDetectionOutput's sort of candidate records: ncnn's quicksort over the candidates
    in anchor-index order (`vkserve.models.detection.descending_order`)."""
    by_anchor = np.argsort(rec[:, 6], kind="stable")
    return by_anchor[detection.descending_order(rec[by_anchor, 5])]


def detections_from_mask(rec: np.ndarray, mask: np.ndarray, row_bytes: int,
                         sort: Callable[[np.ndarray], np.ndarray] = stable_order) -> np.ndarray:
    """Output rows (label + 1, conf, xmin, ymin, xmax, ymax) from the (n, 8) candidate
    records by slot and their overlap mask: the layer's sort, then the greedy walk."""
    keep = greedy_walk(sort(rec).tolist(), mask, row_bytes, len(rec))
    return rec[np.asarray(keep, dtype=np.intp)][:, [4, 5, 0, 1, 2, 3]].reshape(-1, 6)


class _MaskedDetection(VulkanLayer):
    """A detection output whose decode shader appends candidates to `records` (slot from an
    atomic counter, RECORD_FLOATS each, the box first) and whose NMS overlap mask over the
    slots is built by detection_mask.comp; the host reads them back and finishes.

    NAN_OVERLAPS is the layer's treatment of an IoU of NaN (`vkserve.models.detection`).
    Subclasses give `capacity` (the most candidates, raising UnsupportedError where the
    shaders do not take the layer), `decode` (the dispatches between the counter reset and
    the mask), `extra` (more scratch to read back, bytes) and `finish_on_host`."""

    NAN_OVERLAPS = detection.NAN_OVERLAPS

    @classmethod
    def capacity(cls, layer: Layer, in_shapes: Sequence[Shape]) -> int:
        raise NotImplementedError

    @classmethod
    def usable(cls, caps: DeviceCaps, layer: Layer, in_shapes: Sequence[Shape]) -> bool:
        """Whether the Plan should run the layer here rather than on its host tail: the mask
        needs doubles, a few dozen candidates cost the host microseconds, and the mask
        (capacity^2 / 8 bytes) is read back whole."""
        if not caps.features.get("shaderFloat64"):
            return False
        if threshold_split(layer.params.nms_threshold) is None:
            return False
        try:
            return MIN_ANCHORS <= cls.capacity(layer, in_shapes) <= MAX_ANCHORS
        except UnsupportedError:
            return False

    @staticmethod
    def host_step(layer: Layer, in_shapes: Sequence[Shape]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """The layer on the host in fp32 (its definition in `vkserve.models.detection`), for
        the Plan's host tail."""
        raise NotImplementedError

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        self.slots = self.capacity(layer, in_shapes)
        if self.slots > MAX_ANCHORS:
            raise UnsupportedError(f"{self.slots} candidates (the overlap mask is read back "
                                   f"whole; at most {MAX_ANCHORS})")
        split = threshold_split(self.params.nms_threshold)
        if split is None:
            raise UnsupportedError(f"nms_threshold={self.params.nms_threshold}")
        self.split = split
        self.words = -(-self.slots // 32)
        self.elem = 4 if precision is Precision.FP32 else 2
        self.nbytes = {"counter": 4, "records": self.slots * RECORD_FLOATS * 4,
                       "mask": self.slots * self.words * 4, **self.extra()}

    def extra(self) -> dict[str, int]:
        return {}

    def scratch(self) -> dict[str, int]:
        return {k: -(-n // self.elem) for k, n in self.nbytes.items()}

    def host_readback(self) -> dict[str, int]:
        return dict(self.nbytes)

    def decode(self) -> list[Dispatch]:
        raise NotImplementedError

    def dispatches(self) -> list[Dispatch]:
        thr, half = self.split
        return [Dispatch("detection_reset", ("s:counter",), (1, 1, 1), local_size=(1, 1, 1)),
                *self.decode(),
                Dispatch("detection_mask", ("s:counter", "s:records", "s:mask"),
                         (self.slots, self.words, 1), (self.words, thr, half),
                         (int(self.NAN_OVERLAPS),))]

    def candidates(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        """The decoded candidates of the last run, (n, 8) float32 by slot."""
        n = min(int(raw["counter"].view(np.uint32)[0]), self.slots)
        return raw["records"].view(np.float32).reshape(-1, RECORD_FLOATS)[:n]


def _yolo_bias_push(bias_w: Sequence[float], bias_h: Sequence[float]) -> tuple[float, ...]:
    """Anchor widths then heights, each padded to MAX_BOX (the decode shaders' vec4 pairs)."""
    bias = np.zeros((2, MAX_BOX), np.float32)
    bias[0, :len(bias_w)], bias[1, :len(bias_h)] = bias_w, bias_h
    return tuple(float(v) for v in bias.ravel())


def _yolo_anchors(num_box: int, in_shapes: Sequence[Shape]) -> int:
    if num_box > MAX_BOX:
        raise UnsupportedError(f"num_box={num_box} (at most {MAX_BOX})")
    return sum(num_box * h * w for _, h, w in in_shapes)


@register("Yolov3DetectionOutput")
class VulkanYolov3DetectionOutput(_MaskedDetection):
    NAN_OVERLAPS = False
    @classmethod
    def capacity(cls, layer: Layer, in_shapes: Sequence[Shape]) -> int:
        return _yolo_anchors(layer.params.num_box, in_shapes)

    @staticmethod
    def host_step(layer: Layer, in_shapes: Sequence[Shape]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        heads = detection.heads(layer.params, in_shapes)
        return lambda xs: [detection.detect(layer.params, heads, xs)]

    def decode(self) -> list[Dispatch]:
        p = self.params
        conf_thr = float(np.float32(p.confidence_threshold))
        out = []
        for name, hd in zip(self.layer.inputs, detection.heads(p, self.in_shapes)):
            push = (hd.w, hd.h, p.num_box, p.num_class, hd.base, float(hd.net_w),
                    float(hd.net_h), conf_thr, *_yolo_bias_push(hd.bias_w, hd.bias_h))
            out.append(Dispatch("detection_decode", (name, "s:counter", "s:records"),
                                (hd.w * hd.h, p.num_box, 1), push))
        return out

    def finish_on_host(self, raw: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [detections_from_mask(self.candidates(raw), raw["mask"], self.words * 4)]


@register("YoloDetectionOutput")
class VulkanYoloDetectionOutput(_MaskedDetection):
    """detection_yolo2_decode.comp per input (the softmax over the classes included), then
    the mask; the host sorts the candidates as ncnn does (`ncnn_order`) and walks the mask."""

    @classmethod
    def capacity(cls, layer: Layer, in_shapes: Sequence[Shape]) -> int:
        return _yolo_anchors(layer.params.num_box, in_shapes)

    @staticmethod
    def host_step(layer: Layer, in_shapes: Sequence[Shape]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        return lambda xs: [detection.yolo_v2_detect(layer.params, xs)]

    def decode(self) -> list[Dispatch]:
        p = self.params
        conf_thr = float(np.float32(p.confidence_threshold))
        bias = _yolo_bias_push(p.biases[0:2 * p.num_box:2], p.biases[1:2 * p.num_box:2])
        out, base = [], 0
        for name, (c, h, w) in zip(self.layer.inputs, self.in_shapes):
            push = (w, h, p.num_box, p.num_class, base, c // p.num_box, conf_thr, 0, *bias)
            out.append(Dispatch("detection_yolo2_decode", (name, "s:counter", "s:records"),
                                (w * h, p.num_box, 1), push))
            base += p.num_box * h * w
        return out

    def finish_on_host(self, raw: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [detections_from_mask(self.candidates(raw), raw["mask"], self.words * 4,
                                     ncnn_order)]


@register("DetectionOutput")
class VulkanDetectionOutput(_MaskedDetection):
    """detection_ssd_decode.comp decodes every prior with a class (not the background) above
    the confidence threshold into a slot, with the prior's index and all its class scores
    (fp32 scratch `scores`); the mask covers those slots. The host runs the layer's selection
    (`vkserve.models.detection.ssd_select`) over the slots in prior order, the per-class
    NMS walking the mask (the overlaps are geometric, so one mask serves every class)."""

    @classmethod
    def capacity(cls, layer: Layer, in_shapes: Sequence[Shape]) -> int:
        num_prior, _ = layer.params.layout(list(in_shapes))
        return num_prior

    @staticmethod
    def host_step(layer: Layer, in_shapes: Sequence[Shape]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        return lambda xs: [detection.ssd_detect(layer.params, xs)]

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        _, self.num_class = layer.params.layout(list(in_shapes))
        super().__init__(layer, in_shapes, out_shapes, precision)

    def extra(self) -> dict[str, int]:
        return {"scores": self.slots * self.num_class * 4}

    def decode(self) -> list[Dispatch]:
        p = self.params
        loc, conf, prior = self.layer.inputs[:3]
        push = (self.slots, self.num_class, int(p.mxnet_style), self.in_shapes[2][-1],
                float(np.float32(p.confidence_threshold)), float(p.variance0),
                float(p.variance1), float(p.variance2), float(p.variance3))
        return [Dispatch("detection_ssd_decode",
                         (loc, conf, prior, "s:counter", "s:records", "s:scores"),
                         (self.slots, 1, 1), push)]

    def finish_on_host(self, raw: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        rec = self.candidates(raw)
        n = len(rec)
        scores = raw["scores"].view(np.float32).reshape(-1, self.num_class)[:n]
        by_prior = np.argsort(rec[:, 4], kind="stable")
        row_bytes = self.words * 4

        def nms(label: np.ndarray, score: np.ndarray, cand: np.ndarray) -> np.ndarray:
            order = detection.descending_order(score)[:self.params.nms_top_k]
            slots = by_prior[cand[order]]
            keep = greedy_walk(slots.tolist(), raw["mask"], row_bytes, n)
            at = {s: k for k, s in enumerate(slots.tolist())}
            kept = order[np.asarray([at[s] for s in keep], dtype=np.intp)]
            return np.concatenate([label[kept, None], score[kept, None],
                                   rec[by_prior[cand[kept]], :4]], axis=1)

        return [detection.ssd_select(self.params, rec[by_prior, :4], scores[by_prior], nms)]


@register("PriorBox")
class VulkanPriorBox(VulkanLayer):
    """The priors depend on the input shapes only: computed at plan time
    (`vkserve.models.detection.prior_boxes`), uploaded once as a weight and copied into the
    output blob each run (so later layers may take its bytes over, as with MemoryData)."""

    def weights(self) -> dict[str, np.ndarray]:
        return {"priors": detection.prior_boxes(self.params, self.in_shapes).ravel()}

    def dispatches(self) -> list[Dispatch]:
        shape = self.out_shapes[0]
        strides = contiguous_strides(shape)
        return [strided_copy("w:priors", self.layer.outputs[0], shape, strides, strides)]
