"""Convolutions from the input's padded planes by bf16 pair products (``conv.DOT`` hosts).

``jit.implicit``'s idea without AMX. The GEMM convolution (``conv.conv_gemm``) copies every
input value into its panels once per tap (9x for 3x3) and per pixel block, and on layers of few
input channels that copying outweighs the products: measured on the 2-core Zen 4 VM, one thread,
a 16 -> 64 3x3 layer at 55x55 took 0.76 ms, of which ~0.28 ms did not depend on the output
channels (the same layer with 8 outputs: 0.31 ms). The planes of channel pairs that
``jit.implicit`` fills (``implicit._fill_pair``: once per layer, each padded position's pair as
one 32-bit word) already hold, for k pair (channel pair p, tap t), 16 consecutive positions'
pairs as one 64-byte run: a B operand of ``vdpbf16ps`` (``jit.bf16dot``). Here the K steps are
those (channel pair, tap) pairs, pairs outer, taps inner, and the register tile (MR rows x 32
positions) reads each step's B where ``implicit.step_offsets`` says; as there, the positions
run over the padded width and those between output rows are dropped.

On small maps those dropped columns are a large share (2 of 16 at 14x14, 2 of 9 at 7x7, 1 of 8
at stride 2), and a map's positions are rarely whole blocks of 32: layers of outputs up to
COLUMNS_MAX_WIDTH wide read column planes instead (``implicit.column_geometry``: one plane per
row phase and kernel column, each OW wide, so no position lies between output rows), and a
task's last positions run in a one-strip tile or, up to ``conv.TAIL_MAX`` of them, with the rows
as the lanes (``bf16dot.tail_pixels_table``), all with the same arithmetic per output.

The weights are packed at load per row block of MR rows, each step's MR pairs side by side.
Each output's sum: bias, then the steps in order (each pair's two products as the CPU adds
them); the shape alone fixes it, so the bits do not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.jit.bf16dot import LANES, PairsFrom, compile_dot_micro, tail_pixels_table, tail_width
from vkserve.devices.cpu.jit.conv import (
    AMX,
    DOT,
    G_DW,
    G_KW,
    G_OG,
    G_OH,
    G_OW,
    G_SH,
    G_SW,
    MR,
    NB,
    fill_bias_tile,
    gemm_row_chunks,
    strips_before_tail,
    tail_end,
    tail_start,
    task_of,
)
from vkserve.devices.cpu.jit.epilogue import FASTMATH
from vkserve.devices.cpu.jit.implicit import (
    BLOCK,
    column_geometry,
    fill_planes,
    phase_geometry,
    planes_shape,
    step_offsets,
    store_positions,
)

#: positions a task computes (blocks of BLOCK: the register tile's two strips of LANES)
TASK_POSITIONS = NB
#: output rows a task computes at least
MIN_TASK_ROWS = 2 * MR

_tile = compile_dot_micro(MR, BLOCK // LANES, PairsFrom.TABLE)
#: a task's odd last strip
_strip = compile_dot_micro(MR, 1, PairsFrom.TABLE)
#: output widths up to which a stride-1 layer reads column planes (``column_planes``): each input
#: value is written once per kernel column, which the dropped positions must outweigh. Measured
#: on the 2-core Zen 4 VM (one layer, the kernels before and after alternating in one process,
#: one thread, time after / before): 256 -> 384 at 13x13 0.85, 512 -> 512 at 14x14 0.92, 256 ->
#: 256 at 14x14 0.93, 512 -> 512 at 7x7 0.95, 64 -> 128 at 28x28 0.97-0.98, 96 -> 96 at 28x28
#: 0.995-1.00; from 52 wide slower (64 -> 64 at 52x52 1.08, at 56x56 1.07, 32 -> 32 1.13)
COLUMNS_MAX_WIDTH = 28
#: the same for strided layers, whose stride phases drop fewer positions (one a row at 3x3
#: stride 2) and whose column planes outnumber the phases by less (6 against 4): measured the
#: same way, 3x3 stride 2, 256 -> 512 to 7x7 0.97, 128 -> 256 to 14x14 0.97, 256 -> 256 to
#: 13x13 1.00, 64 -> 128 to 28x28 1.04, 128 -> 128 to 26x26 1.05
COLUMNS_MAX_WIDTH_STRIDED = 14


def worthwhile(groups: int, taps: int, pairs: bool = DOT, tiles: bool = AMX) -> bool:
    """Whether a dense convolution (one group; ``jit.direct`` takes those of few input channels
    first) of ``taps`` kernel taps runs here: on hosts multiplying bf16 pairs (``pairs``)
    without AMX (``tiles``: ``jit.implicit`` takes these layers there), kernels larger than 1x1.
    Measured against the GEMM on the 2-core Zen 4 VM (one layer, both alternating, one
    thread): 3x3 layers 1.1-2.5x faster (16 -> 64 at 55x55 0.58 -> 0.38 ms, 16 -> 16 at 112x112
    1.12 -> 0.45, 64 -> 64 at 56x56 2.0 -> 1.27, 512 -> 512 at 7x7 1.76 -> 1.52, stride 2
    1.17-1.44x), 5x5 1.6-1.7x; but 1x1 layers 0.9-1.0x (each k pair a run in another plane;
    at stride 2 three of the four phases filled for nothing): those stay the GEMM's."""
    return pairs and not tiles and groups == 1 and taps > 1


