"""Convolution kernels: grouped GEMM over packed bf16 weight panels, and depthwise.

``conv_gemm`` computes Y[o, p] = bias[o] + sum_k W[o, k] X[k, p] per group, k = (c, ky, kx),
without an im2col of the whole input: each task packs a (KC x NB) block of the input's
receptive fields (widened, padding filled in) into an fp32 panel of NR-pixel strips that stays
in L2, widens the packed weights of each of its MR-row blocks for that block in turn, runs the
MR x NR register-tile kernel over them, and after the last K block applies the epilogue to its fp32
tile and narrows it into the output. Tasks are (group, pixel block, row chunk)
triples; which thread computes an output never changes its value. Where a layer's rows are
split into several chunks, the panels are packed once, in a first parallel pass, into a work
space all chunks read (``shared_panels_shape``), rather than once per chunk.

``depthwise`` (one input channel per group) works on padded fp32 copies of each input plane,
one per stride phase, a tap (three at stride 1) per pass over all of a channel's outputs.

Each output value's sum has a fixed order (bias, then k ascending; fma where the CPU has it).
The micro kernel relies on LLVM's SLP vectorizer (``vkserve.devices.cpu.jit`` turns it on), the
other loops on the loop vectorizer.

On CPUs with AVX-512 BF16 (``DOT``) the GEMM multiplies bf16 pairs instead (``jit.bf16dot``):
the panels hold the input's bf16 values (an fp32 input is rounded to bf16 there, as bf16 storage
would have stored it), each k pair of a pixel adjacent, the weights likewise, and the sums run
over k pairs ascending (within a pair in the order the CPU's instruction adds them; denormals
flushed to zero). Nothing is widened. Where there are no AMX tiles, a 1x1 stride-1 layer's bf16
input is not packed at all: the pair kernel reads two channels' rows of pixels and interleaves
them in a register (``ROWS_DIRECT``), with the panels' bits.

On CPUs with AMX (``AMX``) the same bf16 panels are the B tiles of ``jit.amx``'s product, the
weights are packed as its A tiles (row blocks of ``BR`` = 16 rows, each 32-deep step a
16 x 32 run), depths padded to 32 in both (``KALIGN``), and each 32-deep step's sums run in the
order the CPU fixes.
"""

from __future__ import annotations

import enum

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

import vkserve.devices.cpu.jit.amx as amx
from vkserve.devices.cpu.jit.bf16dot import (
    TAIL_PIXELS,
    Finish,
    PairsFrom,
    compile_dot_micro,
    tail_pixels,
    tail_width,
)
from vkserve.devices.cpu.jit.epilogue import (
    FASTMATH,
    apply_ops,
    as_stored,
    finish_tile,
    scaled_bits,
    store_row_inline,
    stored_op,
    tile_pass,
    widen,
)
from vkserve.devices.cpu.jit.vectors import SETTINGS

#: output rows x pixels of the micro kernel's register tile: 4 x 2 AVX2 registers of fp32, or
#: 8 x 1 AVX-512 registers where the kernels are compiled for those (``jit.vectors``)
MR, NR = SETTINGS.tile_rows, 16
#: pixels per task at most (a multiple of NR)
NB = 128
#: pixels per task at least, where a layer has too few tasks for its threads (two strips)
MIN_BLOCK = 2 * NR
#: reduction depth per packed panel (KC x NB fp32: 128 KiB, L2-resident)
KC = 256
#: output rows a task computes at least, where there are that many (amortizes its packing:
#: every row chunk of a pixel block packs that block's input again)
MIN_TASK_ROWS = 32

#: bf16 pair products in the GEMM (``jit.bf16dot``; AVX-512 BF16 hosts)
DOT = SETTINGS.bf16_dot
#: AMX tile products in the GEMM (``jit.amx``; AMX hosts)
AMX = SETTINGS.amx
#: depths a weight or panel row pairs up (2: bf16 pairs), and the input panels' element type
#: and layout: (NB / NR strips, PANEL_ROWS, PANEL_COLS) = (strips, KC, NR) fp32, or with
#: ``DOT`` or ``AMX`` (strips, KC / 2, NR pairs) bf16
PAIR = 2 if DOT or AMX else 1
PANEL = np.uint16 if DOT or AMX else np.float32
PANEL_ROWS, PANEL_COLS = KC // PAIR, NR * PAIR
#: rows of a block of packed GEMM weights (an AMX A tile's; else the register tile's), and the
#: depth that weights and panels are zero-padded to a multiple of (an AMX step's; else a pair)
BR = 16 if AMX else MR
KALIGN = amx.DEPTH if AMX else PAIR

#: index type of the hot loops: numba wraps negative signed indices, a select per access that
#: keeps LLVM from vectorizing; unsigned ones need none
_U = np.uint64

# geometry vector layout (int64): see ``geometry``
G_GROUPS, G_CG, G_OG, G_KH, G_KW, G_SH, G_SW, G_DH, G_DW, G_PT, G_PL, G_OH, G_OW = range(13)


def geometry(groups: int, cg: int, og: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int,
             pt: int, pl: int, oh: int, ow: int) -> np.ndarray:
    """The kernels' shape parameters as one int64 vector (pads: top and left; negative crops)."""
    return np.array([groups, cg, og, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow], dtype=np.int64)


