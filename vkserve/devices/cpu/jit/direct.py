"""Dense convolutions of few input channels (a network's first layer: an RGB image) computed
straight from the input's stride-phase planes, without packed panels.

``conv_gemm`` gathers a K x NB panel of receptive fields (K = channels x taps) for every block
of pixels before its products; with K = 27 (3 channels, 3 x 3) each panel feeds few products,
and those layers ran at 10-20 GMAC/s on the 2-core Zen 4 box where deep layers reach 60-90. Here
each input channel is widened once per call into fp32 planes, one per stride phase (as the
depthwise kernel does, ``fill_phases``), so that receptive-field element k = (c, ky, kx) of
output pixel p lies at offs[k] + p in plane coordinates (rows wq wide, the columns between
output rows computed and dropped): the register-tile kernel reads its B rows there directly
(``BRead.OFFSETS``) against fp32 weights widened once at load.

Same sums as ``conv_gemm``'s fp32 kernel: bias, then k ascending (channel, then taps
ky-major), products of widened bf16 values added with fma where the CPU has it; an output is
computed by one task, so the bits do not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.conv import (
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
    MR,
    NB,
    NR,
    BRead,
    compile_micro,
    fill_bias_tile,
    fill_phases,
    task_of,
)
from vkserve.devices.cpu.jit.epilogue import FASTMATH, finish_tile, tile_pass

#: input channels per group up to which a dense convolution runs here (``worthwhile``)
MAX_CHANNELS = 4
#: output rows a task computes at most (its fp32 tile: 64 x NB, 32 KiB)
TASK_ROWS = 64

_micro = compile_micro(NR, BRead.OFFSETS)


def worthwhile(groups: int, cg: int) -> bool:
    """Does a convolution of ``groups`` groups with ``cg`` input channels each run here?"""
    return groups == 1 and cg <= MAX_CHANNELS


def pack_weights(w: np.ndarray, og: int, k: int) -> np.ndarray:
    """fp32 weights [og][k] (the layer's bf16 weights, widened) -> (row blocks, k, MR): row
    block b's weights for depth k are one run of MR values, rows zero-padded to whole blocks."""
    nrb = -(-og // MR)
    padded = np.zeros((nrb * MR, k), dtype=np.float32)
    padded[:og] = w.reshape(og, k)
    return np.ascontiguousarray(padded.reshape(nrb, MR, k).transpose(0, 2, 1))


def planes_size(geo: np.ndarray, c: int) -> int:
    """fp32 values of the planes ``conv_direct`` fills for a ``c``-channel input (its work
    space), NR more for a last strip's lanes past the planes' end."""
    sh, sw = int(geo[G_SH]), int(geo[G_SW])
    prow = int(geo[G_OH]) + (int(geo[G_KH]) - 1) * int(geo[G_DH]) // sh
    wq = int(geo[G_OW]) + (int(geo[G_KW]) - 1) * int(geo[G_DW]) // sw
    return c * sh * sw * prow * wq + NR


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def conv_direct(x, wa, bias, ops, padv, geo, work, max_parts, out):  # noqa: ANN001
    """Dense convolution ``x`` (C, H, W) -> ``out`` (og, OH * OW) with ``wa`` from
    ``pack_weights``, ``bias`` fp32 per output channel, ``ops`` the epilogue; ``work`` of
    ``planes_size`` fp32 values holds the planes; the (block, row chunk) tasks run in at most
    ``max_parts`` contiguous runs, each allocating its tile once."""
    kh, kw, sh, sw = geo[G_KH], geo[G_KW], geo[G_SH], geo[G_SW]
    dh, dw, pt, pl = geo[G_DH], geo[G_DW], geo[G_PT], geo[G_PL]
    og, oh, ow = geo[G_OG], geo[G_OH], geo[G_OW]
    c_in = x.shape[0]
    taps = kh * kw
    k_total = c_in * taps
    prow = oh + (kh - 1) * dh // sh
    wq = ow + (kw - 1) * dw // sw
    plen = prow * wq
    per_channel = sh * sw * plen
    planes = work[:c_in * per_channel].reshape((c_in, sh * sw, prow, wq))
    for j in range(c_in * per_channel, work.size):
        work[j] = np.float32(0.0)  # a last strip's lanes past the planes: never garbage
    for c in prange(c_in):
        fill_phases(x, c, pt, pl, sh, sw, padv, planes[c])
    offs = np.empty(k_total, dtype=np.int64)
    for c in range(c_in):
        for ky in range(kh):
            for kx in range(kw):
                offs[c * taps + ky * kw + kx] = (c * per_channel + ((ky * dh % sh) * sw + kx * dw % sw) * plen
                                                 + ky * dh // sh * wq + kx * dw // sw)
    span = (oh - 1) * wq + ow  # output pixels in plane coordinates
    nrb = wa.shape[0]
    rb_task = max(1, TASK_ROWS // MR)
    n_chunks = (nrb + rb_task - 1) // rb_task
    n_blocks = (span + NB - 1) // NB
    n_tasks = n_blocks * n_chunks
    parts = min(n_tasks, max_parts)
    for part in prange(parts):
        tiles = np.empty((rb_task * MR, NB), dtype=np.float32)
        for task in range(part * n_tasks // parts, (part + 1) * n_tasks // parts):
            _, _, p0, n, rb0, nb = task_of(task, n_blocks, n_blocks, NB, span, rb_task, nrb)
            nrows = nb * MR
            tile = fill_bias_tile(bias, 0, rb0 * MR, og, tiles[:nrows])
            for i in range(nb):
                a = wa[rb0 + i]
                for s in range((n + NR - 1) // NR):
                    _micro(a, work, offs, p0, tile, k_total, i * MR, s)
            rows = min(nrows, og - rb0 * MR)
            store_ops = tile_pass(tile, rows, ops)
            # the block's output rows: plane pixels p0 .. p0 + n - 1, columns past ow dropped
            for oy in range(p0 // wq, (p0 + n - 1) // wq + 1):
                first = max(oy * wq, p0)
                cnt = min(oy * wq + ow, p0 + n) - first
                if cnt <= 0:
                    continue
                ox0 = first - oy * wq
                finish_tile(tile, first - p0, rows, cnt, out, rb0 * MR, oy * ow + ox0, store_ops)
