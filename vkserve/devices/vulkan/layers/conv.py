"""Convolution and ConvolutionDepthWise on Vulkan: five ways chosen per layer.

- ``convdw``: depthwise (one input and one output channel per group), neighbouring
  outputs of one channel per invocation sharing their input rows (``depthwise_outputs``),
  weights in ncnn's order;
- ``conv_gemm``: every other convolution with at least 8 output channels per group, or one
  group: an implicit GEMM (output channels x output pixels, K = input channels x kernel)
  with shared-memory tiles and K split across the slices of a work group, the tile shape
  (``GemmTile``) picked per layer so that a big GPU gets enough work groups;
- ``conv_coopmat``: the same GEMM on cooperative matrices (tensor cores), for the conv_gemm
  layers that vulkan.coopmat's measured rule gives it on devices that have them (fp16 modes);
  K tap-major, split over work groups (``CoopTile``) when the output tiles are too few;
- ``conv_winograd``: 3x3 stride-1 convolutions of one group where vulkan.winograd's measured
  rule takes them: F(m x m, 3x3) in three passes (input transform, (m + 2)^2 GEMMs through
  ``gemm_dispatches``, output transform with the epilogue);
- ``conv``: the rest (grouped convs with few channels per group), 4 output channels of one
  group per invocation.

Padding is the layer's (``ConvolutionParams.pads``: ncnn's ``make_padding``, including the
-233 / -234 SAME modes); the shaders only need the left/top pad because the output size
fixes the rest. Weights are re-laid out per shader: for ``conv`` the 4 output
channels of a tile are one vec4 and consecutive in the inner loop, padded with zeros to a
multiple of 4 channels per group; for ``conv_gemm`` they are A[group][k][channel], padded
with zeros to whole tiles so that the shader reads them without bounds checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.coopmat import coopmat_in_use, coopmat_wanted, fp16_coopmat
from vkserve.devices.vulkan.layers.base import (
    MAX_GROUPS,
    Dispatch,
    Scalar,
    Shape,
    VulkanLayer,
    is_transpose,
    register,
)
from vkserve.devices.vulkan.layers.compute_util import (
    GEMM_THREADS,
    GEMM_UNITS,
    NO_ACTIVATION,
    activation_constants,
    make_dispatch,
    split_k,
)
from vkserve.devices.vulkan.layers.matmul import CoopGemm, SplitScratch, choose_coop_gemm, gemm_dispatches
from vkserve.devices.vulkan.winograd import elements, eligible, tiles, transform_weights, winograd_tile
from vkserve.models.graph import Layer

DW_MAX_SPAN = 16  # convdw.comp's MAX_SPAN: a row's inputs kept in registers


def depthwise_outputs(outw: int, kernel_w: int, stride_w: int, dilation_w: int) -> int:
    """convdw's outputs per invocation along x: two where their row of inputs fits the
    shader's registers (measured on the H200: 2 x 1 blocks beat 1, 4 x 1 and 2 x 2)."""
    fits = stride_w + (kernel_w - 1) * dilation_w + 1 <= DW_MAX_SPAN
    return 2 if fits and outw >= 2 else 1


def _tiles(n: int) -> int:
    return (n + 3) // 4


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# conv_gemm's tile choice aims at the GPU of compute_util.GEMM_UNITS. The constants were
# checked against every tile forced on every conv of mobilenet, mobilenet_v2, resnet50 and
# vgg16 on an H100 (fp16): the choice's total is within 4 % of the per-layer best.
GEMM_GROUPS_PER_UNIT = 8  # resident 256-invocation work groups per unit
GEMM_STEP_LATENCY = 1000  # cycles a step takes however little arithmetic it has (load, barriers)
GEMM_SHARED_FLOATS = 4096  # conv_gemm's shared memory (16 KiB of vec4)


