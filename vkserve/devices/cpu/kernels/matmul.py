"""Gemm: top = alpha * (A @ B + beta * C), ncnn's order of scaling (``GemmParams``);
MatMul: numpy's batched matmul (``MatMulParams``).

Constant A / B (weights) are narrowed to bf16 once and widened once per plan (a weight
matrix is used whole by every call, so it is kept widened); a constant C is kept in fp32 as
biases are. The product is one np.matmul in fp32.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.kernels.base import Kernel, register
from vkserve.models.layers import Shape, gemm_matrix


@register("Gemm")
class Gemm(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        self.m, self.n, self.k, self.c_kind = p.dims(in_shapes)
        index = 0
        self.a_const = self.b_const = self.c_const = None
        if p.constantA:
            a = from_bf16(self.bf16_weight(index))
            index += 1
            self.a_const = a.reshape(self.k, self.m).T if p.transA else a.reshape(self.m, self.k)
        if p.constantB:
            b = from_bf16(self.bf16_weight(index))
            index += 1
            self.b_const = b.reshape(self.n, self.k).T if p.transB else b.reshape(self.k, self.n)
        if p.has_constant_c():
            self.c_const = self.fp32_bias(index)
        return out

    def _operand(self, x: np.ndarray, trans: int) -> np.ndarray:
        rows, cols = gemm_matrix("Gemm", x.shape)
        v = np.asarray(x, np.float32).reshape(rows, cols)
        return v.T if trans else v

    def _c_term(self, c: np.ndarray) -> np.ndarray:
        c = np.asarray(c, np.float32).ravel()
        kind = self.c_kind
        if kind == 0:
            return c[:1].reshape(1, 1)
        if kind in (1, 2):
            return c[: self.m].reshape(self.m, 1)
        if kind == 3:
            return c[: self.m * self.n].reshape(self.m, self.n)
        return c[: self.n].reshape(1, self.n)

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        rest = list(xs)
        a = self.a_const if self.a_const is not None else self._operand(rest.pop(0), p.transA)
        b = self.b_const if self.b_const is not None else self._operand(rest.pop(0), p.transB)
        y = np.matmul(a, b, dtype=np.float32)
        c = self.c_const if self.c_const is not None else (rest[0] if rest and self.c_kind >= 0 else None)
        if c is not None:
            term = self._c_term(c)
            if p.beta != 1.0:
                term = term * np.float32(p.beta)
            y += term
        if p.alpha != 1.0:
            y *= np.float32(p.alpha)
        if p.output_transpose:
            y = y.T
        return [np.ascontiguousarray(y, dtype=np.float32).reshape(self.out_shapes[0])]


@register("MatMul")
class MatMul(Kernel):
    """numpy's matmul in fp32 (``MatMulParams``): B's last two axes swapped with transB."""

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        a = np.asarray(xs[0], np.float32)
        b = np.asarray(xs[1], np.float32)
        if self.p.transB and b.ndim > 1:
            b = np.swapaxes(b, -1, -2)
        y = np.matmul(a, b, dtype=np.float32)
        return [np.ascontiguousarray(y, dtype=np.float32).reshape(self.out_shapes[0])]
