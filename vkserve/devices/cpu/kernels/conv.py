"""Convolution, ConvolutionDepthWise and InnerProduct: im2col + GEMM (np.matmul / BLAS).

Weights are narrowed to bf16 once per plan and widened for each call. Padding is the
layer's (``ConvolutionParams.pads``: ncnn's make_padding), filled with ``pad_value``.
"""

from __future__ import annotations

import numpy as np

from vkserve.devices.cpu.bf16 import widen_into
from vkserve.devices.cpu.kernels.base import Kernel, activate, register
from vkserve.devices.cpu.threads import run_chunks, split
from vkserve.models.layers import Shape


def border(x: np.ndarray, top: int, bottom: int, left: int, right: int, value: float) -> np.ndarray:
    """ncnn ``copy_make_border`` on the last two axes; negative amounts cut instead."""
    h, w = x.shape[-2:]
    x = x[..., max(0, -top) : h - max(0, -bottom), max(0, -left) : w - max(0, -right)]
    t, b, l, r = max(0, top), max(0, bottom), max(0, left), max(0, right)
    if t == b == l == r == 0:
        return x
    pad = [(0, 0)] * (x.ndim - 2) + [(t, b), (l, r)]
    return np.pad(x, pad, mode="constant", constant_values=np.float32(value))


#: im2col is built in chunks of output rows of at most this many fp32 values (8 MiB), so
#: the column buffer stays bounded (vgg16's first layers would need 115 MB at once)
COLS_BUDGET = 2 * 1024 * 1024
#: InnerProduct widens its bf16 weights this many values at a time (1 MiB of fp32, about
#: one core's L2) and multiplies each block while it is hot
WEIGHT_BLOCK = 256 * 1024