@dataclasses.dataclass(frozen=True)
class GemmTile:
    """conv_gemm's tile: BM output channels x BN output pixels per work group, K split over
    KS slices (BM * BN * KS = 4096: 256 invocations of 4 x 4 outputs), BK values of k per
    slice and step."""

    bm: int
    bn: int
    ks: int
    bk: int

    @staticmethod
    def candidates() -> list[GemmTile]:
        out = []
        for bm in (16, 32, 64):
            for bn in (16, 32, 64):
                ks = GEMM_THREADS * 16 // (bm * bn)
                if not 1 <= ks <= 16:
                    continue
                bk = 32
                while bk > 4 and (bk > min(bm, bn) or ks * bk * (bm + bn) > GEMM_SHARED_FLOATS):
                    bk //= 2
                out.append(GemmTile(bm, bn, ks, bk))
        return out

    def cost(self, m: int, n: int, k: int, groups: int) -> float:
        """Rough cycles on the target GPU: steps of the K loop times the larger of a step's
        latency and the issue time of the work groups that share a unit."""
        wgs = _ceil(m, self.bm) * _ceil(n, self.bn) * groups
        steps = _ceil(k, self.bk * self.ks)
        per_unit = _ceil(wgs, GEMM_UNITS)
        # issue slots of one step of one work group (128 lanes per cycle): 16 FMAs and 2
        # shared loads per k and invocation, ~15 instructions per gathered B value, ~1 per A
        issue = self.bk * (GEMM_THREADS * 18 + self.ks * (15 * self.bn + self.bm)) / 128
        waves = _ceil(per_unit, GEMM_GROUPS_PER_UNIT)
        step = max(GEMM_STEP_LATENCY * waves, per_unit * issue)
        return steps * step + (300 if self.ks > 1 else 0)


def choose_gemm_tile(m: int, n: int, k: int, groups: int) -> GemmTile | None:
    """The cheapest tile by `GemmTile.cost` (ties to the fewer slices) among those whose
    grid fits Vulkan's guaranteed 65535 work groups per dimension; None if none does."""
    fits = [t for t in GemmTile.candidates()
            if _ceil(n, t.bn) <= MAX_GROUPS and _ceil(m, t.bm) <= MAX_GROUPS and groups <= MAX_GROUPS]
    return min(fits, key=lambda t: (t.cost(m, n, k, groups), t.ks), default=None)


# conv_coopmat's FM x FN (BM = 32 FM by BN = 64 FN); 4 x 2 would need all of the 48 KiB of
# shared memory a work group may have everywhere (two buffers of A and B, the epilogue tile)
COOP_TILES = ((1, 1), (1, 2), (2, 1), (2, 2), (4, 1))
COOP_BK = 32  # conv_coopmat's values of K per step (one kernel tap, 32 input channels)


@dataclasses.dataclass(frozen=True)
class CoopTile:
    """conv_coopmat's tile: BM = 32 fm output channels by BN = 64 fn output pixels per
    256-invocation work group; K split over `ksplit` work groups of `split_steps` steps each
    (their fp32 partials added by a second dispatch) when the output tiles alone are too few."""

    fm: int
    fn: int
    ksplit: int
    split_steps: int

    @property
    def bm(self) -> int:
        return 32 * self.fm

    @property
    def bn(self) -> int:
        return 64 * self.fn


COOP_SHORT_K = 16  # steps of K up to which the 32 x 64 tile is taken, the 64 x 64 above


def choose_coop_tile(m: int, n: int, steps: int, groups: int) -> CoopTile | None:
    """conv_coopmat's tile for M output channels and N pixels per group, `steps` steps of K:
    32 x 64 up to `COOP_SHORT_K` steps, 64 x 64 above (on an H200, benchmarks/coopmat_layers.py
    over vgg16, resnet18 and resnet50: 64 x 64 1.0-1.4x faster than 32 x 64 on the long-K
    layers and 0.9-1.1x on short ones; 64 x 128 2-20x slower than either), then K split
    until the device has `COOP_TARGET_GROUPS` work groups. None if the grid does not fit."""
    fm, fn = (1, 1) if steps <= COOP_SHORT_K else (2, 1)
    if _ceil(n, 64 * fn) > MAX_GROUPS or _ceil(m, 32 * fm) > MAX_GROUPS or groups > MAX_GROUPS:
        return None
    ksplit, per = split_k(_ceil(m, 32 * fm) * _ceil(n, 64 * fn) * groups, steps)
    if ksplit * groups > MAX_GROUPS:
        ksplit, per = 1, steps
    return CoopTile(fm, fn, ksplit, per)


