"""The detection layers: their own definitions (``vkserve.models.detection``), in fp32.

Detection outputs (Yolov3DetectionOutput, YoloDetectionOutput, DetectionOutput) have a row
count that depends on the data, so their results live outside the arena and stay fp32.
PriorBox depends on the input shapes only: computed once, stored like any other blob.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.jit import nms
from vkserve.devices.cpu.kernels.base import Kernel, register
from vkserve.models import detection
from vkserve.models.layers import Shape


@register("Yolov3DetectionOutput")
class Yolov3DetectionOutput(Kernel):
    dynamic = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        super().infer(in_shapes)
        self.heads = detection.heads(self.p, in_shapes)
        return [(0, 6)]  # data-dependent rows: not planned

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        """``detection.detect``, its NMS compiled (``jit.nms``: the same picks)."""
        dets = detection.candidates(self.p, self.heads, xs)
        boxes = np.ascontiguousarray(dets[:, 2:6])
        return [dets[nms.nms_sorted(boxes, np.float32(self.p.nms_threshold), False)].reshape(-1, 6)]


@register("YoloDetectionOutput")
class YoloDetectionOutput(Kernel):
    dynamic = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        super().infer(in_shapes)
        return [(0, 6)]  # data-dependent rows: not planned

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [detection.yolo_v2_detect(self.p, xs)]


@register("DetectionOutput")
class DetectionOutput(Kernel):
    dynamic = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        super().infer(in_shapes)
        return [(0, 6)]  # data-dependent rows: not planned

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [detection.ssd_detect(self.p, xs)]


@register("PriorBox")
class PriorBox(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        self.priors = detection.prior_boxes(self.p, in_shapes)
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return [self.priors]