def pack_weights(w16: np.ndarray, og: int, cg: int, taps: int) -> np.ndarray:
    """bf16 weights (og, cg, taps) -> (row blocks, channel pairs x taps, MR, 2): step (p, t) of
    row block b holds W[MR b + r, 2 p + e, t] at (r, e); rows and a channel past the layer's
    zero."""
    nrb, npairs = -(-og // MR), -(-cg // 2)
    w = np.zeros((nrb * MR, npairs * 2, taps), dtype=np.uint16)
    w[:og, :cg] = w16.reshape(og, cg, taps)
    w = w.reshape(nrb, MR, npairs, 2, taps).transpose(0, 2, 4, 1, 3)
    return np.ascontiguousarray(w).reshape(nrb, npairs * taps, MR, 2)


def column_planes(geo: np.ndarray) -> bool:
    """Does ``conv_pairs`` read this layer from column planes (``implicit.column_geometry``):
    where the stride phases would hold positions between output rows (a kernel reaching past
    a stride's columns), outputs at most COLUMNS_MAX_WIDTH wide (COLUMNS_MAX_WIDTH_STRIDED
    at a stride)."""
    strided = geo[G_SH] > 1 or geo[G_SW] > 1
    return bool((geo[G_KW] - 1) * geo[G_DW] // geo[G_SW] > 0
                and geo[G_OW] <= (COLUMNS_MAX_WIDTH_STRIDED if strided else COLUMNS_MAX_WIDTH))


def pairs_planes_shape(geo: np.ndarray, cg: int, columns: bool) -> tuple[int, int, int]:
    """``conv_pairs``'s ``planes``: (channel pairs, length, 2), column planes or stride phases."""
    if columns:
        return -(-cg // 2), int(geo[G_SH] * geo[G_KW]) * int(column_geometry(geo)[1]), 2
    return planes_shape(geo, cg, 2)


def split(og: int, geo: np.ndarray, threads: int, columns: bool) -> int:
    """Row blocks a task: enough tasks for ``threads`` (about 2 each), MIN_TASK_ROWS rows at
    least."""
    positions = int(geo[G_OH]) * (int(geo[G_OW]) if columns else int(phase_geometry(geo)[0]))
    return gemm_row_chunks(1, og, positions, threads, TASK_POSITIONS, MIN_TASK_ROWS, MR)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def conv_pairs(x, xrows, scale, act, wt, bias, ops, padv, geo, columns, rb_per_task, planes, max_parts,  # noqa: ANN001
               out):
    """Dense convolution, ``x`` (C, H, W; ``xrows`` the same as (C, H W); each channel times its
    ``scale`` value first where ``scale`` is not empty, then the activation ``act``) -> ``out``
    (og, OH * OW); ``wt`` from ``pack_weights``; ``bias`` fp32; ``ops`` the epilogue;
    ``columns`` from ``column_planes``; ``rb_per_task`` from ``split``; ``planes`` of
    ``pairs_planes_shape`` (filled here, a first parallel pass). Tasks: (TASK_POSITIONS padded
    positions, chunk of ``rb_per_task`` row blocks), in at most ``max_parts`` runs."""
    og, oh, ow = geo[G_OG], geo[G_OH], geo[G_OW]
    wp = ow if columns else phase_geometry(geo)[0]
    length = planes.shape[1]
    fill_planes(x, xrows, scale, act, geo, padv, columns, planes, max_parts)
    steps = wt.shape[1]
    boffs = step_offsets(geo, steps, 1, length, columns)
    nrb = wt.shape[0]
    wstride = steps * 2 * MR
    wflat = wt.reshape(wt.size)
    bflat = planes.reshape(planes.size)
    nq = oh * wp
    n_spans = (nq + TASK_POSITIONS - 1) // TASK_POSITIONS
    n_chunks = (nrb + rb_per_task - 1) // rb_per_task
    n_tasks = n_spans * n_chunks
    parts = min(n_tasks, max_parts)
    for part in prange(parts):
        tiles = np.empty((rb_per_task * MR, TASK_POSITIONS), dtype=np.float32)
        tf = tiles.reshape(tiles.size)
        for task in range(part * n_tasks // parts, (part + 1) * n_tasks // parts):
            _, _, q0, n, rb0, nb = task_of(task, n_spans, n_spans, TASK_POSITIONS, nq, rb_per_task, nrb)
            fill_bias_tile(bias, 0, rb0 * MR, og, tiles[:nb * MR])
            strips = strips_before_tail(n)
            for i in range(nb):
                for s in range(0, strips, 2):  # past n: positions the planes hold zeros for, dropped
                    at, ic = 2 * (q0 + s * LANES), i * MR * TASK_POSITIONS + s * LANES
                    if s + 1 < strips:
                        _tile(wflat, (rb0 + i) * wstride, bflat, at, 2 * LANES, boffs, tf, ic, TASK_POSITIONS, steps)
                    else:
                        _strip(wflat, (rb0 + i) * wstride, bflat, at, 2 * LANES, boffs, tf, ic, TASK_POSITIONS, steps)
            if strips * LANES < n:  # the last few, rows as the lanes
                m = n - strips * LANES
                col = tail_start(tiles, strips * LANES, m, nb)
                tail_pixels_table(wflat, rb0 * wstride, wstride, nb, bflat, 2 * (q0 + strips * LANES), boffs, steps,
                                  m, col, tail_width(nb))
                tail_end(col, tiles, strips * LANES, m, nb)
            store_positions(tiles, min(nb * MR, og - rb0 * MR), ops, q0, n, wp, ow, out, rb0 * MR)
