"""MultiHeadAttention on Vulkan (``MultiHeadAttentionParams``), from the shaders other layers
use, over scratch blobs in the engine's storage type:

1. q, k, v projections: one ``gemm`` each, x (rows, in) times the stored (embed, in) weight
   read transposed through strides, bias as C per column; q's alpha is the scale.
   q, k, v: (rows, embed_dim), head h in columns h * head_dim ...
2. scores (heads, src, dst) = q_h k_h^T: one ``gemm`` over work-group z = head (A / B
   batch strides step head_dim columns); a shared (src, dst) mask is its C (gemm's C has
   no batch stride: every head adds the same one).
3. a per-head (heads, src, dst) mask, the scores' shape: ``eltwise`` sums it in place (the
   scratch is padded to whole vec4s, as blobs are).
4. ``softmax`` in place along dst (its max and sum are float in every mode, so fp16 storage
   and arithmetic do not overflow).
5. mixed (src, embed) = scores_h v_h: one ``gemm`` over heads, each writing its head_dim
   columns (output batch stride head_dim).
6. the out projection: ``gemm`` into the (src, qdim) output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vkserve.devices.capabilities import Precision
from vkserve.devices.errors import UnsupportedError
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, Dispatch, Shape, register
from vkserve.devices.vulkan.layers.compute_util import REDUCE_LOCAL, make_dispatch
from vkserve.devices.vulkan.layers.matmul import GemmLayer, gemm_dispatches
from vkserve.devices.vulkan.layers.shape import LOCAL, linear_grid
from vkserve.models.graph import Layer

_ELTWISE_SUM = 1  # eltwise.comp's op_type
_WEIGHT_KEYS = ("qw", "qb", "kw", "kb", "vw", "vb", "ow", "ob")


@register("MultiHeadAttention")
class VulkanMultiHeadAttention(GemmLayer):
    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        self.src, self.dst, self.mask_heads = p.dims(self.in_shapes)
        if p.num_heads * self.src > MAX_GROUPS or p.num_heads > MAX_GROUPS:
            raise UnsupportedError(f"MultiHeadAttention of {p.num_heads} heads x {self.src} "
                                   "queries: too many softmax rows")

    def weights(self) -> dict[str, np.ndarray]:
        """Read when laid out, never kept (see VulkanInnerProduct.weights)."""
        out = {key: np.asarray(w, np.float32).ravel() for key, w in zip(_WEIGHT_KEYS, self.layer.weights)}
        out["none"] = np.zeros(2, np.float32)
        return out

    def scratch(self) -> dict[str, int]:
        e, src, dst = self.params.embed_dim, self.src, self.dst
        return {"q": src * e, "k": dst * e, "v": dst * e, "scores": self.params.num_heads * src * dst,
                "mixed": src * e}

    def _gemm(self, bindings: tuple[str, str, str, str], m: int, n: int, k: int,
              a: tuple[int, int, int], b: tuple[int, int, int], c: tuple[int, int] | None,
              out: tuple[int, int, int], heads: int = 1, alpha: float = 1.0) -> list[Dispatch]:
        """One product (``matmul.gemm_dispatches``: the shader and tile picked for the shape):
        (M, N) = A (M, K) @ B (K, N) (+ C), times alpha, over ``heads`` batches. a = (row stride,
        k stride, head stride), b = (k stride, column stride, head stride), c = (row, column
        strides) or None, out = (row, column, head strides)."""
        return gemm_dispatches(bindings, m, n, k, a[:2], b[:2], c, out[:2], alpha=alpha,
                             batches=heads, batch_inner=heads, a_batch=(0, a[2]),
                             b_batch=(0, b[2]), out_batch=out[2],
                             what="MultiHeadAttention product", coop=self.coop)

    def dispatches(self) -> list[Dispatch]:
        p, layer = self.params, self.layer
        e, heads, hd, src, dst = p.embed_dim, p.num_heads, p.head_dim(), self.src, self.dst
        qi, ki, vi, mi = p.roles(len(layer.inputs))
        out: list[Dispatch] = []
        for name, blob, rows, width, alpha in (("q", layer.inputs[qi], src, p.qdim(), p.qk_scale()),
                                               ("k", layer.inputs[ki], dst, p.kdim, 1.0),
                                               ("v", layer.inputs[vi], dst, p.vdim, 1.0)):
            out.extend(self._gemm((blob, f"w:{name}w", f"w:{name}b", f"s:{name}"), rows, e, width,
                                  a=(width, 1, 0), b=(1, width, 0), c=(0, 1), out=(e, 1, 0),
                                  alpha=alpha))
        shared_mask = mi is not None and self.mask_heads == 1
        out.extend(self._gemm(("s:q", "s:k", layer.inputs[mi] if shared_mask else "w:none", "s:scores"),
                              src, dst, hd, a=(e, 1, hd), b=(1, e, hd),
                              c=(dst, 1) if shared_mask else None, out=(dst, 1, src * dst), heads=heads))
        if mi is not None and not shared_mask:
            n4 = -(-heads * src * dst // 4)
            out.append(Dispatch("eltwise", ("s:scores", layer.inputs[mi], "s:scores"),
                                linear_grid(n4), push_constants=(n4, 1.0, 1.0),
                                spec_constants=(_ELTWISE_SUM,), local_size=LOCAL))
        cooperative = dst >= 32
        out.append(make_dispatch("softmax", ("s:scores", "s:scores"),
                                 (REDUCE_LOCAL if cooperative else 1, heads * src, 1),
                                 psc=(dst, 1, heads * src), fixed=(int(cooperative),),
                                 local_size=(REDUCE_LOCAL, 1, 1)))
        out.extend(self._gemm(("s:scores", "s:v", "w:none", "s:mixed"), src, hd, dst,
                              a=(dst, 1, src * dst), b=(e, 1, hd), c=None, out=(e, 1, hd), heads=heads))
        out.extend(self._gemm(("s:mixed", "w:ow", "w:ob", layer.outputs[0]), src, p.qdim(), e,
                              a=(e, 1, 0), b=(1, e, 0), c=(0, 1), out=(p.qdim(), 1, 0)))
        return out