def im2col(
    xp: np.ndarray, kh: int, kw: int, dh: int, dw: int, sh: int, sw: int, oh: int, ow: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """(C, Hp, Wp) -> (C, kh, kw, oh, ow): one strided copy of a window view (no Python loop).

    ``xp`` may be any array whose last two axes are (Hp, Wp) with a unit element stride.
    """
    c = xp.shape[0]
    s0, s1, s2 = xp.strides
    view = np.lib.stride_tricks.as_strided(
        xp, (c, kh, kw, oh, ow), (s0, s1 * dh, s2 * dw, s1 * sh, s2 * sw), writeable=False
    )
    if out is None:
        return view.copy()
    np.copyto(out, view)
    return out


def fill_border(xp: np.ndarray, t: int, b: int, l: int, r: int, value: float) -> None:
    """Set the (t, b, l, r) border of the last two axes of ``xp`` to ``value``."""
    h, w = xp.shape[-2:]
    v = np.float32(value)
    if t:
        xp[..., :t, :] = v
    if b:
        xp[..., h - b :, :] = v
    if l:
        xp[..., t : h - b, :l] = v
    if r:
        xp[..., t : h - b, w - r :] = v


# Winograd F(4x4, 3x3) (Lavin & Gray): a 6x6 input tile d and a 3x3 kernel g give the 4x4
# outputs A^T [(G g G^T) * (B^T d B)] A; 36 multiplies per output tile and channel pair
# instead of 144, so 3x3 stride-1 convolutions run 36 GEMMs that are 4x smaller in total.
WINO_BT = np.array([
    [4, 0, -5, 0, 1, 0],
    [0, -4, -4, 1, 1, 0],
    [0, 4, -4, -1, 1, 0],
    [0, -2, -1, 2, 1, 0],
    [0, 2, -1, -2, 1, 0],
    [0, 4, 0, -5, 0, 1],
], dtype=np.float32)
WINO_G = np.array([
    [1 / 4, 0, 0],
    [-1 / 6, -1 / 6, -1 / 6],
    [-1 / 6, 1 / 6, -1 / 6],
    [1 / 24, 1 / 12, 1 / 6],
    [1 / 24, -1 / 12, 1 / 6],
    [0, 0, 1],
], dtype=np.float32)
WINO_AT = np.array([
    [1, 1, 1, 1, 1, 0],
    [0, 1, -1, 2, -2, 0],
    [0, 1, 1, 4, 4, 0],
    [0, 1, -1, 8, -8, 1],
], dtype=np.float32)
#: tile rows are transformed in chunks holding at most this many fp32 values per buffer
WINO_BUDGET = 2 * 1024 * 1024


#: G (x) G: the weight transform G g G^T of all 3x3 kernels as one (36 x 9) @ (9 x n) GEMM
WINO_GG = np.kron(WINO_G, WINO_G).astype(np.float32)
#: output channels per block of transformed weights (36 * block * ic values, cache-sized):
#: U is made block by block right before its GEMMs, never whole
WINO_U_BLOCK = 512 * 1024


def winograd_cost_ok(ic: int, oh: int, ow: int) -> bool:
    """Winograd beats im2col + one GEMM here (measured, single thread, numpy + OpenBLAS).

    It saves 4x the multiplies but pays memory passes for the tile transforms and a per-run
    weight transform (4x the widened weights): 1.3-2x faster from about 20x20 outputs and 16
    input channels up; slower at 14x14 with 256-512 channels (the weight transform dominates)
    and with 3 input channels (the output transform dominates).
    """
    return ic >= 16 and oh * ow >= 400


@register("Convolution", "ConvolutionDepthWise")
class Convolution(Kernel):
    """fp32 compute over bf16 storage, without a separate widening pass of the input.

    The bf16 input is widened straight into the interior of a padded fp32 scratch buffer
    (border filled with ``pad_value``), or, for an unpadded 1x1 stride-1 convolution, into a
    flat buffer that is the GEMM's right-hand side as it is. Other convolutions build
    im2col by one strided copy per chunk of output rows and multiply each chunk into its
    columns of the output (np.matmul writes strided outputs through BLAS without a copy).
    The bf16 weights are widened for each run into a scratch slot reused by every layer (no
    fp32 copy is kept); bias and activation are applied in place.
    """

    raw_inputs = True

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        c, h, w = in_shapes[0]
        _, oh, ow = out[0]
        self.group = g = p.group_count()
        kh, kw = p.kernel_h, p.kernel_w
        t, b, l, r = p.pads(h, w)
        self.weight = self.bf16_weight(0)
        self.bias = self.fp32_bias(1) if p.bias_term else None
        # the padded input: negative pads crop, positive pads add a border
        self.crop = (max(0, -t), max(0, -b), max(0, -l), max(0, -r))
        self.border = (max(0, t), max(0, b), max(0, l), max(0, r))
        hc = h - self.crop[0] - self.crop[1]
        wc = w - self.crop[2] - self.crop[3]
        self.padded = (c, hc + self.border[0] + self.border[1], wc + self.border[2] + self.border[3])
        self.winograd = (
            g == 1 and kh == kw == 3 and p.stride_h == p.stride_w == 1
            and p.dilation_h == p.dilation_w == 1 and winograd_cost_ok(c, oh, ow)
        )
        if self.winograd:
            # whole 6x6 tiles: extend the padded input to 4 * tiles + 2 (filled like the border)
            self.tiles = (-(-oh // 4), -(-ow // 4))
            self.extra = (4 * self.tiles[0] + 2 - self.padded[1], 4 * self.tiles[1] + 2 - self.padded[2])
            self.padded = (c, self.padded[1] + self.extra[0], self.padded[2] + self.extra[1])
        else:
            self.extra = (0, 0)
        return out

    def forward_bf16(self, us: list[np.ndarray]) -> list[np.ndarray]:
        return self._run(us[0], bf16=True)

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        return self._run(np.asarray(xs[0], dtype=np.float32), bf16=False)

    def _padded_input(self, x: np.ndarray, bf16: bool) -> np.ndarray:
        """The input widened (if bf16) into the padded fp32 scratch buffer."""
        c, h, w = x.shape
        ct, cb, cl, cr = self.crop
        src = x[:, ct : h - cb, cl : w - cr]
        t, b, l, r = self.border
        b += self.extra[0]
        r += self.extra[1]
        xp = self.buf("pad", self.padded)
        hp, wp = self.padded[1:]
        inner = xp[:, t : hp - b, l : wp - r]
        if bf16:
            i32 = inner.view(np.uint32)
            np.copyto(i32, src, casting="unsafe")
            np.left_shift(i32, np.uint32(16), out=i32)
        else:
            np.copyto(inner, src)
        fill_border(xp, t, b, l, r, self.p.pad_value)
        return xp

    def _winograd(self, xp: np.ndarray, y: np.ndarray) -> None:
        """3x3 stride-1 convolution by Winograd F(4x4, 3x3), in chunks of tile rows.

        The bf16 weights are widened once per run straight into a (9, oc*ic) layout; their
        transform U = G g G^T is made one block of output channels at a time, right before the
        block's 36 GEMMs, so the 4x larger U never goes whole through memory.
        """
        ic = xp.shape[0]
        oc, oh, ow = y.shape
        th, tw = self.tiles
        g_t = self.buf("w", (9, oc * ic))
        g32 = g_t.view(np.uint32)
        np.copyto(g32, self.weight.reshape(oc * ic, 9).T, casting="unsafe")
        np.left_shift(g32, np.uint32(16), out=g32)
        ob = max(1, min(oc, WINO_U_BLOCK // (36 * ic)))
        rows = max(1, min(th, WINO_BUDGET // (36 * max(ic, oc) * tw)))
        s0, s1, s2 = xp.strides
        for r0 in range(0, th, rows):
            r1 = min(th, r0 + rows)
            nt = (r1 - r0) * tw
            # d: the 6x6 input tiles, tile position first: (6, 6, ic, tiles)
            d = self.buf("wino_d", (6, 6, ic, r1 - r0, tw))
            view = np.lib.stride_tricks.as_strided(
                xp[:, 4 * r0 :, :], (6, 6, ic, r1 - r0, tw), (s1, s2, s0, 4 * s1, 4 * s2), writeable=False
            )
            np.copyto(d, view)
            # v = B^T d B over the two tile axes: t1 = B^T d (axis 0), then v[a] = B^T t1[a]^T-side
            t1 = self.buf("wino_t", (6, 6 * ic * nt))
            np.matmul(WINO_BT, d.reshape(6, -1), out=t1)
            v = d.reshape(6, 6, ic * nt)
            np.matmul(WINO_BT, t1.reshape(6, 6, ic * nt), out=v)
            v = v.reshape(36, ic, nt)
            # m = U v: per block of output channels, transform its weights and run 36 GEMMs
            m = self.buf("wino_m", (36, oc, nt))
            for o0 in range(0, oc, ob):
                o1 = min(oc, o0 + ob)
                u = self.buf("wino_u", (36, (o1 - o0) * ic))
                np.matmul(WINO_GG, g_t[:, o0 * ic : o1 * ic], out=u)
                np.matmul(u.reshape(36, o1 - o0, ic), v, out=m[:, o0:o1, :])
            # out tiles = A^T m A
            t2 = self.buf("wino_t", (4, 6 * oc * nt))
            np.matmul(WINO_AT, m.reshape(6, -1), out=t2)
            o = self.buf("wino_o", (4, 4, oc, r1 - r0, tw))
            np.matmul(WINO_AT, t2.reshape(4, 6, oc * nt), out=o.reshape(4, 4, oc * nt))
            # scatter (i, j, oc, ty, tx) -> y[oc, 4 ty + i, 4 tx + j], cropping the last tiles
            y0, y1 = 4 * r0, min(oh, 4 * r1)
            tiles = o.transpose(2, 3, 0, 4, 1)  # (oc, ty, i, tx, j)
            if y1 - y0 == 4 * (r1 - r0) and ow == 4 * tw:
                np.copyto(y[:, y0:y1, :].reshape(oc, r1 - r0, 4, tw, 4), tiles)
            else:
                full = self.buf("wino_y", (oc, r1 - r0, 4, tw, 4))
                np.copyto(full, tiles)
                np.copyto(y[:, y0:y1, :], full.reshape(oc, 4 * (r1 - r0), 4 * tw)[:, : y1 - y0, :ow])

    def _run(self, x: np.ndarray, bf16: bool) -> list[np.ndarray]:
        p, g = self.p, self.group
        c = x.shape[0]
        oc, oh, ow = self.out_shapes[0]
        kh, kw = p.kernel_h, p.kernel_w
        sh, sw, dh, dw = p.stride_h, p.stride_w, p.dilation_h, p.dilation_w
        taps = kh * kw
        cg, og = c // g, oc // g
        y = self.buf("out", (oc, oh, ow))
        xp = self._padded_input(x, bf16)
        weight = None if self.winograd else widen_into(self.weight, self.buf("w", self.weight.size))
        if self.winograd:
            self._winograd(xp, y)
        elif cg == 1 and og > 1:
            # depthwise with a channel multiplier: one multiply-add per tap over repeated input
            wt = weight.reshape(oc, taps, 1, 1)
            src = np.repeat(xp, og, axis=0)
            tmp = self.buf("tmp", (oc, oh, ow))
            for tap in range(taps):
                ky, kx = divmod(tap, kw)
                win = src[:, ky * dh : ky * dh + sh * (oh - 1) + 1 : sh,
                          kx * dw : kx * dw + sw * (ow - 1) + 1 : sw]
                if tap == 0:
                    np.multiply(win, wt[:, 0], out=y)
                else:
                    np.multiply(win, wt[:, tap], out=tmp)
                    np.add(y, tmp, out=y)
        elif cg == 1:
            # depthwise: per channel a (1 x taps) @ (taps x pixels) product over that channel's
            # im2col, batched over channels (chunks of channels bound the column buffer)
            # The channels are split over the engine's threads (numpy and BLAS release the GIL;
            # each thread has its own column buffer) and each thread adds the bias and applies
            # the activation to its channels while they are in cache.
            per = max(1, COLS_BUDGET // max(1, taps * oh * ow))
            wt = weight.reshape(oc, 1, taps)
            y3 = y.reshape(oc, 1, oh * ow)
            pieces = split(oc, oc * taps * oh * ow)
            bufs = [self.buf("cols" if i == 0 else f"cols{i}", (min(per, hi - lo), kh, kw, oh, ow)) for i, (lo, hi) in enumerate(pieces)]

            def channels(i: int, lo: int, hi: int) -> None:
                for c0 in range(lo, hi, per):
                    c1 = min(hi, c0 + per)
                    cols = bufs[i][: c1 - c0]
                    im2col(xp[c0:c1], kh, kw, dh, dw, sh, sw, oh, ow, out=cols)
                    np.matmul(wt[c0:c1], cols.reshape(c1 - c0, taps, oh * ow), out=y3[c0:c1])
                part = y[lo:hi]
                if self.bias is not None:
                    part += self.bias[lo:hi, None, None]
                act = activate(part, p.activation_type, p.activation_params)
                if act is not part:
                    part[...] = act

            run_chunks(channels, pieces)
            return [y]
        elif taps == 1 and sh == 1 and sw == 1:
            # 1x1 stride 1: the (padded) input is already the GEMM's right-hand side
            np.matmul(weight.reshape(g, og, cg), xp.reshape(g, cg, oh * ow), out=y.reshape(g, og, oh * ow))
        elif g > 1:
            cols = im2col(xp, kh, kw, dh, dw, sh, sw, oh, ow,
                          out=self.buf("cols", (c, kh, kw, oh, ow)))
            np.matmul(weight.reshape(g, og, cg * taps), cols.reshape(g, cg * taps, oh * ow),
                      out=y.reshape(g, og, oh * ow))
        else:
            k = c * taps
            rows = max(1, min(oh, COLS_BUDGET // max(1, k * ow)))
            wmat = weight.reshape(oc, k)
            y2 = y.reshape(oc, oh * ow)
            cbuf = self.buf("cols", (k, rows * ow))
            for r0 in range(0, oh, rows):
                r1 = min(oh, r0 + rows)
                n = (r1 - r0) * ow
                part = xp[:, r0 * sh :, :]
                cols = cbuf[:, :n] if r1 - r0 == rows else self.buf("cols", (k, n))
                im2col(part, kh, kw, dh, dw, sh, sw, r1 - r0, ow,
                       out=cols.reshape(c, kh, kw, r1 - r0, ow))
                np.matmul(wmat, cols, out=y2[:, r0 * ow : r1 * ow])
        if self.bias is not None:
            y += self.bias[:, None, None]
        return [activate(y, p.activation_type, p.activation_params)]


@register("InnerProduct")
class InnerProduct(Kernel):
    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        out = super().infer(in_shapes)
        p = self.p
        self.weight = self.bf16_weight(0)
        self.num_input = p.num_input()
        self.bias = self.fp32_bias(1) if p.bias_term else None
        self.rows = p.batch_rows(in_shapes[0]) is not None
        return out

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        """y = W x (+ bias): the bf16 weights are widened block by block into one reusable
        scratch block (about L2-sized) and each block is multiplied while hot, so the weights
        are never widened whole (vgg16's fc6 alone would be 411 MB of fp32)."""
        p = self.p
        n_out, n_in = p.num_output, self.num_input
        w16 = self.weight.reshape(n_out, n_in)
        block = max(1, WEIGHT_BLOCK // max(1, n_in))
        if self.rows:
            x = xs[0]
            y = self.buf("out", (x.shape[0], n_out))
        else:
            x = xs[0].reshape(-1)
            y = self.buf("out", (n_out,))
        wbuf = self.buf("w", min(block, n_out) * n_in)
        for r0 in range(0, n_out, block):
            r1 = min(n_out, r0 + block)
            wb = widen_into(w16[r0:r1], wbuf[: (r1 - r0) * n_in].reshape(r1 - r0, n_in))
            if self.rows:
                np.matmul(x, wb.T, out=y[:, r0:r1])
            else:
                np.matmul(wb, x, out=y[r0:r1])
        if self.bias is not None:
            y += self.bias
        return [activate(y, p.activation_type, p.activation_params)]