def coop_defers(tile: CoopTile, grid: tuple[int, int, int]) -> bool:
    """Whether conv_coopmat bounds its gathered input values when it stores them to shared
    memory (defer = 1: the loads stay in flight through a step's products) rather than as it
    reads them (fewer registers): where K is split or the grid is at most two work groups a
    compute unit. On the H200 the deferred loads took resnet18's and resnet50's coopmat layers
    (104-384 work groups) from 150 / 321 to 135 / 292 us, and vgg16's split layers 1.3-2.0 us
    each, but at 84 registers an invocation against 74 vgg16's conv1_2 / conv2_1 / conv2_2 (one
    split, 392-784 work groups) went from 52 / 28 / 49 to 57 / 40 / 72 us (RESULTS.md, issue
    17, seventeenth session)."""
    groups = grid[0] // GEMM_THREADS * grid[1] * grid[2]
    return tile.ksplit > 1 or groups <= 2 * GEMM_UNITS


@register("Convolution", "ConvolutionDepthWise")
class VulkanConvolution(VulkanLayer):
    """Picks the shader (``kind``) and lays the weights out for it once, at construction."""

    def __init__(self, layer: Layer, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 precision: Precision) -> None:
        super().__init__(layer, in_shapes, out_shapes, precision)
        p = self.params
        self.activation = activation_constants(p.activation_type, p.activation_params)
        c, h, w = self.in_shapes[0]
        oc, self.outh, self.outw = self.out_shapes[0]
        self.groups = p.group_count()
        self.icg, self.ocg = c // self.groups, oc // self.groups
        self.pad_top, _, self.pad_left, _ = p.pads(h, w)
        maxk = p.kernel_h * p.kernel_w
        self.tile: GemmTile | None = None
        if self.icg == 1 and self.ocg == 1:
            self.kind = "convdw"
        else:
            if self.groups == 1 or self.ocg >= 8:
                self.tile = choose_gemm_tile(self.ocg, self.outh * self.outw, self.icg * maxk, self.groups)
            self.kind = "conv" if self.tile is None else "conv_gemm"
        self.coop_tile: CoopTile | None = None
        self.wino_tile = 0  # conv_winograd: m of F(m, 3)
        self.wino_coop = False  # conv_winograd: its GEMMs may run on gemm_coopmat
        self.residual = False
        self.out_hwc = False  # convdw: the output stored channels-last (a Permute folded in)

    def take_residual(self, residual: str, activation: tuple[Scalar, ...], output: str) -> Layer | None:
        """The GEMM kinds add the residual in their epilogue, before the activation; only
        without an activation of their own (it would come before the sum)."""
        if (self.kind not in ("conv_gemm", "conv_coopmat", "conv_winograd") or self.activation[0] != 0
                or self.residual):
            return None
        self.layer = dataclasses.replace(self.layer, inputs=[self.layer.inputs[0], residual], outputs=[output])
        self.in_shapes = [self.in_shapes[0], self.out_shapes[0]]
        self.activation = activation
        self.residual = True
        self.inplace_inputs = (1,)  # read at the index each output value is written to
        return self.layer

    def take_permuted_output(self, order: np.ndarray, output: str, shape: Shape) -> Layer | None:
        """convdw stores channels-last where a Permute to that order follows (pnnx's
        convnext blocks: depthwise, then channels-last for LayerNorm and the Linears)."""
        if (self.kind != "convdw" or self.out_hwc
                or not is_transpose(order, self.groups * self.ocg, self.outh * self.outw)):
            return None
        self.out_hwc = True
        self.layer = dataclasses.replace(self.layer, outputs=[output])
        self.out_shapes = [shape]
        return self.layer

    def specialize(self, caps: DeviceCaps) -> None:
        """The conv_gemm layers that vulkan.winograd's rule takes run as conv_winograd; on
        tensor-core devices in the fp16 modes, of the others those big enough to fill
        16 x 16 x 16 products and measured faster that way (vulkan.coopmat) as conv_coopmat."""
        p = self.params
        coop = fp16_coopmat(caps, self.precision)
        if self.kind == "conv_gemm" and eligible((p.kernel_h, p.kernel_w), (p.stride_h, p.stride_w),
                                                 (p.dilation_h, p.dilation_w), self.groups):
            self.wino_tile = winograd_tile(self.icg, self.outh * self.outw, coopmat_in_use(caps, self.precision),
                                           self.precision is Precision.FP32)
            if self.wino_tile:
                self.kind, self.wino_coop = "conv_winograd", coop
                return
        n, k = self.outh * self.outw, self.icg * self.params.kernel_h * self.params.kernel_w
        if not (self.kind == "conv_gemm" and self.ocg >= 16 and coop
                and coopmat_wanted(self.icg, self._coop_cpad(), self.ocg, n, k)):
            return
        steps = self.params.kernel_h * self.params.kernel_w * self._coop_cpad() // COOP_BK
        self.coop_tile = choose_coop_tile(self.ocg, n, steps, self.groups)
        if self.coop_tile is not None:
            self.kind = "conv_coopmat"

    def weights(self) -> dict[str, np.ndarray]:
        p = self.params
        weight = np.asarray(self.layer.weights[0], dtype=np.float32).ravel()
        bias = (np.asarray(self.layer.weights[1], dtype=np.float32).ravel() if p.bias_term
                else np.zeros(self.groups * self.ocg, np.float32))
        return self._layout(weight, bias, p.kernel_h * p.kernel_w)

    def _layout(self, weight: np.ndarray, bias: np.ndarray, maxk: int) -> dict[str, np.ndarray]:
        if self.kind == "convdw":
            return {"weight": weight, "bias": bias}
        if self.kind == "conv_winograd":
            u = transform_weights(weight.reshape(self.ocg, self.icg, 3, 3), self.wino_tile)
            return {"weight": u.ravel(), "bias": bias}
        g, icg, ocg = self.groups, self.icg, self.ocg
        if self.kind == "conv_coopmat":
            # A[group][m][tap][channel]: K tap-major (the shader's order), channels padded
            _, mpad = self._padded_km()
            a = np.zeros((g, mpad, maxk, self._coop_cpad()), np.float32)
            a[:, :ocg, :, :icg] = weight.reshape(g, ocg, icg, maxk).transpose(0, 1, 3, 2)
            return {"weight": a.ravel(), "bias": bias}
        if self.kind == "conv_gemm":
            k = icg * maxk
            kpad, mpad = self._padded_km()
            a = np.zeros((g, kpad, mpad), np.float32)
            a[:, :k, :ocg] = weight.reshape(g, ocg, k).transpose(0, 2, 1)
            return {"weight": a.ravel(), "bias": bias}
        tiles = _tiles(ocg)
        wt = np.zeros((g, tiles * 4, icg, maxk), np.float32)
        wt[:, :ocg] = weight.reshape(g, ocg, icg, maxk)
        # [g][tile][4][icg][k] -> [g][tile][icg][k][4]
        wt = wt.reshape(g, tiles, 4, icg, maxk).transpose(0, 1, 3, 4, 2)
        bt = np.zeros((g, tiles * 4), np.float32)
        bt[:, :ocg] = bias.reshape(g, ocg)
        return {"weight": np.ascontiguousarray(wt).ravel(), "bias": bt.ravel()}

    def _padded_km(self) -> tuple[int, int]:
        """The GEMM kinds' weight matrix size per group (K rows, M columns), padded to whole
        tiles so that the shaders read it without bounds checks."""
        taps = self.params.kernel_h * self.params.kernel_w
        if self.kind == "conv_coopmat":
            assert self.coop_tile is not None
            return taps * self._coop_cpad(), _ceil(self.ocg, self.coop_tile.bm) * self.coop_tile.bm
        k = self.icg * taps
        assert self.tile is not None
        step = self.tile.bk * self.tile.ks
        return _ceil(k, step) * step, _ceil(self.ocg, self.tile.bm) * self.tile.bm

    def _coop_cpad(self) -> int:
        """conv_coopmat's input channels per kernel tap: rounded up to whole steps."""
        return _ceil(self.icg, COOP_BK) * COOP_BK

    def scratch(self) -> dict[str, int]:
        """conv_coopmat's fp32 partials of a split K ([split][group][mpad][npad]), counted in
        the fp16 storage elements of the modes it runs in; one value when K is not split (the
        shader declares the binding either way). conv_winograd's transformed input
        (V[element][channel][tile]) and products (M[element][out channel][tile]), and its
        GEMMs' partials where gemm_coopmat splits their K."""
        if self.kind == "conv_winograd":
            t, e = self._wino_tiles(), elements(self.wino_tile)
            out = {"wino_v": e * self.icg * t, "wino_m": e * self.ocg * t}
            launch = self._wino_launch()
            if launch is not None:
                out.update(launch.split_scratch(self.ocg, t, e))
            return out
        if self.kind != "conv_coopmat":
            return {}
        t = self.coop_tile
        assert t is not None
        floats = 1
        if t.ksplit > 1:
            floats = t.ksplit * self.groups * self._padded_km()[1] * _ceil(self.outh * self.outw, t.bn) * t.bn
        return {"partial": floats * 2}

    def zeroed_scratch(self) -> frozenset[str]:
        """conv_winograd's GEMMs' tile counters where gemm_coopmat splits their K."""
        return SplitScratch.zeroed(self.scratch())

    def dispatches(self) -> list[Dispatch]:
        p = self.params
        c, h, w = self.in_shapes[0]
        outh, outw = self.outh, self.outw  # (out_shapes[0] is channels-last after a fold)
        bindings = (self.layer.inputs[0], self.layer.outputs[0], "w:weight", "w:bias")
        if self.kind == "conv_winograd":
            return self._wino_dispatches()
        if self.kind in ("conv_gemm", "conv_coopmat"):
            kpad, mpad = self._padded_km()
            psc = (w, h, outw, outh, self.icg, self.ocg, p.kernel_w, p.kernel_h, p.dilation_w,
                   p.dilation_h, p.stride_w, p.stride_h, self.pad_left, self.pad_top,
                   float(p.pad_value), kpad, mpad)
            if self.kind == "conv_coopmat":
                return self._coop_dispatches(psc)
            t = self.tile
            assert t is not None
            gsize = (_ceil(outw * outh, t.bn) * GEMM_THREADS, mpad // t.bm, self.groups)
            return [make_dispatch(self.kind, bindings + (self._residual_binding(),), gsize, psc=psc,
                                  fixed=(t.bm, t.bn, t.ks, t.bk) + self.activation
                                  + (int(self.residual), self.item_stride),
                                  local_size=(GEMM_THREADS, 1, 1), batched=True)]
        if self.kind == "convdw":
            psc = (w, h, outw, outh, c, p.kernel_w, p.kernel_h, p.dilation_w, p.dilation_h,
                   p.stride_w, p.stride_h, self.pad_left, self.pad_top, float(p.pad_value))
            outs = depthwise_outputs(outw, p.kernel_w, p.stride_w, p.dilation_w)
            return [make_dispatch("convdw", bindings, (_ceil(outw, outs), outh, c), psc=psc,
                                  fixed=self.activation + (int(self.out_hwc), outs))]
        tiles = _tiles(self.ocg)
        psc = (w, h, outw, outh, self.icg, self.ocg, tiles, self.groups, p.kernel_w, p.kernel_h,
               p.dilation_w, p.dilation_h, p.stride_w, p.stride_h, self.pad_left, self.pad_top,
               float(p.pad_value))
        return [make_dispatch("conv", bindings, (outw, outh, tiles * self.groups), psc=psc,
                              fixed=self.activation)]

    def _coop_dispatches(self, gemm_psc: tuple[float | int, ...]) -> list[Dispatch]:
        """conv_coopmat's GEMM, then with a split K its reduce pass (same shader, reduce = 1)."""
        t = self.coop_tile
        assert t is not None
        n = self.outh * self.outw
        npad = _ceil(n, t.bn) * t.bn
        psc = gemm_psc + (self._coop_cpad(), npad, t.ksplit, t.split_steps)
        bindings = (self.layer.inputs[0], self.layer.outputs[0], "w:weight", "w:bias", "s:partial",
                    self._residual_binding())
        grid = (npad // t.bn * GEMM_THREADS, self._padded_km()[1] // t.bm, self.groups * t.ksplit)

        def fixed(reduce: int) -> tuple[Scalar, ...]:
            return ((t.fm, t.fn) + self.activation
                    + (reduce, int(self.residual), self.item_stride, int(coop_defers(t, grid))))

        gemm = make_dispatch("conv_coopmat", bindings, grid,
                             psc=psc, fixed=fixed(0), local_size=(GEMM_THREADS, 1, 1), batched=True)
        if t.ksplit == 1:
            return [gemm]
        return [gemm, make_dispatch("conv_coopmat", bindings, (n, self.ocg, self.groups), psc=psc,
                                    fixed=fixed(1), local_size=(GEMM_THREADS, 1, 1), batched=True)]

    def _wino_tiles(self) -> int:
        th, tw = tiles(self.outh, self.outw, self.wino_tile)
        return th * tw

    def _wino_launch(self) -> CoopGemm | None:
        """gemm_coopmat's launch for conv_winograd's GEMMs, None where gemm.comp runs them."""
        if not self.wino_coop:
            return None
        return choose_coop_gemm(self.ocg, self._wino_tiles(), self.icg, elements(self.wino_tile), split=True)

    def _wino_dispatches(self) -> list[Dispatch]:
        """Input transform, the GEMMs M[e] = U[e] (out x in) @ V[e] (in x tiles), output
        transform with the bias, residual and activation."""
        p = self.params
        c, h, w = self.in_shapes[0]
        th, tw = tiles(self.outh, self.outw, self.wino_tile)
        t, m, k = th * tw, self.ocg, self.icg
        into = make_dispatch("winograd_input", (self.layer.inputs[0], "s:wino_v"), (t, c, 1),
                             psc=(w, h, c, tw, th, self.pad_left, self.pad_top, float(p.pad_value)),
                             fixed=(self.wino_tile,), local_size=(64, 1, 1))
        products = gemm_dispatches(("w:weight", "s:wino_v", "w:weight", "s:wino_m"), m, t, k,
                                   a=(k, 1), b=(t, 1), c=None, out=(t, 1), batches=elements(self.wino_tile),
                                   a_batch=(m * k, 0), b_batch=(k * t, 0), out_batch=m * t,
                                   what=f"Convolution {self.layer.name}", coop=self.wino_coop,
                                   split=SplitScratch.of_layer() if self.wino_coop else None,
                                   activation=NO_ACTIVATION)
        back = make_dispatch("winograd_output", ("s:wino_m", self.layer.outputs[0], "w:bias",
                                                 self._residual_binding()),
                             (t, m, 1), psc=(self.outw, self.outh, m, tw, th),
                             fixed=(self.wino_tile, *self.activation, int(self.residual)), local_size=(64, 1, 1))
        return [into, *products, back]

    def _residual_binding(self) -> str:
        """The GEMM shaders' residual binding: the folded residual, else the input (unread)."""
        return self.layer.inputs[1] if self.residual else self.layer.inputs[0]
