"""Depthwise convolution on blocks of 16 channels: small maps.

``conv.depthwise`` works a channel at a time on its planar layout: on a 7x7 map each channel
is 49 outputs, and the plane fill, the taps' passes over a 73-value span and seven row stores
are loops too short for a vector; the per-channel work dominated (1152 channels, 5x5, 7x7, one
Zen 4 core: 0.26 ms, 5 GMAC/s). Here a block of ``LANES`` channels is widened into one padded
image with the channels innermost (a position's 16 channels one vector), so every tap of an
output is one vector multiply-add across the block, four outputs of a row at a time sharing
each tap's weight vector (the sums in straight-line code that LLVM's SLP vectorizer packs).
The epilogue runs over the whole block's sums at once; the stores read them back channel by
channel. The same bits as ``conv.depthwise``: each sum is the bias, then the taps ky-major, kx
ascending. Worth it only where the per-channel costs dominate (``worthwhile``): on wider maps
the transposes in and out cost more than the vectors save.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.conv import G_KH, G_KW, G_OH, G_OW, G_PL, G_PT, G_SH, G_SW
from vkserve.devices.cpu.jit.epilogue import FASTMATH, apply_ops, as_stored, widen
from vkserve.devices.cpu.jit.vectors import SETTINGS

#: channels a block: the sums of one output position are one 512-bit (or two 256-bit) vector
LANES = 16
#: outputs of a row summed together (each tap's weight vector loaded once for them)
ROW_RUN = 4

_U = np.uint64


def worthwhile(kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, og: int, pads: tuple[int, int, int, int],
               ow: int, wide: bool = SETTINGS.vector_bits == 512) -> bool:
    """Undilated, one output per channel, no cropping pads, and a map small enough for the
    per-channel costs to dominate. Measured against ``conv.depthwise`` on one Zen 4 core
    (512-bit vectors: ``wide``; ReLU epilogue, same bits), by output width: stride 1, 3x3 on
    7x7 1.9-2.1x, 8x8 1.6x, 10x10 1.4x faster, but 14x14 0.95x and 16x16 0.83x; 5x5 on 7x7
    2.8x, 14x14 1.4-1.8x, 16x16 1.3x, 28x28 about even. Stride 2, 3x3 to 7x7 2.2x, 14x14 1.2x,
    16x16 0.93x; 5x5 to 7x7 2.6x, 14x14 1.3x, 28x28 0.94x. With 256-bit vectors the planes'
    rows vectorize less and the blocks win on wider maps: one Zen 3 core
    (``benchmarks/depthwise_layers.py``, ReLU6), stride 1, 3x3 on 14x14 1.38-1.41x, 20x20
    even, 28x28 0.68x; 5x5 on 14x14 1.6x, 20x20 1.25x, 28x28 even; stride 2, to 28x28 1.31x
    (3x3) and 1.39x (5x5), to 56x56 0.56x."""
    if (dh, dw, og) != (1, 1, 1) or min(pads) < 0:
        return False
    if (sh, sw) == (1, 1):
        if not wide:
            return ow <= 16 or (ow <= 20 and kh * kw >= 25)
        return ow <= 10 or (ow <= 16 and kh * kw >= 25)
    return ow <= (14 if wide else 28)


def pack_weights(w16: np.ndarray, channels: int, taps: int) -> np.ndarray:
    """bf16 weights (channels, taps) -> (blocks, taps, LANES), channels past the last zero."""
    blocks = -(-channels // LANES)
    packed = np.zeros((blocks * LANES, taps), dtype=np.uint16)
    packed[:channels] = w16.reshape(channels, taps)
    return np.ascontiguousarray(packed.reshape(blocks, LANES, taps).transpose(0, 2, 1))


def pack_bias(bias: np.ndarray) -> np.ndarray:
    """fp32 bias padded with zeros to whole blocks."""
    padded = np.zeros(-(-bias.size // LANES) * LANES, dtype=np.float32)
    padded[:bias.size] = bias
    return padded


def _sums_source(outputs: int) -> str:
    """``outputs`` adjacent outputs of a row: s{o}_{j} = bias of lane j, then + w[tap, j] *
    img[position of output o shifted by the tap, j] over the taps ky-major, kx ascending; stored
    into ``acc`` (the outputs' LANES-value runs from ``a``). Written out per lane (numba has no
    SIMD types: the SLP vectorizer packs the lanes)."""
    lines = ["def sums(acc, a, bias, b0, wt, wbase, img, y, x, kh, kw, wp, sh, sw):"]
    for o in range(outputs):
        lines += [f"    s{o}_{j} = bias[b0 + U({j})]" for j in range(LANES)]
    lines += ["    for ky in range(kh):", "        for kx in range(kw):",
              "            src = U(((y * sh + ky) * wp + x * sw + kx) * L)",
              "            t = wbase + U((ky * kw + kx) * L)"]
    lines += [f"            w{j} = widen(wt[t + U({j})])" for j in range(LANES)]
    for o in range(outputs):
        lines += [f"            s{o}_{j} += w{j} * img[src + U({o} * sw * L + {j})]" for j in range(LANES)]
    for o in range(outputs):
        lines += [f"    acc[a + U({o * LANES + j})] = s{o}_{j}" for j in range(LANES)]
    return "\n".join(lines) + "\n"


def _compile_sums(outputs: int):  # noqa: ANN202
    """``_sums_source`` compiled (numba does not cache exec'd code: compiled once per process;
    it is inlined into the cached kernel)."""
    ns: dict[str, object] = {"U": _U, "L": LANES, "widen": widen}
    exec(compile(_sums_source(outputs), f"<{__name__} sums of {outputs}>", "exec"), ns)  # noqa: S102
    return njit(fastmath=FASTMATH, error_model="numpy", inline="always")(ns["sums"])


_sums_run = _compile_sums(ROW_RUN)
_sums_one = _compile_sums(1)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def depthwise_blocks(x, xrows, wt, bias, ops, padv, geo, parts, out):  # noqa: ANN001
    """``x`` (C, H, W; ``xrows`` the same as (C, H W)) -> ``out`` (C, OH OW): the undilated
    depthwise kernel of ``geo`` (``worthwhile``: no cropping pads), ``padv`` outside the input;
    ``wt`` from ``pack_weights``, ``bias`` from ``pack_bias``; the blocks split into ``parts``
    contiguous tasks."""
    kh, kw, pt, pl = geo[G_KH], geo[G_KW], geo[G_PT], geo[G_PL]
    sh, sw, oh, ow = geo[G_SH], geo[G_SW], geo[G_OH], geo[G_OW]
    c, h, w = x.shape
    hp, wp = (oh - 1) * sh + kh, (ow - 1) * sw + kw  # the padded image, as far as the outputs read it
    blocks = wt.shape[0]
    taps = kh * kw
    wflat = wt.reshape(wt.size)
    for part in prange(parts):
        img = np.empty(hp * wp * LANES, dtype=np.float32)
        for i in range(img.size):  # the pads: never written again
            img[i] = padv
        acc = np.empty(oh * ow * LANES, dtype=np.float32)
        for b in range(part * blocks // parts, (part + 1) * blocks // parts):
            c0 = b * LANES
            n = min(LANES, c - c0)
            for iy in range(min(h, hp - pt)):
                for ix in range(min(w, wp - pl)):
                    q = _U(((iy + pt) * wp + ix + pl) * LANES)
                    s = _U(iy * w + ix)
                    for j in range(LANES):  # lanes past the channels: a copy of the first, dropped
                        img[q + _U(j)] = widen(xrows[_U(c0 + j if j < n else c0), s])
            wbase, b0 = _U(b * taps * LANES), _U(c0)
            for y in range(oh):
                x0 = 0
                while x0 + ROW_RUN <= ow:
                    _sums_run(acc, _U((y * ow + x0) * LANES), bias, b0, wflat, wbase, img, y, x0, kh, kw, wp, sh, sw)
                    x0 += ROW_RUN
                while x0 < ow:
                    _sums_one(acc, _U((y * ow + x0) * LANES), bias, b0, wflat, wbase, img, y, x0, kh, kw, wp, sh, sw)
                    x0 += 1
            apply_ops(acc, acc.size, ops)
            for j in range(n):
                oj, ju = _U(c0 + j), _U(j)
                for s in range(_U(oh * ow)):
                    out[oj, s] = as_stored(acc[s * _U(LANES) + ju], out)