def pack_gemm_weights(w16: np.ndarray, groups: int, og: int, k: int) -> np.ndarray:
    """bf16 weights [groups * og][k] -> panels (groups, row blocks, k / PAIR, BR x PAIR), rows
    zero-padded to a whole block, k to a multiple of KALIGN: a row block's weights for depth k
    (a pair of depths with ``DOT``, each row's two adjacent) are one run; with ``AMX`` a row
    block's 32-deep step is one (BR, 32) A tile, row-major."""
    nrb = -(-og // BR)
    kp = -(-k // KALIGN) * KALIGN
    w = np.zeros((groups, nrb * BR, kp), dtype=np.uint16)
    w[:, :og, :k] = w16.reshape(groups, og, k)
    if AMX:
        w = w.reshape(groups, nrb, BR, kp // KALIGN, KALIGN).transpose(0, 1, 3, 2, 4)
    else:
        w = w.reshape(groups, nrb, BR, kp // PAIR, PAIR).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(w).reshape(groups, nrb, kp // PAIR, BR * PAIR)


class BRead(enum.Enum):
    """How a register-tile kernel reads its B operand (``_micro_source``): b(k, p) for depth k,
    pixel p = s NR + j of the tile."""

    STRIPS = "strips"  # b[s, k, j]: a packed panel of NR-wide strips
    ROWS = "rows"  # b[k, p]: one (k, pixels) matrix
    OFFSETS = "offsets"  # b[offs[k] + p0 + p]: row k of B at offs[k] in the flat array b


def _micro_source(nr: int, b_read: BRead, strips: int = 1, split: bool = False) -> str:
    """The MR x nr register-tile kernel as straight-line code (nr <= NR: the first nr pixels of
    strip s), over ``strips`` adjacent strips (s, s + 1, ...; nr = NR then): c[r0 + r, (s + t) NR
    + j] += sum over k < kc of a[k, r] b(k, (s + t) NR + j) (k ascending), b read as ``b_read``
    says (``BRead.OFFSETS``: the input planes of ``jit.direct``).

    Written out per accumulator so that LLVM's SLP vectorizer turns each row of NR scalars into
    vector registers that stay live across the k loop (numba cannot express SIMD types); the
    offsets are unsigned, since numba's wrap-around of negative signed indices would break the
    runs of consecutive addresses the vectorizer looks for. Two strips give each weight loaded
    twice the products: with one, an 8-row tile of 512-bit vectors loads a weight per FMA.

    ``split``: the odd k's products in sums of their own, added to the even k's after the loop
    (a fixed order still): a tile of half a strip has too few sums to hide the FMA's latency
    otherwise. Measured on a Zen 3 core, 256 deep: the half strip 322 ns a call against 365 for
    a whole one, twice its products."""
    cols = [(t, j) for t in range(strips) for j in range(nr)]
    acc = [[f"c{r}_{t}_{j}" for t, j in cols] for r in range(MR)]
    odd = [[f"d{r}_{t}_{j}" for t, j in cols] for r in range(MR)]
    header = "def micro(a, b, offs, p0, c, kc, r0, s):" if b_read is BRead.OFFSETS else "def micro(a, b, c, kc, r0, s):"
    lines = [header, "    r0 = U(r0)", "    s = U(s)", f"    j0 = s * U({NR})"]
    lines += [f"    {acc[r][i]} = c[r0 + U({r}), j0 + U({t * NR + j})]" for r in range(MR) for i, (t, j) in enumerate(cols)]
    load = {BRead.STRIPS: "b[s + U({t}), k, U({j})]", BRead.ROWS: "b[k, j0 + U({tj})]",
            BRead.OFFSETS: "b[o + U({tj})]"}[b_read]

    def step(sums: list[list[str]], indent: str) -> list[str]:
        body = [f"{indent}o = U(offs[k]) + U(p0) + j0"] if b_read is BRead.OFFSETS else []
        body += [f"{indent}b{t}_{j} = " + load.format(t=t, j=j, tj=t * NR + j) for t, j in cols]
        for r in range(MR):
            body.append(f"{indent}a{r} = a[k, U({r})]")
            body += [f"{indent}{sums[r][i]} += a{r} * b{t}_{j}" for i, (t, j) in enumerate(cols)]
        return body

    if split:
        lines += [f"    {odd[r][i]} = F(0.0)" for r in range(MR) for i in range(len(cols))]
        lines += ["    for h in range(U(kc) >> U(1)):", "        k = h << U(1)", *step(acc, " " * 8),
                  "        k += U(1)", *step(odd, " " * 8), "    if U(kc) & U(1):", "        k = U(kc) - U(1)",
                  *step(acc, " " * 8)]
        lines += [f"    {acc[r][i]} += {odd[r][i]}" for r in range(MR) for i in range(len(cols))]
    else:
        lines += ["    for k in range(U(kc)):", *step(acc, " " * 8)]
    lines += [f"    c[r0 + U({r}), j0 + U({t * NR + j})] = {acc[r][i]}" for r in range(MR) for i, (t, j) in enumerate(cols)]
    return "\n".join(lines) + "\n"


def compile_micro(nr: int, b_read: BRead = BRead.STRIPS, strips: int = 1, split: bool = False):  # noqa: ANN201
    """The register-tile kernel of ``_micro_source`` compiled (numba does not cache exec'd code)."""
    ns: dict[str, object] = {"U": _U, "F": np.float32}
    name = f"<{__name__} micro kernel {MR}x{nr * strips} {b_read.value}{' split' if split else ''}>"
    exec(compile(_micro_source(nr, b_read, strips, split), name, "exec"), ns)  # noqa: S102
    return njit(fastmath=FASTMATH, error_model="numpy")(ns["micro"])


_micro = compile_micro(NR)
#: two strips at once (``_micro_source``)
_micro2 = compile_micro(NR, BRead.STRIPS, 2)
#: two strips a call where the registers hold their accumulators: 16 of AVX-512's 32 registers;
#: with 256-bit vectors (16 registers) the 16 accumulators spill: measured on a Zen 3 core,
#: 256-deep panels in L2, 4 x 32 at 45.5 GFLOP/s against 92.3 for 4 x 16 (NEON: 32 registers
#: of 128 bits, 32 accumulators)
TWO_STRIPS = SETTINGS.vector_bits == 512
#: the same over one (k, pixels) matrix (``jit.winograd``'s products)
_micro_rows = compile_micro(NR, BRead.ROWS)
_micro2_rows = compile_micro(NR, BRead.ROWS, 2)
_micro_half_rows = compile_micro(NR // 2, BRead.ROWS, split=True)
#: for a block's last strip when it holds at most NR / 2 pixels (7 x 7 outputs: 49 = 3 x 16 + 1)
_micro_half = compile_micro(NR // 2, split=True)
#: with ``DOT``: MR x 2 strips (16 accumulators: enough to hide the product's latency), and a
#: block's odd last strip
_dot2 = compile_dot_micro(MR, 2)
_dot1 = compile_dot_micro(MR, 1)
#: with ``ROWS_DIRECT``: the same tile reading a 1x1 layer's bf16 input rows (no panel)
_dot2_rows = compile_dot_micro(MR, 2, PairsFrom.ROWS)
#: with ``DOT``, a layer of one K block: the sums start from the bias and are stored through the
#: epilogue from the registers (``Finish.STORE``), no fp32 tile
_dot2_store = compile_dot_micro(MR, 2, PairsFrom.PANEL, Finish.STORE)
_dot1_store = compile_dot_micro(MR, 1, PairsFrom.PANEL, Finish.STORE)
_dot2_rows_store = compile_dot_micro(MR, 2, PairsFrom.ROWS, Finish.STORE)

#: 1x1 stride-1 unpadded layers on a bf16 input, with no channel scale and at most
#: ROWS_DIRECT_MAX output channels a group, multiply the input's channel rows straight into the
#: pair kernel (``bf16dot.row_pairs`` interleaves two rows in a register) instead of packing
#: panels: on DOT hosts without AMX (AMX tiles read packed panels). Each row block interleaves
#: the rows again, where a panel is packed once for all: measured on the Zen 4 box, one core,
#: each layer alone (panels -> rows, ms), 96 -> 16 at 112 x 112 0.40 -> 0.31, 32 -> 16 0.20 ->
#: 0.17, 144 -> 24 at 56 x 56 0.177 -> 0.155, 192 -> 32 at 28 x 28 0.075 -> 0.072, 240 -> 40
#: even, 288 -> 48 0.143 -> 0.147, 384 -> 64 at 14 x 14 0.068 -> 0.074, 16 -> 96 at 112 x 112
#: 0.47 -> 0.56
ROWS_DIRECT = DOT and not AMX
ROWS_DIRECT_MAX = 32


def _put(panel, s, k, j, v):  # noqa: ANN001, ANN201  (numba overload below)
    """The input panel's element (strip s, depth k, pixel j) = v, an input value (bf16 bits or
    fp32), in the panel's layout (``PANEL``)."""
    raise NotImplementedError


@overload(_put, inline="always")
def _put_impl(panel, s, k, j, v):  # noqa: ANN001, ANN202
    if panel.dtype == types.uint16:
        one = _U(1)

        def pair(panel, s, k, j, v):  # noqa: ANN001, ANN202
            ku = _U(k)
            panel[_U(s), ku >> one, _U(2) * _U(j) + (ku & one)] = as_stored(v, panel)
        return pair

    def fp32(panel, s, k, j, v):  # noqa: ANN001, ANN202
        panel[s, k, j] = as_stored(v, panel)
    return fp32


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _valid(n: int, start: int, step: int, size: int) -> tuple[int, int]:
    """[lo, hi) of q in [0, n) with 0 <= start + q * step < size (step > 0)."""
    lo = 0 if start >= 0 else (-start + step - 1) // step
    hi = (size - 1 - start) // step + 1 if size - 1 - start >= 0 else 0
    lo = min(lo, n)
    return lo, max(lo, min(hi, n))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _fill_plane(x, c, iy0, ix0, sy, sx, padv, plane):  # noqa: ANN001
    """plane[r, q] = x[c, iy0 + r sy, ix0 + q sx], ``padv`` outside the input, as ``plane``
    stores them (``as_stored``: widened into fp32, kept or rounded into bf16; direct unsigned
    indexing: no views, which cost an atomic reference count update each)."""
    h, w = x.shape[1], x.shape[2]
    rows, cols = plane.shape
    lo, hi = _valid(cols, ix0, sx, w)
    cu = _U(c)
    padv = as_stored(padv, plane)
    for r in range(rows):
        iy = iy0 + r * sy
        if iy < 0 or iy >= h:
            for q in range(cols):
                plane[r, q] = padv
            continue
        for q in range(lo):
            plane[r, q] = padv
        yu, base, st, ru, lu = _U(iy), _U(ix0 + lo * sx), _U(sx), _U(r), _U(lo)
        for q in range(_U(hi - lo)):
            plane[ru, lu + q] = as_stored(x[cu, yu, base + st * q], plane)
        for q in range(hi, cols):
            plane[r, q] = padv


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _at_or(x, cu, yu, ix, w, padv):  # noqa: ANN001, ANN202
    """Widened x[c, y, ix], or ``padv`` where ix is outside the row."""
    return widen(x[cu, yu, _U(ix)]) if 0 <= ix < w else padv


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _fill_pair(x, c, iy0, ix0, sy, padv, even, odd):  # noqa: ANN001
    """The two column phases of stride 2 in one pass over each input row: even[r, q] = widened
    x[c, iy0 + r sy, ix0 + 2 q], odd[r, q] the same at ix0 + 2 q + 1, ``padv`` outside the
    input. The interior loop reads the row contiguously and deinterleaves it (vectorized),
    where a fill per phase would be a strided scalar gather each."""
    h, w = x.shape[1], x.shape[2]
    rows, cols = even.shape
    lo0, hi0 = _valid(cols, ix0, 2, w)
    lo1, hi1 = _valid(cols, ix0 + 1, 2, w)
    lo = max(lo0, lo1)
    hi = max(lo, min(hi0, hi1))
    cu = _U(c)
    for r in range(rows):
        iy = iy0 + r * sy
        if iy < 0 or iy >= h:
            for q in range(cols):
                even[r, q] = padv
                odd[r, q] = padv
            continue
        yu = _U(iy)
        for q in range(lo):
            even[r, q] = _at_or(x, cu, yu, ix0 + 2 * q, w, padv)
            odd[r, q] = _at_or(x, cu, yu, ix0 + 2 * q + 1, w, padv)
        base, ru, lu = _U(ix0 + 2 * lo), _U(r), _U(lo)
        for q in range(_U(hi - lo)):
            even[ru, lu + q] = widen(x[cu, yu, base + _U(2) * q])
            odd[ru, lu + q] = widen(x[cu, yu, base + _U(2) * q + _U(1)])
        for q in range(hi, cols):
            even[r, q] = _at_or(x, cu, yu, ix0 + 2 * q, w, padv)
            odd[r, q] = _at_or(x, cu, yu, ix0 + 2 * q + 1, w, padv)


#: plane width from which stride 2's two column phases are filled in one pass (measured,
#: depthwise 3x3 s2 on one core: 112x112 input 1.56x faster; below, its edge handling costs
#: more than the strided gathers it saves: 14x14 input 0.88x)
PAIR_MIN_COLS = 16


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def fill_phases(x, c, pt, pl, sh, sw, padv, planes):  # noqa: ANN001
    """planes[ry * sw + rx][r, q] = widened x[c] at (r sh + ry - pt, q sw + rx - pl), ``padv``
    outside: the stride phases of channel c's padded input, each read at unit stride after."""
    for ry in range(sh):
        if sw == 2 and planes.shape[2] >= PAIR_MIN_COLS:
            _fill_pair(x, c, ry - pt, -pl, sh, padv, planes[ry * 2], planes[ry * 2 + 1])
            continue
        for rx in range(sw):
            _fill_plane(x, c, ry - pt, rx - pl, sh, sw, padv, planes[ry * sw + rx])


#: input width up to which strided depthwise and pooling layers fill their phase planes from
#: one padded image of the channel (``fill_phases_small``) rather than by ``fill_phases`` (one
#: layer, one core: 14-32 wide 1.02-1.31x faster, 56 wide 0.96-0.98x, 112 wide 0.75x)
SMALL_PHASE_MAX_COLS = 32


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def fill_phases_small(x, c, pt, pl, sh, sw, padv, planes, img):  # noqa: ANN001
    """``fill_phases`` for small maps: channel c widened once into ``img``, its padded image
    (img[r, q] = x[c, r - pt, q - pl], ``padv`` outside the input; (prow sh, wq sw) for planes
    of (prow, wq)), then each phase plane copied out of it at the stride, with no bounds checks
    per value (``_fill_plane`` per phase checks each row and runs a short loop: most of a small
    map's depthwise time went there)."""
    _fill_plane(x, c, -pt, -pl, 1, 1, padv, img)
    prow, wq = planes.shape[1], planes.shape[2]
    for ry in range(sh):
        for rx in range(sw):
            ph = _U(ry * sw + rx)
            for r in range(prow):
                row, ru = _U(r * sh + ry), _U(r)
                for q in range(_U(wq)):
                    planes[ph, ru, q] = img[row, _U(rx) + _U(sw) * q]


#: slack (values) at the end of the depthwise kernel's buffers for ``_fill_unit_stride``'s runs
RUN_SLACK = 16
#: input width up to which stride-1 depthwise layers fill their plane by ``_fill_unit_stride``
#: (rows up to a vector; one core, against ``fill_phases``, with the stores of small maps: 14
#: and 7 wide layers 1.20-1.29x faster with 3x3 kernels, 1.08-1.10x with 5x5; 28 wide from
#: 0.92x to 1.05x in four runs, 56 wide 1.15x slower and 112 wide 1.10x slower: their rows
#: vectorize as they are, and the channel's extra pass costs)
UNIT_FILL_MAX_COLS = 16


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _fill_unit_stride(xrows, c, h, w, pt, pl, padv, pf, rows, cols, tmp):  # noqa: ANN001
    """pf[r cols + q] = widened x[c, r - pt, q - pl], ``padv`` outside the input: ``fill_phases``
    at stride 1 (one plane) for the depthwise kernel, whose rows on small maps (7-28 values) are
    too short a loop to vectorize. ``xrows`` is x as (C, H W); the channel is widened into
    ``tmp`` in one loop, then each row is one copy of at least ``RUN_SLACK`` values, which runs
    on into the row's right padding and the next row's start (both written after it); ``tmp``
    and ``pf`` have ``RUN_SLACK`` values past what they hold."""
    cu = _U(c)
    for q in range(_U(h * w)):
        tmp[q] = widen(xrows[cu, q])
    lo, hi = _valid(cols, -pl, 1, w)
    run = _U(max(hi - lo, RUN_SLACK))
    for r in range(rows):
        iy = r - pt
        base = r * cols
        if iy < 0 or iy >= h:
            for q in range(cols):
                pf[base + q] = padv
            continue
        src, dst = _U(iy * w + lo - pl), _U(base + lo)
        for q in range(run):
            pf[dst + q] = tmp[src + q]
        for q in range(lo):
            pf[base + q] = padv
        for q in range(hi, cols):
            pf[base + q] = padv


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _widen_run(src, s0, dst, n):  # noqa: ANN001
    """dst[:n] = widened src[s0:s0 + n] (unsigned indices: the loop vectorizes)."""
    b = _U(s0)
    for q in range(_U(n)):
        dst[q] = widen(src[b + q])


def gemm_row_chunks(groups: int, og: int, npix: int, threads: int, block: int = NB,
                    min_rows: int = MIN_TASK_ROWS, block_rows: int = MR) -> int:
    """Row blocks (of ``block_rows``) per task: enough tasks to keep ``threads`` busy (about 2
    each), but no fewer than ``min_rows`` rows a task, since each task packs its own input
    panel (of ``block`` pixels). Which task computes an output does not change its sum (bias,
    then k ascending), so this may follow the thread count."""
    nrb = -(-og // block_rows)
    tasks = groups * -(-npix // block)
    chunks = max(1, min(-(-nrb * block_rows // min_rows), -(-2 * threads // tasks)))
    # rounded down (at least chunks tasks), but never below min_rows
    return max(1, min(nrb, -(-min_rows // block_rows)), nrb // chunks)


def gemm_split(groups: int, og: int, npix: int, threads: int) -> tuple[int, int]:
    """(pixels a task, row blocks a task) for ``conv_gemm``: NB pixels a task, halved (down to
    MIN_BLOCK) while the layer would have fewer than about 2 tasks per thread even with its rows
    split as finely as ``gemm_row_chunks`` allows. Measured on a 16-core Xeon: the 1x1
    convolutions at 14x14 and 7x7 (efficientnet_b0, mobilenet_v3), 1-2 tasks a layer with 128
    pixels and 128 rows a task, ran no faster on 16 threads than on 4."""
    rows = -(-og // BR) * BR
    pixels = NB
    while pixels > MIN_BLOCK and groups * -(-npix // pixels) * -(-rows // MIN_TASK_ROWS) < 2 * threads:
        pixels //= 2
    return pixels, gemm_row_chunks(groups, og, npix, threads, pixels, block_rows=BR)


#: shared input panels at most (bytes): beyond, each row chunk packs its own
SHARED_PANELS_MAX = 16 << 20


def shared_panels_shape(groups: int, og: int, npix: int, k_total: int, pixels: int,
                        rb_per_task: int, direct: bool = False) -> tuple[int, int, int, int, int]:
    """The work space ``conv_gemm`` packs every input panel into once, for all the row chunks
    that read it: (groups x pixel blocks, K blocks, NB / NR, PANEL_ROWS, PANEL_COLS) of
    ``PANEL``; all zero (no sharing) where the rows are not split, or where it would exceed
    SHARED_PANELS_MAX.

    Without it each row chunk of a pixel block gathers the same receptive fields again:
    measured on this 2-core box, resnet50's 3x3 layers at 7x7 (K = 4608, 1 pixel block, 4 row
    chunks on 2 threads) ran 1.4x faster on 2 threads than on 1, where 2x was the bound; with
    it, a 3x3 256 -> 256 layer at 14x14 2.51 -> 1.76 ms on 2 threads (512 -> 512 at 7x7: 2.25 ->
    2.12 ms). None where the layer reads its rows ``direct``ly (``reads_rows``)."""
    chunks = -(-(-(-og // BR)) // rb_per_task)  # ceil(row blocks / row blocks a task)
    blocks = groups * -(-npix // pixels)
    kblocks = -(-k_total // KC)
    if direct or chunks < 2 or blocks * kblocks * NB * KC * np.dtype(PANEL).itemsize > SHARED_PANELS_MAX:
        return (0, 0, NB // NR, PANEL_ROWS, PANEL_COLS)
    return (blocks, kblocks, NB // NR, PANEL_ROWS, PANEL_COLS)


def reads_rows(geo: np.ndarray, in_shape: tuple[int, ...], bf16: bool, scaled: bool) -> bool:
    """Does ``conv_gemm`` multiply this layer's input rows directly (``ROWS_DIRECT``)?"""
    return bool(ROWS_DIRECT and bf16 and not scaled and geo[G_OG] <= ROWS_DIRECT_MAX and geo[G_KH] * geo[G_KW] == 1
                and geo[G_SH] == 1 and geo[G_SW] == 1 and geo[G_PT] == 0 and geo[G_PL] == 0
                and (int(geo[G_OH]), int(geo[G_OW])) == tuple(in_shape[1:]))


def _rows_direct(x, scale):  # noqa: ANN001, ANN201  (numba overload below)
    """``reads_rows``'s dtype and scale part inside ``conv_gemm``."""
    raise NotImplementedError


@overload(_rows_direct, inline="always")
def _rows_direct_impl(x, scale):  # noqa: ANN001, ANN202
    if ROWS_DIRECT and x.dtype == types.uint16:
        return lambda x, scale: scale.size == 0
    return lambda x, scale: False


def _rows_product_direct(w, w0, kstride, x, c0, p0, n, tile, kcb, nb):  # noqa: ANN001, ANN201  (numba overload below)
    """``_rows_product`` with the K block's input read from ``x``'s channel rows c0 .. c0 + kcb - 1
    (pixels p0 .. p0 + n - 1) by ``_dot2_rows`` (a bf16 ``x``: ``_rows_direct``)."""
    raise NotImplementedError


@overload(_rows_product_direct, inline="always")
def _rows_product_direct_impl(w, w0, kstride, x, c0, p0, n, tile, kcb, nb):  # noqa: ANN001, ANN202
    if not (ROWS_DIRECT and x.dtype == types.uint16):  # (elsewhere the pair kernel would not compile)
        return lambda w, w0, kstride, x, c0, p0, n, tile, kcb, nb: None

    def rows(w, w0, kstride, x, c0, p0, n, tile, kcb, nb):  # noqa: ANN001, ANN202
        npix = x.shape[1] * x.shape[2]
        xf = x.reshape(x.size)
        tf = tile.reshape(tile.size)
        ldc = tile.shape[1]
        for i in range(nb):
            for q in range(0, n, 2 * NR):
                _dot2_rows(w, w0 + i * kstride, xf, c0 * npix + p0 + q, npix, kcb % 2, n - q, tf, i * MR * ldc + q, ldc,
                           kcb // 2)
    return rows


def _stores(out, ops):  # noqa: ANN001, ANN201  (numba overload below)
    """Can ``conv_gemm`` store a one-K-block layer's sums from the registers (``Finish.STORE``):
    pair products (``DOT``), a bf16 ``out``, and an epilogue of none or a lone ReLU or Clip."""
    raise NotImplementedError


@overload(_stores, inline="always")
def _stores_impl(out, ops):  # noqa: ANN001, ANN202
    if DOT and out.dtype == types.uint16:
        return lambda out, ops: stored_op(ops)[0]
    return lambda out, ops: False


def _stored_product(  # noqa: ANN201  (numba overload below)
    w, w0, kstride, x, direct, c0, panel, p0, n, bias, row0, rows, out, ops, kcb, nb,  # noqa: ANN001
):
    """The nb row blocks of packed weights from w[w0:] (one every ``kstride`` values) times a
    one-K-block layer's input, pixels p0 .. p0 + n - 1: ``x``'s channel rows c0 .. (``direct``) or
    the packed ``panel``; each output channel's sums start from its bias and are stored through
    ``ops`` (``_stores``) into out[row0 + r, p0 + q] for r < ``rows``."""
    raise NotImplementedError


@overload(_stored_product, inline="always")
def _stored_product_impl(  # noqa: ANN202
    w, w0, kstride, x, direct, c0, panel, p0, n, bias, row0, rows, out, ops, kcb, nb,  # noqa: ANN001
):
    if not (DOT and out.dtype == types.uint16):
        return lambda w, w0, kstride, x, direct, c0, panel, p0, n, bias, row0, rows, out, ops, kcb, nb: None

    def stored(  # noqa: ANN202
        w, w0, kstride, x, direct, c0, panel, p0, n, bias, row0, rows, out, ops, kcb, nb,  # noqa: ANN001
    ):
        _, code, lo, hi = stored_op(ops)
        npix = x.shape[1] * x.shape[2]
        xf = x.reshape(x.size)
        pf = panel.reshape(panel.size)
        sb = panel.shape[1] * panel.shape[2]  # a strip
        ns = (n + NR - 1) // NR
        strips = ns if direct else strips_before_tail(n)
        kc2 = (kcb + 1) // 2
        for i in range(nb):
            a0 = w0 + i * kstride
            r = row0 + i * MR
            nv = min(MR, rows - i * MR)
            for t in range(0, strips, 2):
                q = t * NR
                if direct:
                    _dot2_rows_store(w, a0, xf, c0 * npix + p0 + q, npix, kcb % 2, n - q, bias, r, nv, out, r, p0 + q,
                                     code, lo, hi, kcb // 2)
                elif t + 1 < strips:
                    _dot2_store(w, a0, pf, t * sb, sb, n - q, bias, r, nv, out, r, p0 + q, code, lo, hi, kc2)
                else:
                    _dot1_store(w, a0, pf, t * sb, sb, n - q, bias, r, nv, out, r, p0 + q, code, lo, hi, kc2)
        if strips < ns:  # the last pixels, rows as the lanes (``tail_pixels``), stored from their sums
            m = n - strips * NR
            ldcol = tail_width(nb)
            col = np.empty(m * ldcol, dtype=np.float32)
            valid = min(rows, nb * MR)
            for j in range(m):
                for k in range(ldcol):
                    col[j * ldcol + k] = bias[row0 + k] if k < valid else np.float32(0.0)
            tail_pixels(w, w0, kstride, nb, pf, strips * sb, 2 * NR, kc2, m, col, ldcol)
            finish_tile(col.reshape((m, ldcol)).T, 0, valid, m, out, row0, p0 + strips * NR, ops)
    return stored


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def tail_start(tile, c0, m, nb):  # noqa: ANN001, ANN202
    """What ``tail_pixels`` adds the products of pixels c0 .. c0 + m - 1 of an fp32 ``tile``'s
    first nb row blocks to: their sums so far, a pixel's rows in a run (its ``col``), zeros
    past the blocks."""
    ldcol = tail_width(nb)
    col = np.zeros(m * ldcol, dtype=np.float32)
    for j in range(m):
        for k in range(nb * MR):
            col[j * ldcol + k] = tile[k, c0 + j]
    return col


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def tail_end(col, tile, c0, m, nb):  # noqa: ANN001
    """The sums of ``tail_start``'s pixels back into their tile columns."""
    ldcol = tail_width(nb)
    for j in range(m):
        for k in range(nb * MR):
            tile[k, c0 + j] = col[j * ldcol + k]


#: pixels of a block's last strip up to which ``tail_pixels`` computes them (rows as the lanes)
#: instead of a strip kernel computing NR: a 7 x 7 map's 49th pixel, a 14 x 14 map's last 4
TAIL_MAX = TAIL_PIXELS


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def strips_before_tail(n):  # noqa: ANN001, ANN202
    """Strips of NR pixels a strip kernel computes of a block of ``n`` pixels on ``DOT`` hosts:
    all, or all but a last one of at most TAIL_MAX pixels (``tail_pixels`` computes those)."""
    ns = (n + NR - 1) // NR
    return ns - 1 if n - (ns - 1) * NR <= TAIL_MAX else ns


def _pack_flat(xf, scale, act, c0, kcb, p0, n, panel):  # noqa: ANN001, ANN201  (numba overload below)
    """``_pack_panel`` of a 1x1 stride-1 unpadded layer: depth kk is channel c0 + kk of ``xf``
    (channels, pixels), pixels p0 .. p0 + n - 1 (direct unsigned indexing, no views: an atomic
    reference count update each); with a ``scale`` (one value a channel; none: empty) each
    value times its channel's (then the activation ``act``), rounded to bf16 (``_scaled``). A bf16
    panel is filled a k pair at a time, each pixel's pair as one 32-bit store (the loop
    vectorizes; an element at a time it would not)."""
    raise NotImplementedError


@overload(_pack_flat)
def _pack_flat_impl(xf, scale, act, c0, kcb, p0, n, panel):  # noqa: ANN001, ANN202
    if panel.dtype == types.uint16:
        def pairs(xf, scale, act, c0, kcb, p0, n, panel):  # noqa: ANN001, ANN202
            pv = panel.view(np.uint32)  # element (s, k pair, j): even k in the low half
            half = np.uint32(16)
            scaled = scale.size > 0
            for kp in range((kcb + 1) // 2):
                cu, ku = _U(c0 + 2 * kp), _U(kp)
                odd = 2 * kp + 1 < kcb
                s0 = widen(scale[cu]) if scaled else np.float32(1.0)
                s1 = widen(scale[cu + _U(1)]) if scaled and odd else np.float32(1.0)
                for si in range((n + NR - 1) // NR):
                    su, b = _U(si), _U(p0 + si * NR)
                    if odd:
                        for j in range(_U(min(NR, n - si * NR))):
                            lo = np.uint32(_scaled(xf[cu, b + j], scaled, s0, act, panel))
                            hi = np.uint32(_scaled(xf[cu + _U(1), b + j], scaled, s1, act, panel))
                            pv[su, ku, j] = lo | (hi << half)
                    else:  # an odd depth's last channel: zero beside it
                        for j in range(_U(min(NR, n - si * NR))):
                            pv[su, ku, j] = np.uint32(_scaled(xf[cu, b + j], scaled, s0, act, panel))
        return pairs

    def fp32(xf, scale, act, c0, kcb, p0, n, panel):  # noqa: ANN001, ANN202
        scaled = scale.size > 0
        for kk in range(kcb):
            cu, ku = _U(c0 + kk), _U(kk)
            sk = widen(scale[cu]) if scaled else np.float32(1.0)
            for si in range((n + NR - 1) // NR):
                su, b = _U(si), _U(p0 + si * NR)
                for j in range(_U(min(NR, n - si * NR))):
                    panel[su, ku, j] = _scaled(xf[cu, b + j], scaled, sk, act, panel)
    return fp32


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _scaled(v, scaled, s, act, panel):  # noqa: ANN001, ANN202
    """``v`` as ``panel`` stores it; with ``scaled``, v times ``s`` (then the activation ``act``)
    rounded to bf16 first, as a per-channel BinaryOp Mul would have stored its product
    (``Kernel.channel_scale``)."""
    if scaled:
        return as_stored(scaled_bits(v, s, act), panel)
    return as_stored(v, panel)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True)
def _pack_panel(x, scale, act, geo, flat, g, p0, n, k0, kcb, padv, planes, offs, runs, panel):  # noqa: ANN001
    """Panel element (s, kk, j) (``_put``) = input of receptive-field element k0 + kk for pixel
    p0 + s NR + j (j < n - s NR), zeros in a partial last strip's unused lanes (garbage there
    could be denormal, and slow) and at the depths rounding kcb up to KALIGN; a ``scale``
    (flat layers only: ``_pack_flat``) multiplied in; ``planes`` and
    ``offs``, ``runs`` as ``_block_geometry`` sets them up for the block (channel c's rows in
    planes[c % PAIR]: a k pair may span two channels)."""
    sh = geo[G_SH]
    cg = geo[G_CG]
    ow = geo[G_OW]
    pflat = planes.reshape(planes.size)
    xf = x.reshape((x.shape[0], x.shape[1] * x.shape[2]))
    ns = (n + NR - 1) // NR
    oy0 = p0 // ow
    zero = np.float32(0.0)
    for kk in range(kcb):
        for j in range(n - (ns - 1) * NR, NR):
            _put(panel, ns - 1, kk, j, zero)
    for kk in range(kcb, -(-kcb // KALIGN) * KALIGN):
        for si in range(ns):
            for j in range(NR):
                _put(panel, si, kk, j, zero)
    if flat:
        _pack_flat(xf, scale, act, g * cg + k0, kcb, p0, n, panel)
        return
    iy0, ix0 = oy0 * sh - geo[G_PT], -geo[G_PL]
    for kk in range(0, kcb, PAIR):
        # the depth's (and with pairs, the next one's) first value in the planes
        a = _tap_offset(x, geo, g * cg, k0 + kk, kk == 0, iy0, ix0, padv, planes)
        b = -1
        if PAIR == 2 and kk + 1 < kcb:
            b = _tap_offset(x, geo, g * cg, k0 + kk + 1, False, iy0, ix0, padv, planes)
        _put_depth(panel, kk, pflat, a, b, offs, n, runs)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _tap_offset(x, geo, c0, k, first, iy0, ix0, padv, planes):  # noqa: ANN001, ANN202
    """Where receptive-field element k (channel c0 + k // taps, tap k % taps) of a block's
    first pixel lies in ``planes`` (flattened), its channel's plane filled first where k starts
    the channel or the panel (``first``)."""
    kh, kw, dh, dw = geo[G_KH], geo[G_KW], geo[G_DH], geo[G_DW]
    taps = kh * kw
    c = c0 + k // taps
    t = k % taps
    if t == 0 or first:
        _fill_plane(x, c, iy0, ix0, 1, 1, padv, planes[c % PAIR])
    ky = t // kw
    return c % PAIR * planes.shape[1] * planes.shape[2] + ky * dh * planes.shape[2] + (t - ky * kw) * dw


def _put_depth(panel, k, pf, a, b, offs, n, runs):  # noqa: ANN001, ANN201  (numba overload below)
    """The panel at depth k (with pairs, k and k + 1): pixel j < n takes pf[a + offs[j]] (and
    pf[b + offs[j]] beside it; b < 0: zero). A strip with runs[s] > 0 lies in one output row,
    offs[j] = offs[s NR] + (j - s NR) runs[s], so its loads are a strided run that vectorizes
    (a gather otherwise)."""
    raise NotImplementedError


@overload(_put_depth, inline="always")
def _put_depth_impl(panel, k, pf, a, b, offs, n, runs):  # noqa: ANN001, ANN202
    if panel.dtype == types.uint16:
        def pairs(panel, k, pf, a, b, offs, n, runs):  # noqa: ANN001, ANN202
            pv = panel.view(np.uint32)  # element (s, k pair, j): even k in the low half
            ku, half = _U(k // 2), np.uint32(16)
            for s in range((n + NR - 1) // NR):
                su, o0, cnt = _U(s), s * NR, min(NR, n - s * NR)
                if runs[s] > 0 and b >= 0:
                    ia, ib, st = _U(a + offs[o0]), _U(b + offs[o0]), _U(runs[s])
                    for j in range(_U(cnt)):
                        pv[su, ku, j] = np.uint32(pf[ia + st * j]) | (np.uint32(pf[ib + st * j]) << half)
                else:
                    for j in range(cnt):
                        o = offs[o0 + j]
                        hi = np.uint32(pf[b + o]) << half if b >= 0 else np.uint32(0)
                        pv[su, ku, j] = np.uint32(pf[a + o]) | hi
        return pairs

    def fp32(panel, k, pf, a, b, offs, n, runs):  # noqa: ANN001, ANN202
        ku = _U(k)
        for s in range((n + NR - 1) // NR):
            su, o0, cnt = _U(s), s * NR, min(NR, n - s * NR)
            if runs[s] > 0:
                ia, st = _U(a + offs[o0]), _U(runs[s])
                for j in range(_U(cnt)):
                    panel[su, ku, j] = pf[ia + st * j]
            else:
                for j in range(cnt):
                    panel[s, k, j] = pf[a + offs[o0 + j]]
    return fp32


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _block_space(geo, flat, pixels):  # noqa: ANN001, ANN202
    """``_block_geometry``'s buffers for blocks of up to ``pixels`` pixels: room for the planes
    (of ``PANEL``), the pixels' offsets, the strips' runs."""
    sh = geo[G_SH]
    ow = geo[G_OW]
    wpad = (ow - 1) * geo[G_SW] + (geo[G_KW] - 1) * geo[G_DW] + 1
    prow = ((pixels - 1) // ow + 1) * sh + (geo[G_KH] - 1) * geo[G_DH] + 1 if not flat else 1
    return (np.empty(PAIR * prow * wpad, dtype=PANEL), np.empty(NB, dtype=np.int64),
            np.empty(NB // NR, dtype=np.int64))


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _block_geometry(geo, flat, p0, n, space, offs, runs):  # noqa: ANN001, ANN202
    """The padded-row planes (PAIR of them, in ``space``) a pixel block's receptive fields lie
    in, each pixel's offset in one (``offs``), and per strip of NR pixels its column stride
    where they lie in one output row, else 0 (``runs``); computed once per block, in buffers
    from ``_block_space`` (allocating them per block cost 1x1 layers of few input channels up
    to a sixth of their time)."""
    kh, sh, sw, dh = geo[G_KH], geo[G_SH], geo[G_SW], geo[G_DH]
    ow = geo[G_OW]
    wpad = (ow - 1) * sw + (geo[G_KW] - 1) * geo[G_DW] + 1
    oy0 = p0 // ow
    prow = (((p0 + n - 1) // ow - oy0) * sh + (kh - 1) * dh + 1) if not flat else 1
    planes = space[:PAIR * prow * wpad].reshape((PAIR, prow, wpad))
    for j in range(n):
        oy = (p0 + j) // ow
        offs[j] = (oy - oy0) * sh * wpad + (p0 + j - oy * ow) * sw
    for si in range(NB // NR):
        runs[si] = 0
    for si in range((n + NR - 1) // NR):
        last = min(n, (si + 1) * NR) - 1
        if (p0 + si * NR) // ow == (p0 + last) // ow:
            runs[si] = sw
    return planes


def _rows_product(w, w0, kstride, wide, panel, tile, kcb, nb, n):  # noqa: ANN001, ANN201  (numba overload below)
    """tile[:nb BR, :n] += the nb row blocks of packed weights from w[w0:] (one every
    ``kstride`` values; K block of depth kcb) times the K block's input panel: per row block
    widened into ``wide`` and run by the fp32 micro kernel, with a bf16 panel (``DOT``) by the
    pair-product kernel straight from the packed weights, with ``AMX`` by ``jit.amx`` two row
    blocks by two strips at a time (the tile configuration loaded: ``_tiles_begin``)."""
    raise NotImplementedError


@overload(_rows_product, inline="always")
def _rows_product_impl(w, w0, kstride, wide, panel, tile, kcb, nb, n):  # noqa: ANN001, ANN202
    if AMX:
        def tiles(w, w0, kstride, wide, panel, tile, kcb, nb, n):  # noqa: ANN001, ANN202
            pf = panel.reshape(panel.size)
            tf = tile.reshape(tile.size)
            sb = panel.shape[1] * panel.shape[2]  # a strip
            ldc = tile.shape[1]
            ns = (n + NR - 1) // NR
            steps = (kcb + amx.DEPTH - 1) // amx.DEPTH
            for i in range(0, nb, 2):
                a0 = w0 + i * kstride
                for s in range(0, ns, 2):
                    c0 = i * BR * ldc + s * NR
                    amx.block(w, a0, a0 + kstride, pf, s * sb, (s + 1) * sb, _PANEL_STEPS, 64, tf, c0, ldc, NR,
                              tf, c0, ldc, steps, i + 1 < nb, s + 1 < ns)
        return tiles
    if panel.dtype == types.uint16:
        def pairs(w, w0, kstride, wide, panel, tile, kcb, nb, n):  # noqa: ANN001, ANN202
            sb = panel.shape[1] * panel.shape[2]  # a strip
            pf = panel.reshape(panel.size)
            strips = strips_before_tail(n)
            kc2 = (kcb + 1) // 2
            for i in range(nb):
                strips_dot(w, w0 + i * kstride, pf, 0, sb, tile, i * MR, strips, kc2)
            if strips * NR < n:  # the last pixels, rows as the lanes (``tail_pixels``)
                m = n - strips * NR
                col = tail_start(tile, strips * NR, m, nb)
                tail_pixels(w, w0, kstride, nb, pf, strips * sb, 2 * NR, kc2, m, col, tail_width(nb))
                tail_end(col, tile, strips * NR, m, nb)
        return pairs

    def fp32(w, w0, kstride, wide, panel, tile, kcb, nb, n):  # noqa: ANN001, ANN202
        for i in range(nb):
            _widen_run(w, w0 + i * kstride, wide.reshape(wide.size), kcb * MR)
            strips_fp32(wide, panel, tile, kcb, i * MR, n)
    return fp32


#: where a strip's 32-deep steps lie in it (``amx.block``'s B offsets: each a 16 x 32 run)
_PANEL_STEPS = np.arange(KC // amx.DEPTH, dtype=np.int64) * amx.STEP


def _tiles_begin():  # noqa: ANN201  (numba overload below)
    """Before a thread's first ``_rows_product``: with ``AMX``, load the tile configuration."""
    raise NotImplementedError


@overload(_tiles_begin, inline="always")
def _tiles_begin_impl():  # noqa: ANN202
    if AMX:
        cfg = amx.CONFIG

        def begin():  # noqa: ANN202
            amx.configure(cfg)
        return begin
    return lambda: None


def _tiles_end():  # noqa: ANN201  (numba overload below)
    """After a thread's last ``_rows_product``: with ``AMX``, release the tiles."""
    raise NotImplementedError


@overload(_tiles_end, inline="always")
def _tiles_end_impl():  # noqa: ANN202
    if AMX:
        def end():  # noqa: ANN202
            amx.release()
        return end
    return lambda: None


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def strips_dot(a, a0, b, b0, sb, tile, r0, ns, kc2):  # noqa: ANN001, ANN202
    """tile[r0:r0 + MR, :ns NR] += the packed bf16 pairs of a row block (from a0 in ``a``) times
    ``ns`` strips of bf16 pairs (the first from b0 in ``b``, one every ``sb`` values), kc2 pairs
    deep: two strips at a time (16 accumulators), an odd last one alone."""
    tf = tile.reshape(tile.size)
    ldc = tile.shape[1]
    c0 = r0 * ldc
    for q in range(ns // 2):
        _dot2(a, a0, b, b0 + 2 * q * sb, sb, tf, c0 + 2 * q * NR, ldc, kc2)
    if ns % 2:
        _dot1(a, a0, b, b0 + (ns - 1) * sb, sb, tf, c0 + (ns - 1) * NR, ldc, kc2)


def strips_fp32(a, b, tile, kc, r0, n):  # noqa: ANN001, ANN201  (numba overload below)
    """tile[r0:r0 + MR, :n] += a (kc, MR) times ``b``'s first n pixels: NR-pixel strips
    (``BRead.STRIPS``, b 3-D) or one (k, pixels) matrix (``BRead.ROWS``, b 2-D); with
    ``TWO_STRIPS`` two strips at a time while the second holds more than NR / 2 pixels, then
    one (a last strip of at most NR / 2 by the half-width kernel). Measured on the GPU
    machine's Xeon (one core, 256-deep sums): one strip at a time 97-99 GFLOP/s, two 130-142;
    on the Zen 4 VM both ~115."""
    raise NotImplementedError


@overload(strips_fp32, inline="always")
def _strips_fp32(a, b, tile, kc, r0, n):  # noqa: ANN001, ANN202
    one, half = (_micro, _micro_half) if b.ndim == 3 else (_micro_rows, _micro_half_rows)
    # (without TWO_STRIPS no pair of strips runs, and the two-strip kernel is not compiled)
    two = (_micro2 if b.ndim == 3 else _micro2_rows) if TWO_STRIPS else one

    def impl(a, b, tile, kc, r0, n):  # noqa: ANN001, ANN202
        ns = (n + NR - 1) // NR
        full = ns if n - (ns - 1) * NR > NR // 2 else ns - 1  # strips of more than NR / 2 pixels
        pairs = full // 2 if TWO_STRIPS else 0
        for q in range(pairs):
            two(a, b, tile, kc, r0, 2 * q)
        for s in range(pairs * 2, ns):
            if n - s * NR <= NR // 2:
                half(a, b, tile, kc, r0, s)
            else:
                one(a, b, tile, kc, r0, s)
    return impl


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def task_of(task, blocks, n_blocks, pixels, npix, rb_per_task, nrb):  # noqa: ANN001, ANN201
    """A GEMM task's share: (pixel block over all groups, its group, first pixel, pixels, first
    row block, row blocks) of ``blocks`` = groups x ``n_blocks`` blocks of ``pixels`` (of
    ``npix``) and row chunks of ``rb_per_task`` (of ``nrb``) row blocks. The row chunk is
    outermost: consecutive tasks cover different pixel blocks (even loads)."""
    rc = task // blocks
    blk = task - rc * blocks
    g = blk // n_blocks
    p0 = (blk - g * n_blocks) * pixels
    rb0 = rc * rb_per_task
    return blk, g, p0, min(pixels, npix - p0), rb0, min(nrb, rb0 + rb_per_task) - rb0


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def fill_bias_tile(bias, base, first, rows, tile):  # noqa: ANN001, ANN201
    """Row r of the fp32 (nrows, NB) ``tile`` <- bias[base + first + r] (0 past ``rows``, the
    group's output channels): the sums' start."""
    for r in range(tile.shape[0]):
        o = first + r
        bv = bias[base + o] if o < rows else np.float32(0.0)
        for j in range(NB):
            tile[r, j] = bv
    return tile


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def conv_gemm(x, scale, act, wp, bias, ops, padv, geo, pixels, rb_per_task, shared, max_parts, out):  # noqa: ANN001
    """Grouped convolution, ``x`` (C, H, W; each channel times its ``scale`` value first where
    ``scale`` is not empty, then the activation ``act``, ``epilogue.scale_act``: 1x1 stride-1 unpadded layers only,
    ``_pack_flat``) -> ``out`` (groups * og, OH * OW); ``wp`` from
    ``pack_gemm_weights``; ``bias`` fp32 per output channel; ``ops`` the epilogue;
    ``pixels`` (a multiple of NR, at most NB) and ``rb_per_task`` from ``gemm_split``;
    ``shared`` of ``shared_panels_shape``: when not empty, every input panel is packed into it
    once (a first parallel pass), and the row chunks read it there. The (block, row chunk)
    tasks run in at most ``max_parts`` contiguous runs, each allocating its buffers once.

    The input panel of a pixel block is gathered from a padded fp32 copy of the input rows the
    block reads (one channel at a time), at per-pixel offsets computed once per block."""
    groups, og, kh, kw = geo[G_GROUPS], geo[G_OG], geo[G_KH], geo[G_KW]
    taps = kh * kw
    k_total = geo[G_CG] * taps
    oh, ow = geo[G_OH], geo[G_OW]
    npix = oh * ow
    nrb = wp.shape[1]
    n_chunks = (nrb + rb_per_task - 1) // rb_per_task
    n_blocks = (npix + pixels - 1) // pixels
    # 1x1, stride 1, no padding: a pixel block is one run of each input channel
    flat = (taps == 1 and geo[G_SH] == 1 and geo[G_SW] == 1 and geo[G_PT] == 0 and geo[G_PL] == 0
            and oh == x.shape[1] and ow == x.shape[2])
    wflat = wp.reshape(wp.size)
    kstride = wp.shape[2] * wp.shape[3]  # a row block's packed weights
    direct = flat and og <= ROWS_DIRECT_MAX and _rows_direct(x, scale)
    is_shared = shared.shape[0] > 0 and not direct
    # one K block: the sums go from the registers to ``out`` (no fp32 tile between)
    stores = k_total <= KC and _stores(out, ops)
    if is_shared:
        nkb = shared.shape[1]
        for item in prange(groups * n_blocks * nkb):
            blk = item // nkb
            kb = item - blk * nkb
            g = blk // n_blocks
            p0 = (blk - g * n_blocks) * pixels
            n = min(pixels, npix - p0)
            space, offs, runs = _block_space(geo, flat, n)
            planes = _block_geometry(geo, flat, p0, n, space, offs, runs)
            _pack_panel(x, scale, act, geo, flat, g, p0, n, kb * KC, min(KC, k_total - kb * KC), padv, planes, offs,
                        runs, shared[blk, kb])
    n_tasks = groups * n_blocks * n_chunks
    parts = min(n_tasks, max_parts)
    for part in prange(parts):
        own = np.empty((0 if is_shared else NB // NR, PANEL_ROWS, PANEL_COLS), dtype=PANEL)
        space, offs, runs = _block_space(geo, flat, pixels)
        wide = np.empty((0 if DOT or AMX else KC, MR), dtype=np.float32)  # the fp32 kernel's weights
        tiles = np.empty((rb_per_task * BR, NB), dtype=np.float32)
        _tiles_begin()
        for task in range(part * n_tasks // parts, (part + 1) * n_tasks // parts):
            blk, g, p0, n, rb0, nb = task_of(task, groups * n_blocks, n_blocks, pixels, npix, rb_per_task, nrb)
            nrows = nb * BR
            planes = _block_geometry(geo, flat, p0, n, space, offs, runs)
            if stores:
                panel = shared[blk, 0] if is_shared else own
                if not (direct or is_shared):
                    _pack_panel(x, scale, act, geo, flat, g, p0, n, 0, k_total, padv, planes, offs, runs, panel)
                _stored_product(wflat, (g * nrb + rb0) * kstride, kstride, x, direct, g * geo[G_CG], panel, p0, n, bias,
                                g * og + rb0 * BR, og - rb0 * BR, out, ops, k_total, nb)
                continue
            tile = fill_bias_tile(bias, g * og, rb0 * BR, og, tiles[:nrows])
            for k0 in range(0, k_total, KC):
                kcb = min(KC, k_total - k0)
                if direct:
                    _rows_product_direct(wflat, (g * nrb + rb0) * kstride + k0 * BR, kstride, x, g * geo[G_CG] + k0,
                                         p0, n, tile, kcb, nb)
                    continue
                if is_shared:
                    panel = shared[blk, k0 // KC]
                else:
                    panel = own
                    _pack_panel(x, scale, act, geo, flat, g, p0, n, k0, kcb, padv, planes, offs, runs, panel)
                _rows_product(wflat, (g * nrb + rb0) * kstride + k0 * BR, kstride, wide, panel, tile, kcb, nb, n)
            rows = min(nrows, og - rb0 * BR)
            finish_tile(tile, 0, rows, n, out, g * og + rb0 * BR, p0, tile_pass(tile, rows, ops))
        _tiles_end()


# The depthwise helpers index with unsigned integers (``_U``, see there); views are made outside
# the hot loops: each one costs an atomic reference count update.


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _axpy3(acc, p, b0, b1, b2, cnt, w0, w1, w2):  # noqa: ANN001
    """acc[q] += w0 p[b0 + q], then w1 p[b1 + q], then w2 p[b2 + q], for q < cnt."""
    i0, i1, i2 = _U(b0), _U(b1), _U(b2)
    for q in range(_U(cnt)):
        v = acc[q]
        v += w0 * p[i0 + q]
        v += w1 * p[i1 + q]
        v += w2 * p[i2 + q]
        acc[q] = v


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _axpy5(acc, p, b0, b1, b2, b3, b4, cnt, w0, w1, w2, w3, w4):  # noqa: ANN001
    """acc[q] += w0 p[b0 + q], then w1 p[b1 + q], ... w4 p[b4 + q], for q < cnt (a 5-wide
    kernel row in one pass over the outputs)."""
    i0, i1, i2, i3, i4 = _U(b0), _U(b1), _U(b2), _U(b3), _U(b4)
    for q in range(_U(cnt)):
        v = acc[q]
        v += w0 * p[i0 + q]
        v += w1 * p[i1 + q]
        v += w2 * p[i2 + q]
        v += w3 * p[i3 + q]
        v += w4 * p[i4 + q]
        acc[q] = v


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _sum9(bv, w, x0, x1, x2, y0, y1, y2, z0, z1, z2):  # noqa: ANN001, ANN202
    """bv + w[0] x0 + w[1] x1 + ... + w[8] z2, added in that order: one output of a 3x3 kernel
    from its three rows of inputs (``w``: the nine weights, a tuple hoisted out of the loop)."""
    v = bv + w[0] * x0
    v += w[1] * x1
    v += w[2] * x2
    v += w[3] * y0
    v += w[4] * y1
    v += w[5] * y2
    v += w[6] * z0
    v += w[7] * z1
    v += w[8] * z2
    return v


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _taps9(acc, p, offs, cnt, bv, w):  # noqa: ANN001
    """acc[q] = bv + w[0] p[offs[0] + q] + ... + w[8] p[offs[8] + q], for q < cnt, added in that
    order (``_sum9``): a 3x3 kernel in one pass over the outputs (each output written once,
    where a pass per kernel row reads and writes them three times)."""
    i0, i1, i2, i3, i4 = _U(offs[0]), _U(offs[1]), _U(offs[2]), _U(offs[3]), _U(offs[4])
    i5, i6, i7, i8 = _U(offs[5]), _U(offs[6]), _U(offs[7]), _U(offs[8])
    ws = (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8])
    for q in range(_U(cnt)):
        acc[q] = _sum9(bv, ws, p[i0 + q], p[i1 + q], p[i2 + q], p[i3 + q], p[i4 + q], p[i5 + q],
                       p[i6 + q], p[i7 + q], p[i8 + q])


#: output width from which a stride-1 3x3 depthwise layer runs two rows at a time: on narrower
#: maps a row is too short a loop (whole layers, the kernel before and after alternating in one
#: process, one core: 112 wide 1.16-1.20x and 56 wide 1.09-1.11x faster, 28 wide even, 14 and 7
#: wide 1.15x and 1.39x slower)
PAIR_ROWS_MIN_COLS = 48


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _taps9_rows2(acc, p, b, wq, cnt, bv, w):  # noqa: ANN001
    """``_taps9`` for two output rows of a stride-1, undilated 3x3 kernel: acc[b + q] from plane
    rows b / wq .. + 2 and acc[b + wq + q] from the rows one below, q < cnt, each sum in
    ``_taps9``'s order. The two share two input rows: 12 loads for 18 products instead of 18
    (measured on one core, 112 x 112: 0.205 ns an output against 0.267 over the span)."""
    i0, i1, i2, i3 = _U(b), _U(b + wq), _U(b + 2 * wq), _U(b + 3 * wq)
    ws = (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8])
    one, two = _U(1), _U(2)
    for q in range(_U(cnt)):
        a0, a1, a2 = p[i0 + q], p[i0 + q + one], p[i0 + q + two]
        b0, b1, b2 = p[i1 + q], p[i1 + q + one], p[i1 + q + two]
        c0, c1, c2 = p[i2 + q], p[i2 + q + one], p[i2 + q + two]
        d0, d1, d2 = p[i3 + q], p[i3 + q + one], p[i3 + q + two]
        acc[i0 + q] = _sum9(bv, ws, a0, a1, a2, b0, b1, b2, c0, c1, c2)
        acc[i1 + q] = _sum9(bv, ws, b0, b1, b2, c0, c1, c2, d0, d1, d2)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, inline="always")
def _axpy1(acc, p, b, cnt, w0):  # noqa: ANN001
    """acc[q] += w0 p[b + q] for q < cnt."""
    i0 = _U(b)
    for q in range(_U(cnt)):
        acc[q] += w0 * p[i0 + q]


#: output pixels a strided 1x1 layer needs for ``conv_gemm_decimated``: inside resnet50 on the
#: Zen 4 VM (``Plan.profile``, median of 10, ms, decimated / strided, one thread then two) its
#: 28x28 outputs gain (256 -> 512 1.12-1.14 / 1.22-1.23, 0.73-0.74 / 0.82-0.83; 256 -> 128 0.38 /
#: 0.50, 0.26 / 0.34), 14x14 gain or tie (512 -> 1024 1.26 / 1.31-1.34, 0.67-0.68 / 0.67-0.68;
#: 512 -> 256 0.41 / 0.45, 0.25-0.26 / 0.26), 7x7 lose (1024 -> 2048 1.76-1.78 / 1.70-1.72,
#: 0.96-0.97 / 0.85-0.87; 1024 -> 512 0.57 / 0.52, 0.33 / 0.27: the decimation's pass over
#: 1024 small planes costs more than the panels' gather saves)
DECIMATE_MIN_PIXELS = 14 * 14


def decimates(geo: np.ndarray, groups: int) -> bool:
    """Does a dense layer of this geometry run as ``conv_gemm_decimated``? 1x1, strided,
    unpadded, one group, at least DECIMATE_MIN_PIXELS outputs, on ``DOT`` hosts (where it was
    measured)."""
    return bool(DOT and groups == 1 and geo[G_KH] * geo[G_KW] == 1 and (geo[G_SH], geo[G_SW]) != (1, 1)
                and geo[G_DH] == 1 and geo[G_DW] == 1 and geo[G_PT] == 0 and geo[G_PL] == 0
                and geo[G_OH] * geo[G_OW] >= DECIMATE_MIN_PIXELS)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def conv_gemm_decimated(x, sy, sx, dec, scale, act, wp, bias, ops, padv, geo, pixels, rb_per_task, shared,
                        max_parts, out):  # noqa: ANN001
    """A 1x1 unpadded convolution of strides (``sy``, ``sx``) as ``conv_gemm``'s stride-1 one
    (``geo``) on ``dec`` (C, OH, OW): every ``sy``-th row's every ``sx``-th value of ``x``,
    copied in a first parallel pass over the channels. The GEMM then packs its panels from
    whole rows (its flat path) instead of gathering each pixel of a strided panel: the same
    bits (``DECIMATE_MIN_PIXELS`` says where it is faster)."""
    for c in prange(dec.shape[0]):
        _fill_plane(x, c, 0, 0, sy, sx, padv, dec[c])
    conv_gemm(dec, scale, act, wp, bias, ops, padv, geo, pixels, rb_per_task, shared, max_parts, out)


@njit(fastmath=FASTMATH, error_model="numpy", cache=True, parallel=True)
def depthwise(x, xrows, w16, bias, ops, padv, geo, parts, out):  # noqa: ANN001
    """Depthwise convolution (one input channel per group, ``og`` outputs each): ``x`` (C, H, W)
    -> ``out`` (C * og, OH * OW); ``xrows``: x as (C, H W) (stride 1's fill reads a channel as
    one run, ``_fill_unit_stride``); ``w16`` bf16 (C * og, kh * kw); the output channels are
    split into ``parts`` contiguous tasks (each allocates its buffers once).

    Per output channel the input channel is widened once into padded fp32 planes (border =
    ``pad_value``), one per stride phase (row r, column q of phase (ry, rx) is padded input
    (r sh + ry, q sw + rx)), so every tap reads a plane at unit stride without bounds checks.
    At column stride 2 both column phases of a row are filled in one pass (``fill_phases``); on
    inputs up to ``SMALL_PHASE_MAX_COLS`` wide every phase is copied out of one padded image of
    the channel (``fill_phases_small``).
    The planes' rows run on into each other, so a 3x3 kernel is one pass over all outputs at
    once, in plane coordinates (the extra columns between rows are computed and dropped); other
    kernels make a pass per 5-wide row, else per three taps of a row (each from its phase's
    plane); a stride-1 3x3 kernel on wide maps two output rows at a time, which share two input rows. Per
    output: bias, then taps ky-major, kx ascending."""
    kh, kw, sh, sw = geo[G_KH], geo[G_KW], geo[G_SH], geo[G_SW]
    dh, dw, pt, pl = geo[G_DH], geo[G_DW], geo[G_PT], geo[G_PL]
    og, oh, ow = geo[G_OG], geo[G_OH], geo[G_OW]
    taps = kh * kw
    prow = oh + (kh - 1) * dh // sh
    wq = ow + (kw - 1) * dw // sw
    span = (oh - 1) * wq + ow
    # on maps narrower than a vector a row is stored with the columns after it in the planes
    # (``run`` values: a loop of 7-14 runs as scalars, one as long as the plane's row partly
    # vectorizes), the next row's store then rewrites what spilled into its start; not where
    # that would reach past the channel's outputs (kernels wider than the map); the last row
    # exactly. 14 x 14 maps, one core: the stores 1.8x faster (0.056 -> 0.031 ms for 672
    # channels), 7 x 7 1.5-1.9x; on 28 x 28 and wider it cost 2-3 %.
    run = wq if ow < RUN_SLACK and wq <= 2 * ow else ow
    n_out = out.shape[0]
    h, w = x.shape[1], x.shape[2]
    unit = sh == 1 and sw == 1 and w <= UNIT_FILL_MAX_COLS
    small = (sh > 1 or sw > 1) and w <= SMALL_PHASE_MAX_COLS
    for part in prange(parts):
        wf = np.empty(taps, dtype=np.float32)
        plen = prow * wq
        planes = np.empty((0 if unit else sh * sw, prow, wq), dtype=np.float32)
        pf = np.empty(plen + RUN_SLACK, dtype=np.float32) if unit else planes.reshape(sh * sw * plen)
        tmp = np.empty(h * w + RUN_SLACK if unit else 0, dtype=np.float32)
        img = np.empty((prow * sh, wq * sw) if small else (0, 0), dtype=np.float32)
        acc = np.zeros(span, dtype=np.float32)  # (row pairs leave the columns between rows)
        offs = np.empty(taps, dtype=np.int64)  # tap (ky, kx): phase (ky dh % sh, kx dw % sw)'s plane, shifted
        for ky in range(kh):
            for kx in range(kw):
                offs[ky * kw + kx] = ((ky * dh % sh) * sw + kx * dw % sw) * plen + ky * dh // sh * wq + kx * dw // sw
        for o in range(part * n_out // parts, (part + 1) * n_out // parts):
            for t in range(taps):
                wf[t] = widen(w16[o, t])
            if unit:
                _fill_unit_stride(xrows, o // og, h, w, pt, pl, padv, pf, prow, wq, tmp)
            elif small:
                fill_phases_small(x, o // og, pt, pl, sh, sw, padv, planes, img)
            else:
                fill_phases(x, o // og, pt, pl, sh, sw, padv, planes)
            bv = bias[o]
            if taps == 9 and kw == 3 and sh == 1 and sw == 1 and dh == 1 and dw == 1 and ow >= PAIR_ROWS_MIN_COLS:
                for oy in range(0, oh - 1, 2):
                    _taps9_rows2(acc, pf, oy * wq, wq, ow, bv, wf)
                if oh % 2:
                    last = (oh - 1) * wq
                    _taps9(acc[last:], pf[last:], offs, ow, bv, wf)
            elif taps == 9 and kw == 3:
                _taps9(acc, pf, offs, span, bv, wf)
            else:
                for j in range(span):
                    acc[j] = bv
                for ky in range(kh):
                    t = ky * kw
                    kx = 0
                    if kw == 5:
                        _axpy5(acc, pf, offs[t], offs[t + 1], offs[t + 2], offs[t + 3], offs[t + 4], span,
                               wf[t], wf[t + 1], wf[t + 2], wf[t + 3], wf[t + 4])
                        kx = 5
                    while kx + 3 <= kw:
                        _axpy3(acc, pf, offs[t + kx], offs[t + kx + 1], offs[t + kx + 2], span, wf[t + kx],
                               wf[t + kx + 1], wf[t + kx + 2])
                        kx += 3
                    while kx < kw:
                        _axpy1(acc, pf, offs[t + kx], span, wf[t + kx])
                        kx += 1
            apply_ops(acc, span, ops)
            for oy in range(oh):
                store_row_inline(acc, oy * wq, out, o, oy * ow, run if oy < oh - 1 else ow)
