"""Convolutions on AMX tiles straight from the input (``conv.AMX`` hosts): no panels.

On AMX the GEMM convolution's products run ~20x the fp32 kernel's rate, and its time went to
gathering the input panels (measured on the 2-core Intel VM, one thread: a 3x3 64 -> 64 layer at
56x56 1.6 ms, of which the products' share at the tiles' rate is ~0.15 ms). The panels need not
exist: the input, copied once per layer into padded planes of channel pairs (``planes``: pair p
holds channels 2p, 2p + 1 of each padded position side by side, the bf16 pairs of an AMX B tile
row), already holds every B tile a tap needs. At stride 1, output position (y, x) is computed at
q = y Wp + x of the padded width Wp, tap (ky, kx) reads q + ky dh Wp + kx dw, so 16 consecutive
q of one channel pair are one 64-byte run and 16 pairs (32 channels) one tile, loaded with the
planes' length as its row stride. The Wp - OW columns between output rows are computed and
dropped (2 of 58 at 56x56 for 3x3; none for 1x1). At stride (sh, sw) the planes are split into
the sh x sw stride phases (``phase_geometry``), each a padded image of its own width Wq, and tap
(ky, kx) reads phase (ky dh % sh, kx dw % sw) at shift (ky dh // sh) Wq + kx dw // sw.

The K steps are (channel step of 32, tap) pairs, channels padded with zeros to a multiple of 32;
the weights are packed at load as one 16 x 32 A tile per (row block, step). Each output's sum:
bias, then the steps in that order, within a step the order the CPU fixes (as ``jit.amx``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

import vkserve.devices.cpu.jit.amx as amx
from vkserve.devices.cpu.jit.conv import (
    _U,
    AMX,
    G_DH,
    G_DW,
    G_KH,
    G_KW,
    G_OG,
    G_OH,
    G_OW,
    G_PL,
    G_PT,
    G_SH,
    G_SW,
    _tiles_begin,
    _tiles_end,
    _valid,
    gemm_row_chunks,
)
from vkserve.devices.cpu.jit.epilogue import FASTMATH, bf16_bits, finish_tile, scaled_bits, tile_pass, widen

#: rows of an A tile (output channels of a row block) and pixels of a B tile (a strip)
ROWS = PIXELS = 16
#: input channels of a step (an A tile's depth)
CHANNELS = amx.DEPTH
#: output positions of a 2 x 2 block of C tiles (two strips, with two row blocks)
BLOCK = 2 * PIXELS
#: blocks of positions a task computes, each row pair's over all of them in turn: the pair's
#: weights (32 rows x K) come from memory once per task, then from L2 (a 7x7 map's 512 -> 512
#: layer reads its 4.7 MB of weights once, not once per block; measured on the 2-core Intel
#: VM, in resnet18 at one thread: no faster, 0.65-0.71 ms, against 0.44 ms for the layer alone
#: with its weights in cache: the weights' one read from memory is what is left)
TASK_BLOCKS = 4
#: input channels from which a dense layer runs here (fewer would be mostly padding; the first
#: layers of images, 3 channels, run in ``jit.direct``)
MIN_CHANNELS = 16


def worthwhile(groups: int, cg: int, tiles: bool = AMX) -> bool:
    """Whether a dense convolution runs here: on AMX hosts (``tiles``), one group, at least
    MIN_CHANNELS input channels."""
    return tiles and groups == 1 and cg >= MIN_CHANNELS


def pack_weights(w16: np.ndarray, og: int, cg: int, taps: int) -> np.ndarray:
    """bf16 weights (og, cg, taps) -> A tiles (row blocks, channel steps x taps, 16, 32): step
    (s, t) of row block b holds W[16 b + r, 32 s + j, t] at (r, j); rows and channels past the
    layer's zero."""
    nrb, ncs = -(-og // ROWS), -(-cg // CHANNELS)
    w = np.zeros((nrb * ROWS, ncs * CHANNELS, taps), dtype=np.uint16)
    w[:og, :cg] = w16.reshape(og, cg, taps)
    w = w.reshape(nrb, ROWS, ncs, CHANNELS, taps).transpose(0, 2, 4, 1, 3)
    return np.ascontiguousarray(w).reshape(nrb, ncs * taps, ROWS, CHANNELS)


@njit(cache=True)
def phase_geometry(geo):  # noqa: ANN001, ANN201
    """(phase width Wq, phase rows Hq, phase length Lq) of the stride phases: phase (ry, rx)
    holds padded position (y sh + ry, x sw + rx) at y Wq + x, zeros past its Hq rows up to Lq,
    as far as the last block of positions' taps read."""
    kh, kw, sh, sw, dh, dw = geo[G_KH], geo[G_KW], geo[G_SH], geo[G_SW], geo[G_DH], geo[G_DW]
    wq = geo[G_OW] + (kw - 1) * dw // sw
    hq = geo[G_OH] + (kh - 1) * dh // sh
    blocks = (geo[G_OH] * wq + BLOCK - 1) // BLOCK
    return wq, hq, blocks * BLOCK + (kh - 1) * dh // sh * wq + (kw - 1) * dw // sw


@njit(cache=True)
def column_geometry(geo):  # noqa: ANN001, ANN201
    """(rows Hc, length Lc) of a layer's column planes (``fill_planes`` with ``columns``): plane
    (ry, kx), one per row phase and kernel column, holds padded position (y sh + ry, x sw + kx
    dw) at y OW + x, so that output position q = y OW + x reads tap (ky, kx) at q + (ky dh // sh)
    OW in plane (ky dh % sh, kx), no position between output rows; zeros past its Hc rows up to
    Lc, as far as the last block of positions' taps read."""
    ow, reach = geo[G_OW], (geo[G_KH] - 1) * geo[G_DH] // geo[G_SH]
    blocks = (geo[G_OH] * ow + BLOCK - 1) // BLOCK
    return geo[G_OH] + reach, blocks * BLOCK + reach * ow


def planes_shape(geo: np.ndarray, cg: int, channels: int = CHANNELS) -> tuple[int, int, int]:
    """``planes``' shape: (channel pairs, stride phases x Lq, 2), the channels rounded up to a
    multiple of ``channels`` (a step's)."""
    return -(-cg // channels) * channels // 2, int(geo[G_SH] * geo[G_SW]) * int(phase_geometry(geo)[2]), 2


def split(og: int, geo: np.ndarray, threads: int) -> int:
    """Row blocks a task: enough tasks for ``threads`` (about 2 each), two row blocks at least."""
    positions = int(geo[G_OH]) * int(phase_geometry(geo)[0])
    return gemm_row_chunks(1, og, positions, threads, TASK_BLOCKS * BLOCK, 2 * ROWS, ROWS)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _fill_pair(x, xrows, scale, act, p, geo, padv, words):  # noqa: ANN001
    """Channel pair p of the planes, ``words`` (pairs, length) uint32, each word one position's
    pair (channel 2p in the low half, 2p + 1 in the high half, as a B tile row reads them):
    channels 2p, 2p + 1 of ``x`` (C, H, W; ``xrows`` the same as (C, H W)) padded (``padv``
    outside the input), split into the stride phases (``phase_geometry``); zero past each
    phase's rows (``fill_planes`` zeros the pairs past the input's channels). With a ``scale``
    (one value per channel; none: empty) each input value is first multiplied by its channel's
    (then the activation ``act``) and rounded to bf16, as a per-channel BinaryOp Mul storing
    its product would have.

    A whole word a store: written a channel at a time (two 16-bit stores 4 bytes apart), the
    fill of a 16-channel 1x1 layer at 112x112 took 0.21 ms, about as long as its products, bias
    and stores together (measured on the 2-core Intel VM, one thread). Where the padded plane is
    the input itself (1x1, stride 1, no pads) a pair is one run: row by row, a 1152-channel 7x7
    input took 0.053 ms, half its layer."""
    h, w = x.shape[1], x.shape[2]
    sh, sw, pt, pl = geo[G_SH], geo[G_SW], geo[G_PT], geo[G_PL]
    wq, hq, lq = phase_geometry(geo)
    zero = np.uint32(0)
    source = _pair_source(x, scale, p, padv)
    high, _, c0u, c1u, scaled, s0, s1 = source
    if sh == 1 and sw == 1 and pt == 0 and pl == 0 and wq == w and hq == h:
        pu = _U(p)
        for q in range(_U(h * w)):
            words[pu, q] = _pair(xrows[c0u, q], xrows[c1u, q], high, scaled, s0, s1, act)
        for q in range(h * w, lq):
            words[p, q] = zero
        return
    for ry in range(sh):
        for rx in range(sw):
            _fill_plane_words(x, source, act, words, p, (ry * sw + rx) * lq, wq, hq, lq, ry, rx - pl, geo)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _pair_source(x, scale, p, padv):  # noqa: ANN001, ANN202
    """For channel pair p (its first channel in ``x``): the second channel's half of a word
    (``high``: zero past the input's channels), the padding's word, the two channels (the
    first twice where it is the last), whether each value is first scaled, and the two scales."""
    c0 = 2 * p
    two = c0 + 1 < x.shape[0]
    high = np.uint32(0xFFFF0000) if two else np.uint32(0)
    half = np.uint32(bf16_bits(padv))
    pad = half | ((half << np.uint32(16)) & high)
    c0u, c1u = _U(c0), _U(c0 + 1 if two else c0)
    scaled = scale.size > 0
    s0 = widen(scale[c0u]) if scaled else np.float32(1.0)
    s1 = widen(scale[c1u]) if scaled else np.float32(1.0)
    return high, pad, c0u, c1u, scaled, s0, s1


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _fill_columns(x, scale, act, p, geo, padv, words):  # noqa: ANN001
    """Channel pair p of a layer's column planes (``column_geometry``), a word a position as
    ``_fill_pair`` writes them."""
    kw, sh, dw, pl, ow = geo[G_KW], geo[G_SH], geo[G_DW], geo[G_PL], geo[G_OW]
    hc, lc = column_geometry(geo)
    source = _pair_source(x, scale, p, padv)
    for plane in range(sh * kw):  # (row phase, kernel column); output column 0 reads input column kx dw - pl
        _fill_plane_words(x, source, act, words, p, plane * lc, ow, hc, lc, plane // kw, plane % kw * dw - pl, geo)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _fill_plane_words(x, source, act, words, p, start, width, rows, length, ry, shift, geo):  # noqa: ANN001
    """One plane of channel pair p's ``words``: ``rows`` x ``width`` words from ``start``, zeros
    after them up to start + ``length``; row y, column q holds the input pair at row y sh + ry -
    pt, column shift + q sw, the padding's word outside the input (``source``: ``_pair_source``)."""
    h, w = x.shape[1], x.shape[2]
    sh, sw, pt = geo[G_SH], geo[G_SW], geo[G_PT]
    high, pad, c0u, c1u, scaled, s0, s1 = source
    pu = _U(p)
    lo, hi = _valid(width, shift, sw, w)
    for y in range(rows):
        iy = y * sh + ry - pt
        base = start + y * width
        if iy < 0 or iy >= h:
            for q in range(width):
                words[p, base + q] = pad
            continue
        for q in range(lo):
            words[p, base + q] = pad
        yu, bu, src, st = _U(iy), _U(base + lo), _U(lo * sw + shift), _U(sw)
        for q in range(_U(hi - lo)):
            words[pu, bu + q] = _pair(x[c0u, yu, src + st * q], x[c1u, yu, src + st * q], high, scaled, s0, s1, act)
        for q in range(hi, width):
            words[p, base + q] = pad
    for q in range(start + rows * width, start + length):
        words[p, q] = np.uint32(0)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _pair(a, b, high, scaled, sa, sb, act):  # noqa: ANN001, ANN202
    """One word of the planes: ``a``'s bf16 bits low, ``b``'s high (masked by ``high``); with
    ``scaled``, those of a sa and b sb (then the activation ``act``: ``scaled_bits``)."""
    if scaled:
        lo, hi = scaled_bits(a, sa, act), scaled_bits(b, sb, act)
    else:
        lo, hi = bf16_bits(a), bf16_bits(b)
    return np.uint32(lo) | ((np.uint32(hi) << np.uint32(16)) & high)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def fill_planes(x, xrows, scale, act, geo, padv, columns, planes, max_parts):  # noqa: ANN001
    """``planes`` (pairs, length, 2) filled from ``x`` by ``_fill_pair`` (the stride phases),
    or with ``columns`` by ``_fill_columns`` (the column planes), pair by pair, in at most
    ``max_parts`` contiguous runs of pairs (prange hands out each index apart)."""
    pairs, length = planes.shape[0], planes.shape[1]
    words = planes.reshape(planes.size).view(np.uint32).reshape(pairs, length)
    fills = min(pairs, max_parts)
    for part in prange(fills):
        for p in range(part * pairs // fills, (part + 1) * pairs // fills):
            if 2 * p >= x.shape[0]:  # channels past the input's: zeros
                for q in range(length):
                    words[p, q] = np.uint32(0)
            elif columns:
                _fill_columns(x, scale, act, p, geo, padv, words)
            else:
                _fill_pair(x, xrows, scale, act, p, geo, padv, words)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def step_offsets(geo, steps, pairs, length, columns):  # noqa: ANN001, ANN201
    """Where each K step's B operand starts in the planes (uint16 offsets): steps (channel step
    s of ``pairs`` pairs, tap t), taps inner; tap (ky, kx) reads its phase's plane, shifted,
    or with ``columns`` its row phase's and column's plane (``column_geometry``), rows on."""
    kh, kw, sh, sw, dh, dw = geo[G_KH], geo[G_KW], geo[G_SH], geo[G_SW], geo[G_DH], geo[G_DW]
    wp, _, lq = phase_geometry(geo)
    lc = column_geometry(geo)[1]
    taps = kh * kw
    boffs = np.empty(steps, dtype=np.int64)
    for s in range(steps // taps):
        for t in range(taps):
            ky, kx = t // kw * dh, t % kw * dw
            if columns:
                at = ((ky % sh) * kw + t % kw) * lc + ky // sh * geo[G_OW]
            else:
                at = ((ky % sh) * sw + kx % sw) * lq + ky // sh * wp + kx // sw
            boffs[s * taps + t] = 2 * (s * pairs * length + at)
    return boffs


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def store_positions(tiles, rows, ops, q0, n, wp, ow, out, row0):  # noqa: ANN001, ANN201
    """The epilogue on the first ``rows`` rows of ``tiles`` (columns: padded positions q0 ..
    q0 + n - 1), then each output row's run of them stored at out[row0 + r] (the Wp - OW
    positions between output rows dropped)."""
    left = tile_pass(tiles, rows, ops)
    for y in range(q0 // wp, (q0 + n - 1) // wp + 1):
        lo = max(q0, y * wp)
        hi = min(q0 + n, y * wp + ow)
        if hi > lo:
            finish_tile(tiles, lo - q0, rows, hi - lo, out, row0, y * ow + lo - y * wp, left)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def conv_planes(x, xrows, scale, act, wt, bias, ops, padv, geo, rb_per_task, planes, max_parts, out):  # noqa: ANN001
    """Dense convolution, ``x`` (C, H, W; ``xrows`` the same as (C, H W); each channel times its
    ``scale`` value first where ``scale`` is not empty, then the activation ``act``: ``_fill_pair``)
    -> ``out`` (og, OH * OW);
    ``wt`` from ``pack_weights``; ``bias`` fp32; ``ops`` the epilogue; ``rb_per_task`` from ``split``;
    ``planes`` of ``planes_shape`` (filled here, a first parallel pass). Tasks: (TASK_BLOCKS
    blocks of BLOCK padded positions, chunk of ``rb_per_task`` row blocks), in at most
    ``max_parts`` runs."""
    og, oh, ow = geo[G_OG], geo[G_OH], geo[G_OW]
    wp = phase_geometry(geo)[0]
    length = planes.shape[1]
    fill_planes(x, xrows, scale, act, geo, padv, False, planes, max_parts)
    steps = wt.shape[1]
    boffs = step_offsets(geo, steps, ROWS, length, False)
    nrb = wt.shape[0]
    wstride = steps * ROWS * CHANNELS
    wflat = wt.reshape(wt.size)
    bflat = planes.reshape(planes.size)
    nq = oh * wp
    n_blocks = (nq + BLOCK - 1) // BLOCK
    n_spans = (n_blocks + TASK_BLOCKS - 1) // TASK_BLOCKS
    n_chunks = (nrb + rb_per_task - 1) // rb_per_task
    n_tasks = n_spans * n_chunks
    parts = min(n_tasks, max_parts)
    for part in prange(parts):
        tiles = np.empty((2 * ROWS, BLOCK), dtype=np.float32)
        tf = tiles.reshape(tiles.size)
        start = np.empty((2 * ROWS, PIXELS), dtype=np.float32)  # the row pair's bias, a tile row each
        sf = start.reshape(start.size)
        _tiles_begin()
        for task in range(part * n_tasks // parts, (part + 1) * n_tasks // parts):
            rc = task // n_spans
            b0 = (task - rc * n_spans) * TASK_BLOCKS
            rb1 = min(nrb, (rc + 1) * rb_per_task)
            for i in range(rc * rb_per_task, rb1, 2):
                two = i + 1 < rb1
                for r in range(2 * ROWS):
                    o = i * ROWS + r
                    bv = bias[o] if o < og else np.float32(0.0)
                    for j in range(PIXELS):
                        start[r, j] = bv
                for blk in range(b0, min(n_blocks, b0 + TASK_BLOCKS)):
                    q0 = blk * BLOCK
                    n = min(BLOCK, nq - q0)
                    amx.block(wflat, i * wstride, (i + 1) * wstride, bflat, 2 * q0, 2 * (q0 + PIXELS), boffs,
                              4 * length, sf, 0, PIXELS, 0, tf, 0, BLOCK, steps, two, n > PIXELS)
                    store_positions(tiles, min(2 * ROWS if two else ROWS, og - i * ROWS), ops, q0, n, wp, ow, out,
                                    i * ROWS)
        _tiles_end()
