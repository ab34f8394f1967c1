"""Yolov3DetectionOutput: the layer's own definition (``vkserve.models.detection``), in fp32.

The row count depends on the data, so the result lives outside the arena and stays fp32.
"""

from __future__ import annotations

import numpy as np

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
        return [detection.detect(self.p, self.heads, xs)]
