"""Yolov3DetectionOutput on Vulkan: decode and the NMS overlap bitmask on the GPU, the sort
and the greedy walk on the host (a host-finished layer, see devices.vulkan.engine.plan).

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
from vkserve.models import detection
from vkserve.models.graph import Layer

MIN_ANCHORS = 64
MAX_ANCHORS = 4096
MAX_BOX = 8  # anchor sizes in detection_decode's push constants
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


def detections_from_mask(rec: np.ndarray, mask: np.ndarray, row_bytes: int) -> np.ndarray:
    """Output rows (label + 1, conf, xmin, ymin, xmax, ymax) from the (n, 8) candidate
    records by slot and their overlap mask: the layer's stable sort by confidence (ties in
    anchor-index order), then the greedy walk."""
    order = np.lexsort((rec[:, 6], -rec[:, 5])).tolist()
    keep = greedy_walk(order, mask, row_bytes, len(rec))
    return rec[np.asarray(keep, dtype=np.intp)][:, [4, 5, 0, 1, 2, 3]].reshape(-1, 6)


def _anchors(layer: Layer, heads: Sequence[detection.Head]) -> int:
    return sum(layer.params.num_box * hd.h * hd.w for hd in heads)


def _heads(layer: Layer, in_shapes: Sequence[Shape]) -> list[detection.Head]:
    """The layer's decode constants per input head; UnsupportedError where the shaders do not
    take the layer."""
    p = layer.params
    if p.num_box > MAX_BOX:
        raise UnsupportedError(f"num_box={p.num_box} (at most {MAX_BOX})")
    heads = detection.heads(p, in_shapes)
    anchors = _anchors(layer, heads)
    if anchors > MAX_ANCHORS:
        raise UnsupportedError(f"{anchors} anchors (the overlap mask is read back whole; at "
                               f"most {MAX_ANCHORS})")
    if threshold_split(p.nms_threshold) is None:
        raise UnsupportedError(f"nms_threshold={p.nms_threshold}")
    return heads


@register("Yolov3DetectionOutput")
class VulkanYolov3DetectionOutput(VulkanLayer):
    @classmethod
    def usable(cls, caps: DeviceCaps, layer: Layer, in_shapes: Sequence[Shape]) -> bool:
        """Whether the Plan should run the layer here rather than on its host tail."""
        if not caps.features.get("shaderFloat64"):
            return False
        try:
            heads = _heads(layer, in_shapes)
        except UnsupportedError:
            return False
        return _anchors(layer, heads) >= MIN_ANCHORS

    @staticmethod
    def host_step(layer: Layer, in_shapes: Sequence[Shape]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """The layer on the host in fp32 (`vkserve.models.detection.detect`), for the Plan's
        host tail."""
        heads = detection.heads(layer.params, in_shapes)
        return lambda xs: [detection.detect(layer.params, heads, xs)]

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        self.heads = _heads(layer, in_shapes)
        self.capacity = _anchors(layer, self.heads)
        self.words = -(-self.capacity // 32)
        split = threshold_split(self.params.nms_threshold)
        assert split is not None
        self.split = split
        self.elem = 4 if precision is Precision.FP32 else 2
        self.nbytes = {"counter": 4, "records": self.capacity * RECORD_FLOATS * 4,
                       "mask": self.capacity * self.words * 4}

    def scratch(self) -> dict[str, int]:
        return {k: -(-n // self.elem) for k, n in self.nbytes.items()}

    def host_readback(self) -> dict[str, int]:
        return dict(self.nbytes)

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        conf_thr = float(np.float32(p.confidence_threshold))
        out = [Dispatch("detection_reset", ("s:counter",), (1, 1, 1), local_size=(1, 1, 1))]
        for name, hd in zip(self.layer.inputs, self.heads):
            bias = np.zeros((2, MAX_BOX), np.float32)  # widths, heights
            bias[0, :p.num_box], bias[1, :p.num_box] = hd.bias_w, hd.bias_h
            push = (hd.w, hd.h, p.num_box, p.num_class, hd.base, float(hd.net_w),
                    float(hd.net_h), conf_thr, *(float(v) for v in bias.ravel()))
            out.append(Dispatch("detection_decode", (name, "s:counter", "s:records"),
                                (hd.w * hd.h, p.num_box, 1), push))
        thr, half = self.split
        out.append(Dispatch("detection_mask", ("s:counter", "s:records", "s:mask"),
                            (self.capacity, self.words, 1), (self.words, thr, half)))
        return out

    def candidates(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        """The decoded candidates of the last run, (n, 8) float32 by slot (see the module doc)."""
        n = min(int(raw["counter"].view(np.uint32)[0]), self.capacity)
        return raw["records"].view(np.float32).reshape(-1, RECORD_FLOATS)[:n]

    def finish_on_host(self, raw: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [detections_from_mask(self.candidates(raw), raw["mask"], self.words * 4)]
