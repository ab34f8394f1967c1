"""InnerProduct on Vulkan: a GEMV (``innerproduct``), one 64-invocation work group per output;
``innerproduct_vec4`` (the same reading vec4s) when num_input is a multiple of 4.

Any input shape is read flat (the blob is dense), except ncnn's 2-D form whose rows are
num_input wide (``InnerProductParams.batch_rows``): one GEMV per row (work group y).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.layers.base import Dispatch, Shape, VulkanLayer, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL, activation_constants, make_dispatch
from vkserve.models.graph import Layer


@register("InnerProduct")
class VulkanInnerProduct(VulkanLayer):
    """Weights stay in ncnn's [num_output][num_input] order: a work group reads one row."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        self.activation = activation_constants(p.activation_type, p.activation_params)
        self.num_input = p.num_input()
        self.rows = p.batch_rows(self.in_shapes[0]) or 1

    def weights(self) -> dict[str, np.ndarray]:
        """Read when asked for, never kept: a Plan uploads them and serves from the device
        (vgg16's fc6 and fc7, 464 MiB of fp32, were held in host memory for the Plan's life)."""
        p, ws = self.params, self.layer.weights
        bias = (np.asarray(ws[1], dtype=np.float32).ravel() if p.bias_term
                else np.zeros(p.num_output, np.float32))
        return {"weight": np.asarray(ws[0], dtype=np.float32).ravel(), "bias": bias}

    def dispatches(self) -> list[Dispatch]:
        n_out = self.params.num_output
        bindings = (self.layer.inputs[0], self.layer.outputs[0], "w:weight", "w:bias")
        shader = "innerproduct_vec4" if self.num_input % 4 == 0 else "innerproduct"
        return [make_dispatch(shader, bindings, (REDUCE_LOCAL * n_out, self.rows, 1),
                              psc=(self.num_input, n_out), fixed=self.activation,
                              local_size=(REDUCE_LOCAL, 1, 1))]
