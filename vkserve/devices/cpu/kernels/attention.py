"""MultiHeadAttention (``MultiHeadAttentionParams``): the q / k / v projections, per-head
scaled scores plus the mask, a softmax over the keys, the weighted values and the out
projection.

On the Plan's path the four projections run as ``jit.linear`` on the bf16 arena (weights packed
once at load; in self-attention q, k and v are one product over the three weights side by side,
the input packed once), and the attention between them as ``jit.attention.attend`` (fp32),
which stores the weighted values in bf16 for the out projection, as storage between two layers
would round them. ``forward`` (fp32 in) is numpy throughout, over the weights widened on first
use; biases stay fp32."""

from __future__ import annotations

import functools

import numpy as np

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.jit import attention as jit_attention
from vkserve.devices.cpu.jit import linear as jit_linear
from vkserve.devices.cpu.kernels.base import Kernel, register
from vkserve.models.layers import Shape

#: no epilogue after a projection
_NO_OPS = np.zeros((0, 3), dtype=np.float32)
#: no attention mask
_NO_MASK = np.zeros((0, 0, 0), dtype=np.float32)


@register("MultiHeadAttention")
class MultiHeadAttention(Kernel):
    raw_inputs = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        self.src, self.dst, self.mask_heads = p.dims(in_shapes)
        self.roles = p.roles(len(in_shapes))
        qi, ki, vi, _ = self.roles
        #: (weight (out, in) bf16, bias) of the q, k, v and out projections, in load order
        weights = [(self._b16(i), self.fp32_bias(2 * i + 1)) for i in range(4)]
        self.self_attention = qi == ki == vi
        if self.self_attention:
            products = [(np.concatenate([w for w, _ in weights[:3]]), np.concatenate([b for _, b in weights[:3]]))]
        else:
            products = weights[:3]
        #: the input projections' packed weights and biases: one product (self-attention) or three
        self.in_products = [(jit_linear.pack_b(w, trans=True), b) for w, b in products]
        self.out_product = (jit_linear.pack_b(weights[3][0], trans=True), weights[3][1])
        return out

    def _b16(self, i: int) -> np.ndarray:
        """Projection ``i``'s weight (out, in) as bf16."""
        p = self.p
        rows = p.qdim() if i == 3 else p.embed_dim
        return self.bf16_weight(2 * i).reshape(rows, (p.qdim(), p.kdim, p.vdim, p.embed_dim)[i])

    @functools.cached_property
    def proj(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(weight as B (in, out) fp32, bias) of each projection, for ``forward`` alone."""
        return [(np.ascontiguousarray(from_bf16(self._b16(i)).T), self.fp32_bias(2 * i + 1)) for i in range(4)]

    def _project(self, x: np.ndarray, which: int) -> np.ndarray:
        w_t, b = self.proj[which]
        return np.matmul(x, w_t, dtype=np.float32) + b

    def _linear(self, a16: np.ndarray, product: tuple[np.ndarray, np.ndarray], out: np.ndarray) -> None:
        """out (fp32) = a16 (bf16) times a packed projection, plus its bias."""
        (m, k), n = a16.shape, out.shape[1]
        rb, cols = jit_linear.split(m, n, jit.kernel_threads())
        with jit.launch(m * n * k):
            jit_linear.linear(a16, product[0], product[1], _NO_OPS, rb, cols, out)

    def _attend(self, qa: np.ndarray, ka: np.ndarray, va: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """The weighted values (src, e) of scaled projections: scores, the mask, softmax."""
        p = self.p
        heads, hd = p.num_heads, p.head_dim()
        # (heads, rows, head_dim) views of the projections
        qh = qa.reshape(self.src, heads, hd).transpose(1, 0, 2)
        kh = ka.reshape(self.dst, heads, hd).transpose(1, 0, 2)
        vh = va.reshape(self.dst, heads, hd).transpose(1, 0, 2)
        scores = np.matmul(qh, kh.transpose(0, 2, 1), dtype=np.float32)
        if mask is not None:
            scores += np.asarray(mask, np.float32).reshape(self.mask_heads, self.src, self.dst)
        scores -= scores.max(axis=-1, keepdims=True)
        with np.errstate(over="ignore", invalid="ignore"):
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True, dtype=np.float32)
        return np.matmul(scores, vh, dtype=np.float32).transpose(1, 0, 2).reshape(self.src, -1)

    def forward_bf16(self, us: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        e = p.embed_dim
        qi, ki, vi, mi = self.roles
        if self.self_attention:
            qkv = self.buf("qkv", (self.src, 3 * e))
            self._linear(us[qi].reshape(self.src, -1), self.in_products[0], qkv)
            (qa, q0), (ka, k0), (va, v0) = (qkv, 0), (qkv, e), (qkv, 2 * e)
        else:
            (qa, q0), (ka, k0), (va, v0) = ((self.buf(name, (rows, e)), 0) for name, rows in (
                ("q", self.src), ("k", self.dst), ("v", self.dst)))
            for i, x, dst, rows in ((qi, 0, qa, self.src), (ki, 1, ka, self.dst), (vi, 2, va, self.dst)):
                self._linear(us[i].reshape(rows, -1), self.in_products[x], dst)
        qa[:, q0 : q0 + e] *= np.float32(p.qk_scale())
        mask = (_NO_MASK if mi is None
                else from_bf16(us[mi]).reshape(self.mask_heads, self.src, self.dst))
        mixed16 = self.buf("mixed", (self.src, e), np.uint16)
        rows = jit_attention.split(p.num_heads, self.src, jit.kernel_threads())
        with jit.launch(2 * self.src * self.dst * e):
            jit_attention.attend(qa, q0, ka, k0, va, v0, mask, p.num_heads, rows, mixed16)
        out = self.buf("out", (self.src, p.qdim()))
        self._linear(mixed16, self.out_product, out)
        return [out.reshape(self.out_shapes[0])]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        qi, ki, vi, mi = self.roles
        q, k, v = (np.asarray(xs[i], np.float32).reshape(-1, xs[i].shape[-1]) for i in (qi, ki, vi))
        qa = self._project(q, 0) * np.float32(p.qk_scale())
        mixed = self._attend(qa, self._project(k, 1), self._project(v, 2), None if mi is None else xs[mi])
        y = self._project(mixed, 3)
        return [np.ascontiguousarray(y, dtype=np.float32).reshape(self.out_shapes[0])]
