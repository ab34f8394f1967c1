"""MultiHeadAttention (``MultiHeadAttentionParams``): the q / k / v projections, per-head
scaled scores plus the mask, a softmax over the keys, the weighted values and the out
projection, all in fp32 (numpy) over bf16 weights widened once per plan; biases stay fp32."""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.kernels.base import Kernel, register
from vkserve.models.layers import Shape


@register("MultiHeadAttention")
class MultiHeadAttention(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        self.src, self.dst, self.mask_heads = p.dims(in_shapes)
        self.roles = p.roles(len(in_shapes))
        e = p.embed_dim
        widths = (p.qdim(), p.kdim, p.vdim, e)
        # (weight (out, in), bias) of the q, k, v and out projections, in load order
        self.proj = []
        for i, width in enumerate(widths):
            rows = p.qdim() if i == 3 else e
            w = from_bf16(self.bf16_weight(2 * i)).reshape(rows, width)
            self.proj.append((np.ascontiguousarray(w.T), self.fp32_bias(2 * i + 1)))
        return out

    def _project(self, x: np.ndarray, which: int) -> np.ndarray:
        w_t, b = self.proj[which]
        return np.matmul(x, w_t, dtype=np.float32) + b

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        p = self.p
        heads, hd = p.num_heads, p.head_dim()
        qi, ki, vi, mi = self.roles
        q, k, v = (np.asarray(xs[i], np.float32).reshape(-1, xs[i].shape[-1]) for i in (qi, ki, vi))
        qa = self._project(q, 0) * np.float32(p.qk_scale())
        ka = self._project(k, 1)
        va = self._project(v, 2)
        # (heads, rows, head_dim) views of the projections
        qh = qa.reshape(self.src, heads, hd).transpose(1, 0, 2)
        kh = ka.reshape(self.dst, heads, hd).transpose(1, 0, 2)
        vh = va.reshape(self.dst, heads, hd).transpose(1, 0, 2)
        scores = np.matmul(qh, kh.transpose(0, 2, 1), dtype=np.float32)
        if mi is not None:
            scores += np.asarray(xs[mi], np.float32).reshape(self.mask_heads, self.src, self.dst)
        scores -= scores.max(axis=-1, keepdims=True)
        with np.errstate(over="ignore", invalid="ignore"):
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True, dtype=np.float32)
        mixed = np.matmul(scores, vh, dtype=np.float32).transpose(1, 0, 2).reshape(self.src, -1)
        y = self._project(mixed, 3)
        return [np.ascontiguousarray(y, dtype=np.float32).reshape(self.out_shapes[0])]
