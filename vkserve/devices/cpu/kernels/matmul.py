"""Gemm: top = alpha * (A @ B + beta * C), ncnn's order of scaling (``GemmParams``);
MatMul: numpy's batched matmul (``MatMulParams``), compiled (``jit.linear.matmul``).

A Gemm in the Linear form (B a weight, A an input not transposed, C none, a
scalar or a weight per column, alpha 1, no output transpose: what pnnx writes for nn.Linear)
runs as ``jit.linear`` on the bf16 arena, B packed once at load, the activations after it fused
into its store. Every other form is one np.matmul in fp32: constant A / B narrowed to bf16 once
and widened once per plan (a weight matrix is used whole by every call, so it is kept widened);
a constant C kept in fp32 as biases are.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.jit import linear as jit_linear
from vkserve.devices.cpu.kernels.base import register
from vkserve.devices.cpu.kernels.jitted import JitCall, JitKernel
from vkserve.models.layers import Shape, gemm_matrix

#: broadcast types of a constant C that the Linear form takes: none, a scalar, per column
_LINEAR_C = (-1, 0, 4)


@register("Gemm")
class Gemm(JitKernel):
    @property
    def raw_inputs(self) -> bool:  # type: ignore[override]
        return self.linear_b is not None

    def _linear_form(self) -> bool:
        p = self.p
        return (bool(p.constantB) and not p.constantA and not p.transA and p.alpha == 1.0
                and not p.output_transpose and len(self.in_shapes) == 1 and self.c_kind in _LINEAR_C)

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        self.m, self.n, self.k, self.c_kind = p.dims(in_shapes)
        self.a_const = self.c_const = None
        self.linear_b: np.ndarray | None = None
        #: the weight index of B (A's comes first when constant)
        self._b_index = int(bool(p.constantA))
        index = 0
        if p.constantA:
            a = from_bf16(self.bf16_weight(index))
            index += 1
            self.a_const = a.reshape(self.k, self.m).T if p.transA else a.reshape(self.m, self.k)
        index += int(bool(p.constantB))
        if p.has_constant_c():
            self.c_const = self.fp32_bias(index)
        if self._linear_form():
            b16 = self.bf16_weight(self._b_index)
            shape = (self.n, self.k) if p.transB else (self.k, self.n)
            self.linear_b = jit_linear.pack_b(b16.reshape(shape), bool(p.transB))
            bias = np.zeros(self.n, dtype=np.float32)
            if self.c_const is not None:
                bias += self._c_term(self.c_const).ravel() * np.float32(p.beta)
            self.linear_bias = bias
            self.work = self.m * self.n * self.k
        return out

    @functools.cached_property
    def b_const(self) -> np.ndarray | None:
        """B widened to fp32 for numpy's matmul (never made for the Linear form's own path)."""
        p = self.p
        if not p.constantB:
            return None
        b = from_bf16(self.bf16_weight(self._b_index))
        return b.reshape(self.n, self.k).T if p.transB else b.reshape(self.k, self.n)

    def _activation(self) -> tuple[int, tuple[float, ...]]:
        return 0, ()

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        m, n, k = self.m, self.n, self.k
        rb, cols = jit_linear.split(m, n, jit.kernel_threads())
        return jit_linear.linear, (xs[0].reshape(m, k), self.linear_b, self.linear_bias, ops, rb, cols,
                                   out.reshape(m, n))

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
class MatMul(JitKernel):
    """numpy's matmul (``MatMulParams``; B's last two axes swapped with transB) as
    ``jit.linear.matmul`` on the bf16 arena: every B packed per run, the batch's products as
    one set of tasks on the engine's threads, activations after it fused into its store.
    ``forward`` (fp32) is numpy's matmul."""

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        out_batch, self.m, self.n, self.k, a_batch, b_batch = self.p.dims(in_shapes)
        self.a_items, self.b_items = math.prod(a_batch), math.prod(b_batch)
        self.items_out = math.prod(out_batch)
        # the A and B of each output item (batch axes broadcast where one of them is 1)
        index = np.indices(out_batch).reshape(2, -1)
        self.a_of, self.b_of = ((np.where(np.array(batch)[:, None] > 1, index, 0) * [[batch[1]], [1]]).sum(axis=0)
                                for batch in (a_batch, b_batch))
        #: B as stored: (N, K) per item with transB (a 1-D B is one column either way)
        self.b_transposed = bool(self.p.transB) and len(in_shapes[1]) > 1
        self.work = self.items_out * self.m * self.n * self.k
        return out

    def _activation(self) -> tuple[int, tuple[float, ...]]:
        return 0, ()

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        m, n, k = self.m, self.n, self.k
        b_shape = (n, k) if self.b_transposed else (k, n)
        bp = self.buf("matmul_b", (self.b_items, *jit_linear.packed_b_shape(k, n)), np.uint16)
        rb, cols = jit_linear.split(m, n, -(-jit.kernel_threads() // self.items_out))
        return jit_linear.matmul, (xs[0].reshape(self.a_items, m, k), xs[1].reshape(self.b_items, *b_shape),
                                   self.b_transposed, self.a_of, self.b_of, bp, ops, rb, cols,
                                   out.reshape(self.items_out, m, n))

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        a = np.asarray(xs[0], np.float32)
        b = np.asarray(xs[1], np.float32)
        if self.p.transB and b.ndim > 1:
            b = np.swapaxes(b, -1, -2)
        y = np.matmul(a, b, dtype=np.float32)
        return [np.ascontiguousarray(y, dtype=np.float32).reshape(self.out_shapes[0])]
