"""bf16 pair products (``jit.bf16dot``): the register-tile kernel against float64 sums, and the
GEMM convolution using them where the CPU has AVX-512 BF16."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba.core.codegen import get_host_cpu_features

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.jit import bf16dot, vectors

HOST_BF16 = vectors.BF16 in get_host_cpu_features().split(",")
HOST_AMX = vectors.AMX <= set(get_host_cpu_features().split(","))
#: the GEMM convolution multiplies bf16 values as they are (pairs or AMX tiles), not widened
BF16_PRODUCTS = jit.conv.DOT or jit.conv.AMX
#: the kernels are compiled for AVX-512 BF16 (the host's features, or explicit ones)
COMPILED_BF16 = vectors.BF16 in (numba.config.CPU_FEATURES or get_host_cpu_features()).split(",")
needs_bf16 = pytest.mark.skipif(not COMPILED_BF16, reason="bf16 pair products need a CPU with AVX-512 BF16")


@needs_bf16
@pytest.mark.parametrize(("rows", "strips", "pairs", "table"),
                         [(8, 2, 128, False), (8, 1, 3, False), (3, 2, 1, False), (8, 2, 37, True)])
def test_pair_products_match_float64_sums(rows: int, strips: int, pairs: int, table: bool) -> None:
    """c += A B over k pairs, A (rows, 2 pairs) and B (2 pairs, strips x 16) in the kernel's
    operand layout, at offsets into larger arrays (the tile's row stride wider than its strips);
    with a ``table`` each k pair's B where an offset table says (shuffled here, as
    ``jit.implicit_pairs`` reads them from the input's planes); products of bf16 values are
    exact in fp32, so only the sums' roundings separate it from float64."""
    rng = np.random.default_rng(3)
    k = 2 * pairs
    a16 = to_bf16(rng.standard_normal((rows, k)).astype(np.float32))
    b16 = to_bf16(rng.standard_normal((strips, k, 16)).astype(np.float32))
    c0 = rng.standard_normal((rows, 40)).astype(np.float32)
    # A: pair p of row r at 2 rows p + 2 r; B: strip s, pair p, pixel j at s sb + 32 slot(p) + 2 j
    a = np.concatenate([np.zeros(5, np.uint16), a16.reshape(rows, pairs, 2).transpose(1, 0, 2).ravel()])
    slot = rng.permutation(pairs) if table else np.arange(pairs)
    sb = 32 * pairs + 6
    b = np.zeros(3 + strips * sb, np.uint16)
    for s in range(strips):
        runs = b16[s].reshape(pairs, 2, 16).transpose(0, 2, 1).reshape(pairs, 32)
        for q in range(pairs):
            b[3 + s * sb + 32 * slot[q]:3 + s * sb + 32 * slot[q] + 32] = runs[q]
    c = c0.copy().ravel()
    if table:
        micro = bf16dot.compile_dot_micro(rows, strips, bf16dot.PairsFrom.TABLE)
        micro(a, 5, b, 3, sb, (32 * slot).astype(np.int64), c, 4, 40, pairs)
    else:
        bf16dot.compile_dot_micro(rows, strips)(a, 5, b, 3, sb, c, 4, 40, pairs)
    want = c0.astype(np.float64)
    for s in range(strips):
        want[:, 4 + 16 * s:20 + 16 * s] += from_bf16(a16).astype(np.float64) @ from_bf16(b16[s]).astype(np.float64)
    got = c.reshape(rows, 40)
    scale = np.abs(from_bf16(a16)).astype(np.float64) @ np.abs(from_bf16(b16).astype(np.float64)).max(axis=0)
    bound = 4 * np.finfo(np.float32).eps * (k + 1) * (scale.max() + np.abs(c0).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    untouched = np.ones(40, bool)
    untouched[4:4 + 16 * strips] = False
    assert np.array_equal(got[:, untouched], c0[:, untouched])  # nothing outside the tile written


@needs_bf16
@pytest.mark.parametrize(("rows", "strips", "channels", "n"), [(8, 2, 96, 32), (8, 2, 7, 20), (3, 1, 5, 16),
                                                               (8, 2, 300, 5)])
def test_row_pair_products_match_float64_sums(rows: int, strips: int, channels: int, n: int) -> None:
    """The register tile reading B as a planar blob's channel rows (``PairsFrom.ROWS``):
    pixels p0 .. p0 + n - 1 of every channel, the run ending at the array's end (masked loads
    read nothing past n: a fault there would end the test), an odd channel count (the last
    pair's partner zero); the tile's lanes past n keep their values."""
    rng = np.random.default_rng(channels)
    npix = 41
    p0 = npix - n
    x16 = to_bf16(rng.standard_normal((channels, npix)).astype(np.float32))
    a16 = to_bf16(rng.standard_normal((rows, channels)).astype(np.float32))
    pairs = -(-channels // 2)
    # pair p of row r at 2 rows p + 2 r, a zero beside an odd last k
    a = np.pad(a16, ((0, 0), (0, 2 * pairs - channels))).reshape(rows, pairs, 2).transpose(1, 0, 2).ravel()
    c0 = rng.standard_normal((rows, 40)).astype(np.float32)
    c = c0.copy().ravel()
    bf16dot.compile_dot_micro(rows, strips, bf16dot.PairsFrom.ROWS)(a, 0, x16.ravel(), p0, npix, channels % 2, n, c, 4,
                                                                 40, channels // 2)
    got = c.reshape(rows, 40)
    cols = min(n, 16 * strips)
    want = c0[:, 4:4 + cols] + from_bf16(a16).astype(np.float64) @ from_bf16(x16[:, p0:p0 + cols]).astype(np.float64)
    scale = np.abs(from_bf16(a16)).astype(np.float64) @ np.abs(from_bf16(x16)).astype(np.float64).max(axis=1)
    bound = 4 * np.finfo(np.float32).eps * (channels + 1) * (scale.max() + np.abs(c0).max())
    np.testing.assert_allclose(got[:, 4:4 + cols], want, rtol=0, atol=bound)
    untouched = np.ones(40, bool)
    untouched[4:4 + cols] = False
    assert np.array_equal(got[:, untouched], c0[:, untouched])


#: (input shape, out channels, groups): an odd channel count and partial strips, K > KC (two K
#: blocks), several row chunks sharing pixel blocks, a grouped 1x1 layer, more rows a group than
#: ROWS_DIRECT_MAX (panels)
ROWS_CASES = [((3, 9, 11), 5, 1), ((300, 5, 5), 27, 1), ((64, 12, 12), 32, 1), ((8, 12, 11), 8, 2),
              ((16, 6, 6), 40, 1)]


@pytest.mark.parametrize(("shape", "out", "groups"), ROWS_CASES)
def test_1x1_layers_read_their_input_rows_with_the_panels_bits(shape: tuple[int, int, int], out: int,
                                                               groups: int) -> None:
    """``conv_gemm`` on a 1x1 layer multiplies its bf16 input's channel rows in place
    (``jit.conv.ROWS_DIRECT``: AVX-512 BF16 hosts without AMX; up to 32 rows a group) with the bits of the packed
    panels it uses otherwise: the same layer with a channel scale of ones (which packs panels,
    each value times 1 unchanged) gives the same output, in several task splits."""
    c, h, w = shape
    rng = np.random.default_rng(c)
    x = to_bf16(rng.standard_normal(shape).astype(np.float32))
    w16 = to_bf16(rng.standard_normal((out, c // groups)).astype(np.float32))
    bias = rng.standard_normal(out).astype(np.float32)
    geo = jit.geometry(groups, c // groups, out // groups, 1, 1, 1, 1, 1, 1, 0, 0, h, w)
    assert jit.conv.reads_rows(geo, shape, True, False) == (jit.conv.ROWS_DIRECT and out // groups <= 32)
    assert not jit.conv.reads_rows(geo, shape, True, True) and not jit.conv.reads_rows(geo, shape, False, False)
    wp = jit.pack_gemm_weights(w16, groups, out // groups, c // groups)
    got = {}
    for scaled in (False, True):
        for rows, parts in ((1, 1), (2, 3)):
            direct = jit.conv.reads_rows(geo, shape, True, scaled)
            shared = np.empty(jit.conv.shared_panels_shape(groups, out // groups, h * w, c // groups, 32, rows,
                                                           direct), jit.conv.PANEL)
            y = np.empty((out, h * w), np.uint16)
            scale = to_bf16(np.ones(c, np.float32)) if scaled else x[:0, 0, 0]
            jit.conv_gemm(x, scale, jit.epilogue.NO_SCALE_ACT, wp, bias, jit.epilogue_ops(1, []), np.float32(0), geo,
                          32, rows, shared, parts, y)
            got[scaled, rows] = y
    first = got[False, 1]
    assert all(np.array_equal(first, y) for y in got.values())
    want = np.maximum(np.einsum("gok,gkp->gop", from_bf16(w16).reshape(groups, out // groups, -1),
                                from_bf16(x).reshape(groups, c // groups, h * w)).reshape(out, -1) + bias[:, None], 0)
    np.testing.assert_allclose(from_bf16(first), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def _sums(w: np.ndarray, cols: np.ndarray, bias: np.ndarray, pairs: bool) -> np.ndarray:
    """bias + W cols in fp32, k ascending (an FMA each), or by k pairs with each pair's odd k
    first (Intel's definition of vdpbf16ps). Products of bf16 values are exact in fp32, so
    numpy's rounded adds give those bits exactly."""
    acc = np.repeat(bias[:, None], cols.shape[1], axis=1)
    for k in range(w.shape[1] + 1):
        kk = k ^ 1 if pairs else k
        if kk < w.shape[1]:  # an odd K's missing partner adds nothing
            acc = acc + w[:, kk:kk + 1] * cols[kk]
    return acc


def _conv3x3(x: np.ndarray, w16: np.ndarray, bias: np.ndarray, ops: np.ndarray | None = None) -> np.ndarray:
    c, hw, _ = x.shape
    og = w16.shape[0]
    geo = jit.geometry(1, c, og, 3, 3, 1, 1, 1, 1, 1, 1, hw, hw)
    shared = np.empty(jit.conv.shared_panels_shape(1, og, hw * hw, c * 9, 32, 2), jit.conv.PANEL)
    out = np.empty((og, hw * hw), np.uint16)
    jit.conv_gemm(x, x[:0, 0, 0], jit.epilogue.NO_SCALE_ACT, jit.pack_gemm_weights(w16, 1, og, c * 9), bias,
                  jit.epilogue_ops(0, []) if ops is None else ops, np.float32(0), geo, 32, 2, shared, 3, out)
    return out


def test_the_gemm_convolution_runs_the_path_this_cpu_has() -> None:
    """On an AMD AVX-512 BF16 host the GEMM convolution multiplies bf16 pairs, on an AMX host
    bf16 tiles; both read and write denormals as zero (products of 1e-20 and 1e-20 vanish);
    elsewhere the fp32 kernel keeps them."""
    assert jit.conv.DOT == jit.VECTORS.bf16_dot <= HOST_BF16  # never where the CPU lacks them
    assert jit.conv.AMX == jit.VECTORS.amx <= HOST_AMX
    assert not (jit.conv.DOT and jit.conv.AMX)
    tiny = to_bf16(np.full((5, 9, 9), 1e-20, np.float32))
    out = _conv3x3(tiny, to_bf16(np.full((16, 45), 1e-20, np.float32)), np.zeros(16, np.float32))
    assert np.all(out == 0) if BF16_PRODUCTS else np.all(out != 0)


#: (activation code, params, its numpy emulation as the kernels' epilogue applies it)
EPILOGUES = [(0, [], lambda v: v), (1, [], lambda v: np.maximum(v, np.float32(0)) + np.float32(0)),
             (3, [-0.5, 0.7], lambda v: np.minimum(np.maximum(v, np.float32(-0.5)), np.float32(0.7)))]


@pytest.mark.parametrize(("code", "params", "act"), EPILOGUES, ids=["none", "relu", "clip"])
def test_the_gemm_convolutions_sums_are_one_of_the_two_orders(code: int, params: list[float],
                                                            act) -> None:  # noqa: ANN001
    """The sums' order, emulated exactly: k ascending for the fp32 kernel; for the pair products
    Intel's (each pair's odd k first) or k ascending, which an AMD Zen 4 was measured giving
    (and AMX tiles on a Sapphire Rapids VM). K = 45 is one K block: with pair products its sums
    go from the registers through the epilogue (none, ReLU, Clip) to the output
    (``bf16dot.Finish.STORE``), with the bits of the fp32 tile's store."""
    rng = np.random.default_rng(0)
    x = to_bf16(rng.standard_normal((5, 9, 9)).astype(np.float32))  # K = 45: the last pair padded
    w16 = to_bf16(rng.standard_normal((16, 45)).astype(np.float32))
    bias = rng.standard_normal(16).astype(np.float32)
    out = _conv3x3(x, w16, bias, jit.epilogue_ops(code, params))
    xp = np.pad(from_bf16(x), ((0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, ky:ky + 9, kx:kx + 9] for ky in range(3) for kx in range(3)], axis=1).reshape(45, 81)
    ascending = np.array_equal(out, to_bf16(act(_sums(from_bf16(w16), cols, bias, False))))
    odd_first = np.array_equal(out, to_bf16(act(_sums(from_bf16(w16), cols, bias, True))))
    assert ascending or (BF16_PRODUCTS and odd_first)


@pytest.mark.parametrize(("channels", "out", "tail", "code"), [(45, 40, 1, 1), (45, 200, 4, 0), (300, 72, 2, 3),
                                                               (300, 140, 3, 1)])
def test_a_maps_last_pixels_have_the_bits_of_a_whole_strip(channels: int, out: int, tail: int, code: int) -> None:
    """A block's last pixels, up to ``conv.TAIL_MAX`` past its whole strips, are multiplied with
    the rows as the lanes (``bf16dot.tail_pixels``, on pair-product hosts), each lane's
    arithmetic the strip kernels': a 1x1 layer over 32 + ``tail`` pixels gives bitwise the
    outputs of the same layer over those pixels and more (computed as a whole strip), whether
    its sums go through the epilogue from the registers (K = 45, one block) or into the fp32
    tile (K = 300, two blocks), for more row blocks than one group of ``TAIL_BLOCKS``, in one or
    several row chunks. With fp32 panels the last 1-8 pixels run in a half strip that sums odd
    and even depths apart (``conv._micro_source``'s split): there the whole strip's values
    within a bf16 rounding, the strips before them bitwise, and the same bits in any row
    chunks."""
    rng = np.random.default_rng(out)
    x = to_bf16(rng.standard_normal((channels, 1, 48)).astype(np.float32))
    w16 = to_bf16(rng.standard_normal((out, channels)).astype(np.float32))
    bias = rng.standard_normal(out).astype(np.float32)
    wp = jit.pack_gemm_weights(w16, 1, out, channels)
    ops = jit.epilogue_ops(code, [-0.5, 0.7] if code == 3 else [])

    def conv(n: int, rows: int, parts: int) -> np.ndarray:
        geo = jit.geometry(1, channels, out, 1, 1, 1, 1, 1, 1, 0, 0, 1, n)
        shared = np.empty(jit.conv.shared_panels_shape(1, out, n, channels, 128, rows), jit.conv.PANEL)
        y = np.empty((out, n), np.uint16)
        jit.conv_gemm(np.ascontiguousarray(x[:, :, :n]), x[:0, 0, 0], jit.epilogue.NO_SCALE_ACT, wp, bias, ops,
                      np.float32(0), geo, 128, rows, shared, parts, y)
        return y

    n = 32 + tail
    assert jit.conv.TAIL_MAX >= tail and jit.conv.strips_before_tail(n) * 16 < n
    whole = conv(48, -(-out // jit.conv.MR), 1)
    one, chunks = (conv(n, rows, parts) for rows, parts in ((-(-out // jit.conv.MR), 1), (4, 3)))
    assert np.array_equal(one, chunks)
    if jit.conv.PANEL is np.float32:
        assert np.array_equal(one[:, :32], whole[:, :32])
        assert np.allclose(from_bf16(one), from_bf16(whole[:, :n]), rtol=2**-7, atol=1e-3)
    else:
        assert np.array_equal(one, whole[:, :n])
