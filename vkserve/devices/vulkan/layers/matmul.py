"""Gemm and MatMul on Vulkan: one ``gemm`` dispatch each (``gemm_dispatches``, which
MultiHeadAttention's products use too), float accumulation in every mode. A, B and C are read
through strides (``gemm.comp``), so transA / transB, output_transpose and C's broadcasts need no
copies. Constant operands are weights in ncnn's stored orders; the sizes and C's broadcast come
from ``GemmParams.dims``. MatMul is the same dispatch over work-group z = output batch
(``MatMulParams.dims``: two batch axes, a stride of 0 on the side that broadcasts), with no C.

``gemm.comp`` tiles the output like conv_gemm: 256-invocation work groups of a BM x BN tile,
K split over KS slices (BM * BN * KS = 4096: 4 x 4 outputs per invocation), BK values of k per
slice and step, A and B staged through shared memory. ``choose_gemm_tile`` picks the tile per
shape by a cost model fitted on an H100 (conv_gemm's target GPU, ``layers.conv``), so that small
M (49 tokens) or few columns still give a big GPU enough work groups, or split K over more
slices when K is long.

``gemm_coopmat.comp`` is the same product on the tensor cores (VK_KHR_cooperative_matrix, fp16
modes; ``vulkan.coopmat``): same push constants, a 32 FM x 64 FN tile per work group of 8
subgroups, K split over work groups for a Gemm with few output tiles (fp32 partials, which
each tile's last work group adds: ``SplitScratch``); chosen per shape by ``choose_coop_gemm``
for the layers that were given a device with it (``GemmLayer.specialize``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.errors import UnsupportedError
from vkserve.devices.vulkan.coopmat import coop_gemm_wanted, fp16_coopmat
from vkserve.devices.vulkan.layers.base import (
    MAX_GROUPS,
    Dispatch,
    Scalar,
    Shape,
    VulkanLayer,
    is_transpose,
    register,
)
from vkserve.devices.vulkan.layers.compute_util import GEMM_THREADS, GEMM_UNITS, NO_ACTIVATION, split_k
from vkserve.models.graph import Layer

_DUMMY = np.zeros(2, np.float32)
# C strides (per row i, per column j) for each broadcast type
_C_STRIDES = {0: (0, 0), 1: (1, 0), 2: (1, 0), 4: (0, 1)}
# gemm.comp's shared memory in vec4 (16 KiB) and the most values of A and B an invocation stages
# per step (its register arrays hold 8 of each)
_SHARED_VEC4 = 1024
_MAX_STAGED = 8


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class MatmulTile:
    """gemm.comp's tile: BM rows x BN columns per work group, K split over KS slices
    (BM * BN * KS = 4096: 256 invocations of 4 x 4 outputs), BK values of k per slice and step.
    Shared memory holds KS * BK rows of A and B (each padded by one vec4) and, for the split-K
    sum, KS tiles of BM * BN."""

    bm: int
    bn: int
    ks: int
    bk: int

    @staticmethod
    def candidates() -> list[MatmulTile]:
        """Every BM, BN of 16, 32, 64 with the largest BK that stages at most 8 values of A and
        B together per invocation and step (more cost registers and step latency: measured
        slower on an H100) and fits the shared memory."""
        out = []
        for bm in (16, 32, 64):
            for bn in (16, 32, 64):
                ks = GEMM_THREADS * 16 // (bm * bn)
                if not 1 <= ks <= 16:
                    continue
                bk = 32
                while bk > 4 and (ks * bk * (bm // 4 + bn // 4 + 2) > _SHARED_VEC4
                                  or ks * bk * (bm + bn) > GEMM_THREADS * _MAX_STAGED):
                    bk //= 2
                out.append(MatmulTile(bm, bn, ks, bk))
        return out

    def staged(self) -> int:
        """Values of A and B one invocation stages per step."""
        return self.ks * self.bk * (self.bm + self.bn) // GEMM_THREADS

    def valid(self) -> bool:
        """The shader's assumptions about its constants."""
        kb = self.ks * self.bk
        return (self.bm * self.bn * self.ks == GEMM_THREADS * 16 and kb % 8 == 0
                and kb * self.bm % GEMM_THREADS == 0 and kb * self.bn % GEMM_THREADS == 0
                and self.staged() <= _MAX_STAGED
                and kb * (self.bm // 4 + self.bn // 4 + 2) <= _SHARED_VEC4
                and self.ks * self.bm * self.bn // 4 <= _SHARED_VEC4)

    def grid(self, m: int, n: int, batches: int) -> tuple[int, int, int]:
        return (_ceil(n, self.bn), _ceil(m, self.bm), batches)

    def cost(self, m: int, n: int, k: int, batches: int) -> float:
        """Rough microseconds on the target GPU (conv_gemm's: an H100), fitted to every tile
        timed on the Linear shapes of convnext_tiny and vit_tiny (~7 % rms; the pick within
        1.5 % of the best on convnext_tiny's): steps of the K loop times the larger of a
        step's latency (growing with the values each invocation stages and the groups that
        share a unit) and the work of those groups (a fixed part per step, for its barriers,
        and BK values of k), plus the split-K sum."""
        gx, gy, gz = self.grid(m, n, batches)
        per_unit = _ceil(gx * gy * gz, GEMM_UNITS)
        steps = max(1, _ceil(k, self.bk * self.ks))
        latency = 0.135 + 0.080 * self.staged() + 0.034 * per_unit
        step = max(latency, per_unit * (0.080 + 0.0556 * self.bk))
        return steps * step + (0.46 * per_unit if self.ks > 1 else 0.0)


def choose_gemm_tile(m: int, n: int, k: int, batches: int) -> MatmulTile | None:
    """The cheapest tile by `MatmulTile.cost` (ties to the fewer slices) among those whose
    grid fits Vulkan's guaranteed 65535 work groups per dimension; None if none does."""
    fits = [t for t in MatmulTile.candidates() if max(t.grid(m, n, batches)) <= MAX_GROUPS]
    return min(fits, key=lambda t: (t.cost(m, n, k, batches), t.ks), default=None)


#: gemm_coopmat's FM x FN (BM = 32 FM rows by BN = 64 FN columns), largest first. Not 64 x 128
#: (2, 2): on an H200 it ran Winograd's 16 GEMMs of vgg16's conv3_2 (256 x 784 x 256) in 0.0745
#: ms against 0.0362 with 64 x 64, and 1 x 2 was as slow; convnext_tiny's and resnet50's
#: products took the same time either way (RESULTS.md, issue 17, fourteenth session), as
#: conv_coopmat's 128-wide tiles were slow before (conv.choose_coop_tile).
COOP_GEMM_TILES = ((2, 1), (1, 1))
#: gemm_coopmat's values of K per step. 64, not conv_coopmat's 32: a product with few output
#: tiles runs a few work groups per compute unit through a chain of steps, each waiting on its
#: loads, so half the steps is nearly half the time (H200, convnext_tiny's 63 products 0.716 ->
#: 0.585 ms, vgg16's Winograd GEMMs 0.189 -> 0.177; RESULTS.md, issue 17, fifteenth session).
COOP_GEMM_BK = 64
#: gemm_coopmat's steps in flight in registers. 2: H200, one Gemm's time with 1 / 2 / 3 / 4
#: (196 x 384 x 1024: 12.9 / 12.1 / 12.3 / 12.3 us; 3136 x 384 x 1024: 47.4 / 43.7 / 42.7 / 54.2),
#: convnext_tiny's products 583 / 571 / 579 / 611 us, vgg16's 139 / 134 / 136 / 203 (RESULTS.md,
#: issue 17, seventeenth session): a step waits on more than its loads.
COOP_GEMM_PREFETCH = 2


def choose_coop_gemm_tile(m: int, n: int, batches: int) -> tuple[int, int] | None:
    """gemm_coopmat's tile: the largest that still gives every compute unit a work group
    (GEMM_UNITS), else the smallest; None when no grid fits Vulkan's 65535 per dimension."""
    fits = [t for t in COOP_GEMM_TILES
            if max(_ceil(n, 64 * t[1]), _ceil(m, 32 * t[0]), batches) <= MAX_GROUPS]
    for fm, fn in fits:
        if _ceil(n, 64 * fn) * _ceil(m, 32 * fm) * batches >= GEMM_UNITS:
            return fm, fn
    return fits[-1] if fits else None


@dataclasses.dataclass(frozen=True)
class CoopGemm:
    """gemm_coopmat's launch for one product: an FM x FN tile, K in `ksplit` work groups of
    `split_steps` steps each (1 split: K whole, no partials)."""

    fm: int
    fn: int
    ksplit: int
    split_steps: int

    def padded(self, m: int, n: int) -> tuple[int, int]:
        """M and N rounded up to the tile: the rows and columns of a partial."""
        return _ceil(m, 32 * self.fm) * 32 * self.fm, _ceil(n, 64 * self.fn) * 64 * self.fn

    def partial_floats(self, m: int, n: int, batches: int) -> int:
        mpad, npad = self.padded(m, n)
        return self.ksplit * batches * mpad * npad

    def tiles(self, m: int, n: int, batches: int) -> int:
        """Output tiles over the batches: the split's counters (``SplitScratch``)."""
        mpad, npad = self.padded(m, n)
        return batches * mpad // (32 * self.fm) * npad // (64 * self.fn)

    def split_scratch(self, m: int, n: int, batches: int) -> dict[str, int]:
        """``SplitScratch``'s blobs' sizes for a layer's ``scratch()`` (none with K whole), in
        fp16 storage elements (the modes gemm_coopmat runs in): fp32 partials, uint32 counters."""
        if self.ksplit == 1:
            return {}
        return {SplitScratch.PARTIALS: self.partial_floats(m, n, batches) * 2,
                SplitScratch.COUNTERS: self.tiles(m, n, batches) * 2}


@dataclasses.dataclass(frozen=True)
class SplitScratch:
    """Where a split K's work groups meet: the layer's scratch blobs of fp32 partials and of
    one uint32 counter per output tile, which the Plan zeroes before every run
    (``VulkanLayer.zeroed_scratch``); each tile's last work group to count adds the partials."""

    partials: str
    counters: str

    #: the scratch keys a layer gives them (``CoopGemm.split_scratch``)
    PARTIALS = "partial"
    COUNTERS = "tile_count"

    @classmethod
    def of_layer(cls) -> SplitScratch:
        return cls(f"s:{cls.PARTIALS}", f"s:{cls.COUNTERS}")

    @classmethod
    def zeroed(cls, scratch: Mapping[str, int]) -> frozenset[str]:
        """A layer's ``zeroed_scratch`` given its ``scratch()``: the counters, where K is split."""
        return frozenset({cls.COUNTERS}) & scratch.keys()


def choose_coop_gemm(m: int, n: int, k: int, batches: int, split: bool, by_size: bool = True) -> CoopGemm | None:
    """gemm_coopmat's launch for the product, or None where gemm.comp should run it
    (``coop_gemm_wanted``). With `split` (the layer has room for partials) K is split over
    work groups as conv_coopmat's is when the output tiles are too few (``compute_util.split_k``).
    `by_size`: ``coop_gemm_wanted``'s."""
    tile = choose_coop_gemm_tile(m, n, batches)
    if tile is None:
        return None
    fm, fn = tile
    tiles = _ceil(n, 64 * fn) * _ceil(m, 32 * fm) * batches
    steps = _ceil(k, COOP_GEMM_BK)
    ksplit, per = split_k(tiles, steps) if split else (1, steps)
    if ksplit * batches > MAX_GROUPS:
        ksplit, per = 1, steps
    if not coop_gemm_wanted(k, tiles * ksplit, by_size):
        return None
    return CoopGemm(fm, fn, ksplit, per)


@dataclasses.dataclass(frozen=True)
class RowNorm:
    """A LayerNorm over each row of A applied as gemm_coopmat reads it (engine.fusion's
    fold_row_norms): the weight bindings of gamma and beta (K values each) and epsilon."""

    gamma: str
    beta: str
    eps: float


def whole_quads(rows: int, k: int, row_stride: int, k_stride: int, batch: tuple[int, int]) -> bool:
    """gemm_coopmat reads an operand (rows x k, e.g. A's M x K or B's N x K) by quads of 4
    values along its unit stride: one 8-byte load each where every quad lies whole inside the
    extent and starts at a multiple of 4 elements (the bindings start 16-byte aligned)."""
    if k_stride == 1:
        extent, other = k, row_stride
    elif row_stride == 1:
        extent, other = rows, k_stride
    else:
        return False
    return extent % 4 == 0 and other % 4 == 0 and all(s % 4 == 0 for s in batch)


def gemm_dispatches(bindings: tuple[str, str, str, str], m: int, n: int, k: int,
                    a: tuple[int, int], b: tuple[int, int], c: tuple[int, int] | None,
                    out: tuple[int, int], alpha: float = 1.0, beta: float = 1.0,
                    batches: int = 1, batch_inner: int = 1, a_batch: tuple[int, int] = (0, 0),
                    b_batch: tuple[int, int] = (0, 0), out_batch: int = 0,
                    what: str = "Gemm", coop: bool = False, split: SplitScratch | None = None,
                    residual: str | None = None, activation: tuple[Scalar, ...] = NO_ACTIVATION,
                    a_norm: RowNorm | None = None) -> list[Dispatch]:
    """The dispatches of one product: out (M, N) = alpha * (beta * C + A (M, K) @ B (K, N)),
    over ``batches`` batches. bindings = (A, B, C, out); a = (row stride, k stride), b = (k
    stride, column stride), c = (row, column strides) or None, out = (row, column strides);
    batch z is (z // batch_inner, z % batch_inner), with those two strides in a_batch /
    b_batch and out_batch between output batches. One ``gemm`` dispatch, or with ``coop``
    (the device and mode can run gemm_coopmat) the ``choose_coop_gemm`` launch where it
    takes the product: one ``gemm_coopmat`` dispatch, K split only with ``split`` (the
    layer's scratch: ``CoopGemm.split_scratch``). ``residual``: a blob in the
    output's layout added to every output value (a folded residual sum); ``activation``
    (``activation_constants`` form) applied last (a folded activation layer); ``a_norm``: A's
    rows normalised as they are read (gemm_coopmat only: a folded LayerNorm)."""
    c_si, c_sj = c if c is not None else (0, 0)
    push = (m, n, k, a[0], a[1], b[0], b[1], c_si, c_sj, out[0], out[1], float(alpha), float(beta),
            batch_inner, *a_batch, *b_batch, out_batch)
    launch = choose_coop_gemm(m, n, k, batches, split is not None, by_size=a_norm is None) if coop else None
    if launch is not None:
        mpad, npad = launch.padded(m, n)
        spec = (int(c is not None), launch.fm, launch.fn, int(a[1] == 1), int(b[0] == 1), int(out[1] == 1),
                launch.ksplit, launch.split_steps, mpad, npad)
        quads = (int(whole_quads(m, k, a[0], a[1], a_batch)), int(whole_quads(n, k, b[1], b[0], b_batch)))
        meet = (split.partials, split.counters) if split is not None and launch.ksplit > 1 else bindings[3:] * 2
        coop_bindings = (*bindings, meet[0], residual or bindings[0],
                         *((a_norm.gamma, a_norm.beta) if a_norm else bindings[:1] * 2), meet[1])
        norm = (1, float(a_norm.eps)) if a_norm else (0, 0.0)
        return [Dispatch("gemm_coopmat", coop_bindings,
                         (npad // (64 * launch.fn) * GEMM_THREADS, mpad // (32 * launch.fm), batches * launch.ksplit),
                         push_constants=push,
                         spec_constants=(*spec, int(residual is not None), *activation, COOP_GEMM_BK, *quads, *norm,
                                         COOP_GEMM_PREFETCH),
                         local_size=(GEMM_THREADS, 1, 1))]
    if a_norm is not None:
        raise UnsupportedError(f"{what}: a folded LayerNorm needs the gemm_coopmat launch")
    tile = choose_gemm_tile(m, n, k, batches)
    if tile is None:
        raise UnsupportedError(f"{what} {m}x{n} over {batches} batches: too many work groups")
    gx, gy, gz = tile.grid(m, n, batches)
    return [Dispatch("gemm", (*bindings, residual or bindings[0]), (gx * GEMM_THREADS, gy, gz),
                     push_constants=push,
                     spec_constants=(int(c is not None), tile.bm, tile.bn, tile.ks, tile.bk,
                                     int(a[1] == 1), int(b[0] == 1), int(residual is not None), *activation),
                     local_size=(GEMM_THREADS, 1, 1))]


class GemmLayer(VulkanLayer):
    """A layer of ``gemm_dispatches`` products: on a device and in a mode where
    ``gemm_coopmat`` runs, its products may run there (``coop``)."""

    coop = False

    def specialize(self, caps: DeviceCaps) -> None:
        self.coop = fp16_coopmat(caps, self.precision)


@register("Gemm")
class VulkanGemm(GemmLayer):
    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        self.m, self.n, self.k, self.c_kind = p.dims(self.in_shapes)
        if choose_gemm_tile(self.m, self.n, self.k, 1) is None:
            raise UnsupportedError(f"Gemm {self.m}x{self.n}: too many work groups")
        #: the constant operands, by the index of their weight (read when laid out, never kept)
        self._constants = [key for key, constant in (("A", p.constantA), ("B", p.constantB),
                                                     ("C", p.has_constant_c())) if constant]
        #: a following layer scale folded in: B's columns and C's values multiplied by it
        self._per_n: np.ndarray | None = None
        names = iter(self.layer.inputs)
        self.a = "w:A" if p.constantA else next(names)
        self.b = "w:B" if p.constantB else next(names)
        self.c = "w:C"
        if not p.has_constant_c() and not p.constantC:
            self.c = next(names, "w:C")

    def weights(self) -> dict[str, np.ndarray]:
        out = {"C": _DUMMY}
        out.update((key, np.asarray(w, np.float32).ravel()) for key, w in zip(self._constants, self.layer.weights))
        if self._per_n is not None:
            b = out["B"].reshape((self.n, self.k) if self.params.transB else (self.k, self.n))
            out["B"] = (b * (self._per_n[:, None] if self.params.transB else self._per_n[None, :])).ravel()
            if self.c_kind == 4:
                out["C"] = out["C"] * self._per_n
        if self._row_norm is not None:
            out["norm_gamma"], out["norm_beta"] = self._row_norm[:2]
        return out

    #: the output matrix is written transposed (a following Permute folded in)
    transposed_out = False
    #: a blob of the output's layout added to the output (a following residual sum folded in)
    residual: str | None = None
    #: applied last (a following activation layer folded in)
    activation: tuple[Scalar, ...] = NO_ACTIVATION

    def _rows_are_m(self) -> bool:
        """Whether the shaders store the output matrix as M rows of N (else N rows of M)."""
        return self.params.output_transpose == self.transposed_out

    def take_output_scale(self, scales: np.ndarray, output: str) -> Layer | None:
        """Scale each output column n by one value (pnnx's layer scale after a Linear): B's
        column n and C's value n are multiplied instead, where both are weights (B constant,
        C per column or none) and before a residual is folded in."""
        if (self.b != "w:B" or self.c_kind not in (-1, 4) or self.c != "w:C" or self.residual
                or self.activation != NO_ACTIVATION or scales.size != self.m * self.n):
            return None
        by_m = scales.reshape(self.m, self.n) if self._rows_are_m() else scales.reshape(self.n, self.m).T
        per_n = by_m[0]
        if not np.array_equal(by_m, np.broadcast_to(per_n, by_m.shape)):
            return None  # not one value per column
        self._per_n = per_n if self._per_n is None else self._per_n * per_n
        self.layer = dataclasses.replace(self.layer, outputs=[output])
        return self.layer

    def take_activation(self, activation: tuple[Scalar, ...], output: str) -> Layer | None:
        """The GEMM shaders apply the activation last (activate.h)."""
        if self.activation != NO_ACTIVATION:
            return None
        self.activation = activation
        self.layer = dataclasses.replace(self.layer, outputs=[output])
        return self.layer

    def take_residual(self, residual: str, activation: tuple[Scalar, ...], output: str) -> Layer | None:
        """The GEMM shaders add the residual, then apply the activation; not after an
        activation of their own (it would come before the sum)."""
        if self.residual is not None or self.activation != NO_ACTIVATION:
            return None
        self.activation = activation
        self.residual = residual
        self.layer = dataclasses.replace(self.layer, inputs=[*self.layer.inputs, residual], outputs=[output])
        self.in_shapes = [*self.in_shapes, self.out_shapes[0]]
        self.inplace_inputs = (len(self.layer.inputs) - 1,)  # read where each value is written
        return self.layer

    def take_permuted_output(self, order: np.ndarray, output: str, shape: Shape) -> Layer | None:
        """A transpose of the output matrix (pnnx's Permute after a Linear, through its
        Reshape): the shaders write through strides, so swapping them is free."""
        rows, cols = (self.m, self.n) if self._rows_are_m() else (self.n, self.m)
        if self.residual is not None or not is_transpose(order, rows, cols):
            return None
        self.transposed_out = not self.transposed_out
        self.layer = dataclasses.replace(self.layer, outputs=[output])
        self.out_shapes = [shape]
        return self.layer

    #: a LayerNorm over A's rows applied as they are read (gamma, beta, eps; fold_row_norms)
    _row_norm: tuple[np.ndarray, np.ndarray, float] | None = None

    def take_row_norm(self, gamma: np.ndarray, beta: np.ndarray, eps: float) -> bool:
        """Normalise each row of A as gemm_coopmat reads it (a LayerNorm before the product,
        over K): only on that launch, with A a k-contiguous blob; then whatever the product's
        size (the LayerNorm's dispatch saved pays for it: convnext_tiny's K = 96 products too)."""
        if (self._row_norm is not None or not self.coop or self.a.startswith("w:") or self.params.transA
                or gamma.size != self.k
                or choose_coop_gemm(self.m, self.n, self.k, 1, split=True, by_size=False) is None):
            return False
        self._row_norm = (gamma, beta, eps)
        return True

    def scratch(self) -> dict[str, int]:
        """gemm_coopmat's partials and tile counters when it splits K."""
        launch = choose_coop_gemm(self.m, self.n, self.k, 1, split=True,
                                  by_size=self._row_norm is None) if self.coop else None
        return {} if launch is None else launch.split_scratch(self.m, self.n, 1)

    def zeroed_scratch(self) -> frozenset[str]:
        return SplitScratch.zeroed(self.scratch())

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        m, n, k = self.m, self.n, self.k
        a = (1, m) if p.transA else (k, 1)
        b = (1, k) if p.transB else (n, 1)
        c = (n, 1) if self.c_kind == 3 else _C_STRIDES.get(self.c_kind, (0, 0))
        out = (1, m) if p.output_transpose != self.transposed_out else (n, 1)
        return gemm_dispatches((self.a, self.b, self.c, self.layer.outputs[0]), m, n, k, a, b,
                               c if self.c_kind >= 0 else None, out, alpha=float(p.alpha),
                               beta=float(p.beta), coop=self.coop, split=SplitScratch.of_layer(),
                               residual=self.residual, activation=self.activation,
                               a_norm=None if self._row_norm is None
                               else RowNorm("w:norm_gamma", "w:norm_beta", self._row_norm[2]))


@register("MatMul")
class VulkanMatMul(GemmLayer):
    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        self.out_batch, self.m, self.n, self.k, self.a_batch, self.b_batch = \
            self.params.dims(self.in_shapes)
        if choose_gemm_tile(self.m, self.n, self.k, self.out_batch[0] * self.out_batch[1]) is None:
            raise UnsupportedError(f"MatMul {self.in_shapes}: too many work groups")

    def weights(self) -> dict[str, np.ndarray]:
        return {"C": _DUMMY}

    def dispatches(self) -> list[Dispatch]:
        m, n, k = self.m, self.n, self.k
        if len(self.in_shapes[1]) == 1:
            b = (1, 0)
        else:
            b = (1, k) if self.params.transB else (n, 1)
        a_mat, b_mat = m * k, k * n
        a_batch = (0 if self.a_batch[0] == 1 else self.a_batch[1] * a_mat,
                   0 if self.a_batch[1] == 1 else a_mat)
        b_batch = (0 if self.b_batch[0] == 1 else self.b_batch[1] * b_mat,
                   0 if self.b_batch[1] == 1 else b_mat)
        return gemm_dispatches((self.layer.inputs[0], self.layer.inputs[1], "w:C",
                                self.layer.outputs[0]), m, n, k, (k, 1), b, None, (n, 1),
                               batches=self.out_batch[0] * self.out_batch[1],
                               batch_inner=self.out_batch[1], a_batch=a_batch, b_batch=b_batch,
                               out_batch=m * n, what="MatMul", coop=self.coop)
