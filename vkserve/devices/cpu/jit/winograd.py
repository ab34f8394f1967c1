"""Winograd F(4x4, 3x3) for dense 3x3 convolutions at stride 1, dilation 1.

Each 4x4 block of outputs (a tile) is computed from the 6x6 input patch under it as
Y = A^T [sum over c of U[c] * V[c]] A, with V = B^T d B the patch's transform and
U = G g G^T the 3x3 kernel's, elementwise over the 36 positions: 36 multiply-adds per tile and
input channel instead of 144. The 36 sums are 36 independent GEMMs (output rows x channels x
tiles), run by the register-tile kernel of ``conv``.

``transform_weights`` computes U once at load, in float64 from the bf16 weights, and keeps it
in fp32 (see there): 36 values per (o, c) where the kernel has 9, so 8x the bytes of the layer's
bf16 weights, a memory trade-off that ``worthwhile`` confines to layers with many tiles.

``winograd43`` splits the tiles into blocks of ``TB`` (row-major over the output) and the output
rows into chunks; a block's patches are transformed for every channel (widened, padding filled
in, each pass vectorized over the block's tiles) once, then each of its chunks runs the 36 GEMMs
for its rows and transforms back (over the block's tiles too), adding the bias and applying the
epilogue to each fp32 row before the one narrowing store. Every output's arithmetic depends on the shape alone (channels ascending in each of the 36 sums, then
the fixed output transform), so the bits are the same whatever the thread count.

The 36 positions (i, k) of U, V and M are stored column-major (at 6 k + i): the input
transform's second pass then writes every sixth row instead of six adjacent ones, the same
arithmetic in a store order measured faster (one layer on the 2-core Intel VM, input transform
of 64 x 56 x 56: 0.44-0.46 -> 0.31-0.40 ms). The output transform writes its tiles straight
into the block's output rows (``_untransform_row``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from vkserve.devices.cpu.bf16 import from_bf16
from vkserve.devices.cpu.jit.conv import (
    _U,
    AMX,
    DOT,
    G_OG,
    G_OH,
    G_OW,
    G_PL,
    G_PT,
    MR,
    _fill_plane,
    strips_fp32,
)
from vkserve.devices.cpu.jit.epilogue import FASTMATH, apply_ops, store_row

#: tiles per task (a multiple of NR: the GEMM's pixel strips)
TB = 32
#: output rows a task computes at least (the tile block's transformed inputs are shared by its
#: row chunks; a chunk reads them again and transforms its own outputs)
MIN_TASK_ROWS = 16
#: a layer whose transformed weights U exceed this many bytes multiplies ``GROUP`` tile blocks a
#: task, each weight panel loaded once for all of them: U is read from memory once per task, and
#: the deep layers' U (13.5-36 MiB) made their products wait on it. Measured on the Zen 4 VM (one
#: thread, the products and output transforms of a layer's blocks, ms, one block a task / two):
#: 512 -> 512 at 28x28 (U 36 MiB) 14.2-14.6 / 11.8-12.1, 384 -> 256 at 26x26 (13.5 MiB) 4.7-5.5 /
#: 4.4-4.7; from 9 MiB down within the runs' spread (256 -> 256 at 56x56 10.2-11.9 / 10.6-12.4);
#: four blocks a task no better than two (``benchmarks/RESULTS.md``, thirty-fifth session)
GROUP_U_BYTES = 12 << 20
GROUP = 2

#: G (6 x 3): the kernel transform of F(4, 3) (interpolation points 0, +-1, +-2, infinity)
G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], dtype=np.float64)

#: where F(4, 3) beats the direct GEMM (measured on the first sessions' 2-core EPYC box, 1 and
#: 2 threads): the transformed weights (4x the multiply-adds' worth of fp32 per tile) must be
#: reused over enough tiles, and the transforms' cost paid by enough channels. 56x56, 64 -> 64:
#: 2.5x faster; 28x28, 128 -> 128: 2.0x; 14x14, 256 -> 256 (16 tiles): 1.0-1.2x at 1 thread,
#: 0.5x at 2; 56x56, 4 -> 64: 0.6-0.8x
MIN_IN = 8
MIN_OUT = 16
#: where the GEMM multiplies in fp32 too (no ``conv.DOT``: Intel's AVX-512 cores, AVX2, NEON)
#: the products alone run at the same rate in both, and F(4, 3) wins from 9 tiles. Measured on
#: the 2-core Intel VM (AVX-512, AMX; one layer, both kernels alternating, median of 20-30;
#: 1 / 2 threads), Winograd's time over the GEMM's: 256 -> 256 at 14x14 (16 tiles) 0.53 / 0.52,
#: 384 -> 384 at 13x13 0.77 / 0.54, 256 -> 256 at 10x10 (9 tiles) 0.82 / 0.87; at 4 tiles even
#: or worse: 128 -> 128 at 7x7 1.02 / 1.01, 256 -> 256 at 8x8 1.00 / 1.05, 512 -> 512 at 7x7
#: 1.78 / 1.70 (its 38 MB of fp32 U read for 4 tiles)
MIN_TILES_FP32 = 9
#: where the layer's alternative multiplies bf16 pairs from the input's planes
#: (``jit.implicit_pairs``, on ``conv.DOT`` hosts; twice the fp32 rate, the Winograd products
#: stay fp32) F(4, 3) keeps the layers of many input channels on larger maps. Measured on the
#: 2-core Zen 4 VM (one layer, the kernels alternating, median of 35; ms, Winograd against the
#: planes at one thread, then at two): 128 -> 128 at 28x28 1.04 / 1.25, 0.72 / 0.80; at 56x56
#: 3.51 / 4.59 (one thread); 256 -> 256 at 28x28 3.98 / 4.90; 512 -> 512 at 28x28 15.1 / 18.8;
#: but from 96 input channels down the planes win or tie: 96 -> 96 at 28x28 0.70 / 0.74,
#: 0.74 / 0.56; 64 -> 64 at 56x56 1.25 / 1.27, 0.84 / 0.69; 32 -> 32 at 56x56 0.55 / 0.38;
#: 16 -> 16 at 112x112 0.75 / 0.45; and layers widening the channels 4x, whose Winograd time
#: goes mostly to the output transforms (16 -> 64 at 55x55 0.60 / 0.38)
MIN_IN_WITH_PAIRS = 128
MIN_TILES = 36
MAX_WIDENING_WITH_PAIRS = 4
#: and, since its output transform stores rows without a copy (thirty-fourth session), the
#: 64-channel layers on maps of 112x112 and more: measured the same way (median of 25; Winograd's
#: time over the planes', one thread / two): 64 -> 64 at 224x224 0.87-0.89 / 0.89-0.94, 64 -> 128
#: at 112x112 0.80-0.85 / 0.91-0.94, 64 -> 64 at 112x112 0.99 / 0.70; smaller maps mixed or lost:
#: 64 -> 64 at 80x80 0.92 / 1.06, at 56x56 0.87-1.04 / 1.03-1.19, at 28x28 0.98-1.04 / 1.03-1.09
MIN_IN_LARGE_MAPS = 64
MIN_TILES_LARGE_MAPS = 28 * 28
#: beside AMX tiles (``conv.AMX``) F(4, 3) never wins: ``jit.implicit`` runs these layers
#: from the input's planes. Measured on the 2-core Intel VM (one thread, ``Plan.profile``, ms,
#: Winograd / implicit): vgg16's 64 -> 64 at 224x224 17.1 / 12.3, 128 -> 128 at 112x112 11.1 /
#: 7.5, 512 -> 512 at 28x28 13.9 / 6.5; resnet18's 64 -> 64 at 56x56 1.15-1.2 / 0.52


def worthwhile(cin: int, og: int, oh: int, ow: int, planes_pairs: bool = DOT, gemm_tiles: bool = AMX) -> bool:
    """Whether a dense 3x3 stride-1 convolution of these sizes runs faster as F(4, 3) than as
    the layer's alternative: the fp32 GEMM, or with ``planes_pairs`` the bf16 pairs from the
    input's planes, or with ``gemm_tiles`` AMX tiles from them."""
    if gemm_tiles:
        return False
    tiles = -(-oh // 4) * -(-ow // 4)
    if planes_pairs:
        deep = cin >= MIN_IN_WITH_PAIRS and tiles >= MIN_TILES
        large = cin >= MIN_IN_LARGE_MAPS and tiles >= MIN_TILES_LARGE_MAPS
        return (deep or large) and MIN_OUT <= og < MAX_WIDENING_WITH_PAIRS * cin
    return cin >= MIN_IN and og >= MIN_OUT and tiles >= MIN_TILES_FP32


def blocks_per_task(u: np.ndarray) -> int:
    """Tile blocks a task multiplies (``GROUP_U_BYTES``), for the weights ``u`` of
    ``transform_weights``. Which task computes a tile does not change its sums."""
    return GROUP if u.nbytes > GROUP_U_BYTES else 1


def transform_weights(w16: np.ndarray, og: int, cin: int) -> np.ndarray:
    """bf16 weights (og, cin, 3, 3) -> U packed as fp32 (36, row blocks, cin, MR), position
    (i, k) at 6 k + i, rows zero-padded to a whole block of MR. fp32, not bf16: rounding U to
    bf16 gave errors of 2.3 % of the output's largest value (the output transform's factors up
    to 8 amplify them), above the engine's bf16 tolerance; fp32 U is 0.0001 %."""
    nrb = -(-og // MR)
    u = np.zeros((36, nrb, cin, MR), dtype=np.float32)
    w = w16.reshape(og, cin * 9)
    for b in range(nrb):  # a row block at a time: float64 temporaries of one block's size
        g = from_bf16(w[b * MR : (b + 1) * MR]).reshape(-1, cin, 3, 3).astype(np.float64)
        u[:, b, :, : g.shape[0]] = np.einsum("ik,ockl,jl->jico", G, g, G).reshape(36, cin, -1)
    return u


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _bt(d0, d1, d2, d3, d4, d5):  # noqa: ANN001, ANN202
    """B^T applied to six values."""
    t1 = d4 - np.float32(4.0) * d2
    t2 = d3 - np.float32(4.0) * d1
    t3 = d4 - d2
    t4 = np.float32(2.0) * (d3 - d1)
    return (np.float32(4.0) * d0 - np.float32(5.0) * d2 + d4, t1 + t2, t1 - t2, t3 + t4, t3 - t4,
            np.float32(4.0) * d1 - np.float32(5.0) * d3 + d5)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _at(m0, m1, m2, m3, m4, m5):  # noqa: ANN001, ANN202
    """A^T applied to six values."""
    s12 = m1 + m2
    d12 = m1 - m2
    s34 = m3 + m4
    d34 = m3 - m4
    return (m0 + s12 + s34, d12 + np.float32(2.0) * d34, s12 + np.float32(4.0) * s34,
            d12 + np.float32(8.0) * d34 + m5)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _put4(y, p, x, bias, s0, s1, s2, s3):  # noqa: ANN001
    """Output row p's four values at columns x .. x + 3, the bias added."""
    y[p, x] = bias + s0
    y[p, x + 1] = bias + s1
    y[p, x + 2] = bias + s2
    y[p, x + 3] = bias + s3


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _untransform_row(m, r, bias, half, y):  # noqa: ANN001
    """y[p, 4 q + s] = bias + (A^T M A)[p, s] of output row r's sums ``m[e, r, q]`` for the
    block's TB tiles at once (A^T down the columns into ``half``, then along the rows), each
    step a loop of constant length over the tiles, so it vectorizes. The second step writes
    each tile's 16 outputs where they lie in the block's four output rows (stores interleaved
    by four, which the vectorizer shuffles into place), so the rows go to the store without a
    copy: measured 2-8 % faster a layer than a tile-major ``y`` copied into rows (one thread on
    the Zen 4 VM: 64 -> 64 at 56x56 1.12 / 1.22 ms, 128 -> 128 at 28x28 0.87 / 0.92)."""
    for k in range(6):
        for q in range(TB):
            y0, y1, y2, y3 = _at(m[k, r, q], m[6 + k, r, q], m[12 + k, r, q], m[18 + k, r, q], m[24 + k, r, q],
                                 m[30 + k, r, q])
            half[k, q] = y0
            half[6 + k, q] = y1
            half[12 + k, q] = y2
            half[18 + k, q] = y3
    for q in range(TB):
        a0, a1, a2, a3 = _at(half[0, q], half[1, q], half[2, q], half[3, q], half[4, q], half[5, q])
        b0, b1, b2, b3 = _at(half[6, q], half[7, q], half[8, q], half[9, q], half[10, q], half[11, q])
        c0, c1, c2, c3 = _at(half[12, q], half[13, q], half[14, q], half[15, q], half[16, q], half[17, q])
        d0, d1, d2, d3 = _at(half[18, q], half[19, q], half[20, q], half[21, q], half[22, q], half[23, q])
        x = 4 * q
        _put4(y, 0, x, bias, a0, b0, c0, d0)
        _put4(y, 1, x, bias, a1, b1, c1, d1)
        _put4(y, 2, x, bias, a2, b2, c2, d2)
        _put4(y, 3, x, bias, a3, b3, c3, d3)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _transform_channel(pflat, offs, n, wpad, patch, half, vflat, c, cin):  # noqa: ANN001
    """Channel ``c``'s transformed patches into ``vflat`` (``v``'s bytes): the 6x6 patch of
    tile q at ``offs[q]`` of the widened plane gathered into ``patch`` (position r 6 + j, q),
    then B^T down its columns into ``half`` and along its rows into v, each step over the
    block's TB tiles at once (a loop of constant length, so it vectorizes; along an output
    row a map has only a few tiles). Tiles n .. TB - 1 of ``patch`` stay zero."""
    w = _U(wpad)
    for q in range(_U(n)):
        base = _U(offs[q])
        for r in range(6):
            for j in range(6):
                patch[r * 6 + j, q] = pflat[base + _U(r) * w + _U(j)]
    for j in range(6):
        for q in range(TB):
            k0, k1, k2, k3, k4, k5 = _bt(patch[j, q], patch[6 + j, q], patch[12 + j, q], patch[18 + j, q],
                                         patch[24 + j, q], patch[30 + j, q])
            half[j, q] = k0
            half[6 + j, q] = k1
            half[12 + j, q] = k2
            half[18 + j, q] = k3
            half[24 + j, q] = k4
            half[30 + j, q] = k5
    step = _U(6 * cin * TB)
    for i in range(6):
        e = _U((i * cin + c) * TB)
        for q in range(TB):
            k0, k1, k2, k3, k4, k5 = _bt(half[i * 6, q], half[i * 6 + 1, q], half[i * 6 + 2, q],
                                         half[i * 6 + 3, q], half[i * 6 + 4, q], half[i * 6 + 5, q])
            at = e + _U(q)
            vflat[at] = k0
            vflat[at + step] = k1
            vflat[at + _U(2) * step] = k2
            vflat[at + _U(3) * step] = k3
            vflat[at + _U(4) * step] = k4
            vflat[at + _U(5) * step] = k5


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _transform_inputs(x, padv, geo, t0, n, c_lo, c_hi, v):  # noqa: ANN001
    """v[e, c, q] for channels c_lo <= c < c_hi: position e of B^T d B, d the 6x6 input patch
    (widened, padding filled in) of tile t0 + q, q < n; zeros for the block's unused tiles."""
    pt, pl, ow = geo[G_PT], geo[G_PL], geo[G_OW]
    cin = v.shape[1]
    ntx = (ow + 3) // 4
    ty0 = t0 // ntx
    ty1 = (t0 + n - 1) // ntx
    wpad = ntx * 4 + 2
    plane = np.empty(((ty1 - ty0) * 4 + 6, wpad), dtype=np.float32)
    pflat = plane.reshape(plane.size)
    offs = np.empty(TB, dtype=np.int64)
    for q in range(n):
        ty = (t0 + q) // ntx
        offs[q] = (ty - ty0) * 4 * wpad + 4 * (t0 + q - ty * ntx)
    patch = np.zeros((36, TB), dtype=np.float32)
    half = np.empty((36, TB), dtype=np.float32)
    vflat = v.reshape(v.size)
    for c in range(c_lo, c_hi):
        _fill_plane(x, c, ty0 * 4 - pt, -pl, 1, 1, padv, plane)
        _transform_channel(pflat, offs, n, wpad, patch, half, vflat, c, cin)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _multiply_and_store(v, u, bias, ops, geo, t0, ntiles, rb0, nb, out):  # noqa: ANN001
    """The 36 GEMMs of row blocks rb0 <= b < rb0 + nb over the tiles of ``v``'s blocks (``v``
    (blocks, 36, cin, TB) from ``_transform_inputs``, the first at tile t0, of ``ntiles``), each
    weight panel multiplied by every block's inputs in turn, then A^T M A plus the bias, the
    epilogue and the narrowing store, block by block."""
    og, oh, ow = geo[G_OG], geo[G_OH], geo[G_OW]
    cin = u.shape[2]
    nblk = v.shape[0]
    ntx = (ow + 3) // 4
    rows = nb * MR
    m = np.zeros((nblk, 36, rows, TB), dtype=np.float32)
    for e in range(36):
        for i in range(nb):
            ue = u[e, rb0 + i]
            for g in range(nblk):
                strips_fp32(ue, v[g, e], m[g, e], cin, i * MR, min(TB, ntiles - t0 - g * TB))
    half = np.empty((24, TB), dtype=np.float32)
    y = np.empty((4, 4 * TB), dtype=np.float32)
    for g in range(nblk):
        tb = t0 + g * TB
        n = min(TB, ntiles - tb)
        ty0 = tb // ntx
        ty1 = (tb + n - 1) // ntx
        mg = m[g]
        for r in range(min(rows, og - rb0 * MR)):
            o = rb0 * MR + r
            _untransform_row(mg, r, bias[o], half, y)
            for p in range(4):
                apply_ops(y[p], 4 * n, ops)
            for ty in range(ty0, ty1 + 1):  # the block's tiles of each tile row: a run of each output row
                a = max(0, tb - ty * ntx)
                b = min(ntx, tb + n - ty * ntx)
                q0 = ty * ntx + a - tb
                cnt = min(4 * b, ow) - 4 * a
                for p in range(min(4, oh - 4 * ty)):
                    store_row(y[p], 4 * q0, out, o, (4 * ty + p) * ow + 4 * a, cnt)


def transformed_shape(geo: np.ndarray, cin: int, rb_per_task: int, nrb: int) -> tuple[int, int, int, int]:
    """The shape of ``winograd43``'s ``v`` argument: every block's transformed inputs where the
    rows are split into several chunks (``rb_per_task`` < ``nrb``), else none."""
    ntiles = -(-int(geo[G_OH]) // 4) * -(-int(geo[G_OW]) // 4)
    return (-(-ntiles // TB) if rb_per_task < nrb else 0, 36, cin, TB)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def winograd43(x, u, bias, ops, padv, geo, rb_per_task, blocks, v, out):  # noqa: ANN001
    """3x3 stride-1 convolution ``x`` (C, H, W) -> ``out`` (og, OH * OW); ``u`` from
    ``transform_weights``; ``bias`` fp32; ``ops`` the epilogue; ``rb_per_task`` row blocks
    (of MR) per task; ``blocks`` tile blocks per task (``blocks_per_task``); ``v`` work space
    of ``transformed_shape``.

    One row chunk: a task per group of tile blocks transforms its inputs and multiplies.
    Several: the inputs of every block are transformed first (tasks over blocks and channel
    ranges), then each (group, row chunk) task multiplies, so no chunk repeats the input
    transform (measured on a 16-core Xeon: resnet50's 7x7 3x3 layers, each chunk transforming
    all 512 channels again, ran no faster on 16 threads than on 4)."""
    oh, ow = geo[G_OH], geo[G_OW]
    nrb, cin = u.shape[1], u.shape[2]
    ntiles = ((ow + 3) // 4) * ((oh + 3) // 4)
    n_blocks = (ntiles + TB - 1) // TB
    n_groups = (n_blocks + blocks - 1) // blocks
    n_chunks = (nrb + rb_per_task - 1) // rb_per_task
    if n_chunks == 1:
        for grp in prange(n_groups):
            b0 = grp * blocks
            nblk = min(blocks, n_blocks - b0)
            vb = np.empty((nblk, 36, cin, TB), dtype=np.float32)
            for g in range(nblk):
                t0 = (b0 + g) * TB
                _transform_inputs(x, padv, geo, t0, min(TB, ntiles - t0), 0, cin, vb[g])
            _multiply_and_store(vb, u, bias, ops, geo, b0 * TB, ntiles, 0, nrb, out)
    else:
        parts = min(cin, n_chunks)
        for task in prange(n_blocks * parts):
            blk = task // parts
            part = task - blk * parts
            t0 = blk * TB
            _transform_inputs(x, padv, geo, t0, min(TB, ntiles - t0), part * cin // parts,
                              (part + 1) * cin // parts, v[blk])
        for task in prange(n_groups * n_chunks):
            rc = task // n_groups
            b0 = (task - rc * n_groups) * blocks
            rb0 = rc * rb_per_task
            _multiply_and_store(v[b0:min(n_blocks, b0 + blocks)], u, bias, ops, geo, b0 * TB, ntiles, rb0,
                                min(nrb, rb0 + rb_per_task) - rb0, out)
