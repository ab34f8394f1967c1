"""Gemm and MatMul on Vulkan: one ``gemm`` dispatch, one output element per invocation (8x8 work groups),
float accumulation in every mode. A, B and C are read through strides (``gemm.comp``), so
transA / transB, output_transpose and C's broadcasts need no copies. Constant operands are
weights in ncnn's stored orders; the sizes and C's broadcast come from ``GemmParams.dims``.
MatMul is the same dispatch over work-group z = output batch (``MatMulParams.dims``: two batch
axes, a stride of 0 on the side that broadcasts), with no C.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vkserve.devices.capabilities import Precision
from vkserve.devices.errors import UnsupportedError
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, Dispatch, Shape, VulkanLayer, register
from vkserve.models.graph import Layer

_DUMMY = np.zeros(2, np.float32)
_LOCAL = (8, 8, 1)
# C strides (per row i, per column j) for each broadcast type
_C_STRIDES = {0: (0, 0), 1: (1, 0), 2: (1, 0), 4: (0, 1)}


@register("Gemm")
class VulkanGemm(VulkanLayer):
    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        self.m, self.n, self.k, self.c_kind = p.dims(self.in_shapes)
        if -(-self.n // _LOCAL[0]) > MAX_GROUPS or -(-self.m // _LOCAL[1]) > MAX_GROUPS:
            raise UnsupportedError(f"Gemm {self.m}x{self.n}: too many work groups")
        ws = [np.asarray(w, np.float32).ravel() for w in layer.weights]
        self._weights: dict[str, np.ndarray] = {"C": _DUMMY}
        names = iter(self.layer.inputs)
        self.a = "w:A" if p.constantA else next(names)
        self.b = "w:B" if p.constantB else next(names)
        if p.constantA:
            self._weights["A"] = ws.pop(0)
        if p.constantB:
            self._weights["B"] = ws.pop(0)
        self.c = "w:C"
        if p.has_constant_c():
            self._weights["C"] = ws.pop(0)
        elif not p.constantC:
            self.c = next(names, "w:C")

    def weights(self) -> dict[str, np.ndarray]:
        return dict(self._weights)

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        m, n, k = self.m, self.n, self.k
        a_si, a_sk = (1, m) if p.transA else (k, 1)
        b_sk, b_sn = (1, k) if p.transB else (n, 1)
        c_si, c_sj = (n, 1) if self.c_kind == 3 else _C_STRIDES.get(self.c_kind, (0, 0))
        o_si, o_sj = (1, m) if p.output_transpose else (n, 1)
        return [Dispatch("gemm", (self.a, self.b, self.c, self.layer.outputs[0]), (n, m, 1),
                         push_constants=(m, n, k, a_si, a_sk, b_sk, b_sn, c_si, c_sj, o_si, o_sj,
                                         float(p.alpha), float(p.beta), 1, 0, 0, 0, 0, 0),
                         spec_constants=(int(self.c_kind >= 0),), local_size=_LOCAL)]


@register("MatMul")
class VulkanMatMul(VulkanLayer):
    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        self.out_batch, self.m, self.n, self.k, self.a_batch, self.b_batch = \
            self.params.dims(self.in_shapes)
        batches = self.out_batch[0] * self.out_batch[1]
        if (-(-self.n // _LOCAL[0]) > MAX_GROUPS or -(-self.m // _LOCAL[1]) > MAX_GROUPS
                or batches > MAX_GROUPS):
            raise UnsupportedError(f"MatMul {self.in_shapes}: too many work groups")

    def weights(self) -> dict[str, np.ndarray]:
        return {"C": _DUMMY}

    def dispatches(self) -> list[Dispatch]:
        m, n, k = self.m, self.n, self.k
        b_1d = len(self.in_shapes[1]) == 1
        a_si, a_sk = k, 1
        if b_1d:
            b_sk, b_sn = 1, 0
        else:
            b_sk, b_sn = (1, k) if self.params.transB else (n, 1)
        a_mat, b_mat = m * k, k * n
        a_b1 = 0 if self.a_batch[0] == 1 else self.a_batch[1] * a_mat
        a_b2 = 0 if self.a_batch[1] == 1 else a_mat
        b_b1 = 0 if self.b_batch[0] == 1 else self.b_batch[1] * b_mat
        b_b2 = 0 if self.b_batch[1] == 1 else b_mat
        batches = self.out_batch[0] * self.out_batch[1]
        return [Dispatch("gemm", (self.layer.inputs[0], self.layer.inputs[1], "w:C",
                                  self.layer.outputs[0]), (n, m, batches),
                         push_constants=(m, n, k, a_si, a_sk, b_sk, b_sn, 0, 0, n, 1, 1.0, 1.0,
                                         self.out_batch[1], a_b1, a_b2, b_b1, b_b2, m * n),
                         spec_constants=(0,), local_size=_LOCAL)]
