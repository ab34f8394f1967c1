"""The numba convolution kernels (``vkserve.devices.cpu.jit``, issue 13) against the ncnn package:
kernel sizes 1/3/5/7, strides, dilations, symmetric / asymmetric / SAME pads and pad_value,
depthwise (with a channel multiplier) and grouped convolutions, channel and pixel counts that
are not multiples of the kernels' tiles (MR = 4 rows, 8 on AVX-512 hosts; NR = 16 pixels, NB = 128 pixels per task,
KC = 256 per K block), every fused activation type, InnerProduct in both input forms; and the
same bits with 1 and N threads and from run to run. Dense layers of up to
``jit.direct.MAX_CHANNELS`` input channels run on ``jit.direct`` (from the input's planes), the
others on ``conv_gemm``: the cases below have both. (Winograd: test_cpu_winograd.py.)
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
import pytest

from tests.support.cpu_engine import check_against_ncnn
from tests.support.params import param_text
from vkserve.devices.cpu import jit, threads
from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.devices.cpu.executor import Plan, StepKind
from vkserve.devices.cpu.jit.epilogue import store_row
from vkserve.devices.cpu.kernels import REGISTRY
from vkserve.models.graph import load_model

#: activation_type 1..6 with their params (0: none is every other case)
ACTS = ["9=1", "9=2 -23310=1,0.1", "9=3 -23310=2,-0.5,0.7", "9=4", "9=5", "9=6 -23310=2,0.2,0.5"]


def conv(kind: str, c: int, out: int, k: tuple[int, int], params: str, group: int = 1) -> str:
    size = out * (c // group) * k[0] * k[1]
    g = f" 7={group}" if kind == "ConvolutionDepthWise" else ""
    return f"{kind} op 1 1 data out 0={out} 1={k[1]} 11={k[0]} 6={size}{g} 5=1 {params}"


# (input shape, out channels, (kh, kw), params)
DENSE = [
    ((3, 9, 11), 5, (1, 1), ""),  # 1x1 flat path, rows and pixels short of a tile
    ((19, 13, 17), 21, (1, 1), "3=2"),  # 1x1 stride 2
    ((6, 12, 14), 7, (1, 1), "4=1"),  # 1x1 with padding (not the flat path)
    ((5, 11, 13), 9, (3, 3), "4=1"),
    ((4, 16, 15), 6, (3, 3), "3=2 4=1"),
    ((5, 12, 12), 6, (3, 3), "2=2 4=2"),  # dilation 2
    ((3, 10, 13), 4, (3, 3), "4=1 15=2 14=0 16=1 18=0.75"),  # asymmetric pads, pad_value
    ((4, 9, 10), 5, (3, 3), "4=-233 3=2"),  # SAME_UPPER
    ((4, 9, 10), 5, (3, 3), "4=-234 3=2"),  # SAME_LOWER
    ((3, 17, 19), 8, (5, 5), "4=2 3=2"),
    ((2, 15, 15), 3, (7, 7), "4=3 3=2 18=-1.0"),
    ((3, 12, 11), 5, (3, 5), "13=2 3=1 12=2 4=1 14=2"),  # rectangular kernel, stride/dilation per axis
    ((40, 9, 9), 150, (3, 3), "4=1"),  # K = 360 > KC, 150 rows (several row chunks)
    ((12, 13, 13), 33, (3, 3), "4=1"),  # 169 pixels: two pixel blocks, the second partial
    ((300, 5, 5), 77, (1, 1), ""),  # K = 300 > KC on the flat path
    # jit.direct: several row chunks (70 rows > TASK_ROWS, not whole blocks of MR) and pixel
    # blocks, one input channel, cropping pads
    ((3, 40, 45), 70, (3, 3), "3=2 4=1"),
    ((1, 20, 21), 9, (3, 3), "4=1"),
    ((4, 14, 40), 12, (3, 3), "3=2 4=-1 15=-1 14=-1 16=-1"),
]


@pytest.mark.parametrize("shape,out,k,params", DENSE, ids=[f"{s}-{o}-{k}-{p}" for s, o, k, p in DENSE])
def test_convolution_matches_ncnn(tmp_path: Path, shape: tuple[int, int, int], out: int,
                                  k: tuple[int, int], params: str) -> None:
    check_against_ncnn(tmp_path, conv("Convolution", shape[0], out, k, params), {"data": shape},
                       np.random.default_rng(1))


# (input shape, out channels, group, (kh, kw), params)
GROUPED = [
    ((6, 13, 11), 6, 6, (3, 3), "4=1"),  # depthwise 3x3 s1
    # 3x3 s1 on maps of at least jit.conv.PAIR_ROWS_MIN_COLS columns (two rows at a time): an odd
    # row count (the last row alone), a channel multiplier with pad_value
    ((4, 15, 50), 4, 4, (3, 3), "4=1"),
    ((3, 12, 64), 6, 3, (3, 3), "4=1 18=0.5"),
    ((7, 14, 15), 7, 7, (3, 3), "3=2 4=1"),  # depthwise 3x3 s2
    # stride 2 with planes of at least jit.conv.PAIR_MIN_COLS columns (both column phases filled
    # in one pass): no padding and an odd width, asymmetric pads with pad_value, dilation 2,
    # cropping pads, stride 2 across only, 5x5 with pad 1
    ((6, 16, 37), 6, 6, (3, 3), "3=2 4=0"),
    ((5, 15, 40), 5, 5, (3, 3), "3=2 4=1 15=2 14=0 16=1 18=-0.5"),
    ((4, 19, 38), 4, 4, (3, 3), "3=2 2=2 4=2"),
    ((3, 13, 36), 3, 3, (3, 3), "3=2 4=-1 15=-1 14=-1 16=-1"),
    ((4, 12, 33), 4, 4, (3, 3), "13=1 3=2 4=1"),
    ((3, 12, 41), 3, 3, (5, 5), "3=2 4=1"),
    ((5, 17, 16), 5, 5, (5, 5), "4=2"),
    ((5, 17, 16), 5, 5, (5, 5), "3=2 4=2 18=0.5"),
    ((3, 15, 15), 3, 3, (7, 7), "4=3 2=2"),  # dilation 2
    # rows stored with the plane's extra columns spilling into the next row: exactly to the
    # channel's end (plane row 8 = 2 x 4 outputs), and a kernel wider than that (rows exact)
    ((4, 4, 4), 4, 4, (5, 5), "4=2"),
    ((4, 3, 2), 4, 4, (5, 5), "4=2"),
    # stride 1 on maps up to a vector wide (the channel widened once, rows copied as runs):
    # cropping pads, asymmetric pads with pad_value, 7 wide
    ((3, 9, 12), 3, 3, (3, 3), "4=-1 15=-1 14=-1 16=-1"),
    ((5, 11, 13), 5, 5, (3, 3), "4=2 15=0 14=1 16=3 18=-0.5"),
    ((19, 7, 7), 19, 19, (3, 3), "4=1"),
    ((4, 10, 9), 4, 4, (1, 1), ""),
    ((4, 13, 12), 4, 4, (3, 3), "3=3 4=1 15=0 16=2"),  # stride 3, asymmetric
    # strided on maps up to jit.conv.SMALL_PHASE_MAX_COLS wide (the phase planes copied out of
    # one padded image of the channel): mobilenet_v3's 5x5 s2 at 14 x 14, asymmetric pads with
    # pad_value, cropping pads, dilation 2, stride 2 across only, an odd width
    ((6, 14, 14), 6, 6, (5, 5), "3=2 4=2"),
    ((5, 9, 10), 5, 5, (3, 3), "3=2 4=1 15=2 14=0 16=1 18=-0.5"),
    ((3, 13, 12), 3, 3, (3, 3), "3=2 4=-1 15=-1 14=-1 16=-1"),
    ((4, 15, 14), 4, 4, (3, 3), "3=2 2=2 4=2"),
    ((4, 12, 13), 4, 4, (3, 3), "13=1 3=2 4=1"),
    ((7, 7, 7), 7, 7, (3, 3), "3=2 4=1"),
    ((6, 16, 28), 6, 6, (5, 5), "3=2 4=2"),
    ((5, 20, 31), 5, 5, (3, 3), "3=2 4=1 15=2 14=0 16=1 18=-0.5"),
    ((4, 11, 11), 4, 4, (3, 3), "4=-233 3=2"),
    ((3, 10, 12), 6, 3, (3, 3), "4=1"),  # channel multiplier 2
    # stride 1 on small maps by blocks of 16 channels (jit.dwblocks): a partial last block,
    # asymmetric pads with pad_value, 5x5 on 14 x 14, 7x7 on 8 x 8
    ((40, 7, 7), 40, 40, (3, 3), "4=1"),
    ((19, 9, 6), 19, 19, (5, 5), "4=2 15=0 14=1 16=3 18=-0.5"),
    ((17, 14, 14), 17, 17, (5, 5), "4=2"),
    ((5, 8, 8), 5, 5, (7, 7), "4=3"),
    ((6, 9, 10), 9, 3, (3, 3), "4=1 3=2"),  # grouped: 2 in, 3 out per group (GEMM path)
    ((8, 12, 11), 8, 2, (1, 1), ""),  # grouped 1x1
]


@pytest.mark.parametrize("shape,out,group,k,params", GROUPED,
                         ids=[f"{s}-{o}-g{g}-{k}-{p}" for s, o, g, k, p in GROUPED])
def test_depthwise_and_grouped_match_ncnn(tmp_path: Path, shape: tuple[int, int, int], out: int, group: int,
                                          k: tuple[int, int], params: str) -> None:
    line = conv("ConvolutionDepthWise", shape[0], out, k, params, group)
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(2))


# (channels, h, w, k, stride, (top, bottom, left, right) pads, pad_value, ops, storage)
BLOCKS = [
    (40, 7, 7, 3, 1, (1, 1, 1, 1), 0.0, jit.epilogue_ops(1, ()), np.uint16),
    (19, 7, 7, 3, 1, (1, 1, 1, 1), 0.5, jit.epilogue_ops(4, ()), np.uint16),
    (33, 9, 6, 5, 1, (2, 1, 0, 3), -0.5, jit.epilogue_ops(6, (0.2, 0.5)), np.uint16),
    (17, 5, 4, 5, 1, (2, 2, 2, 2), 0.0, jit.epilogue_ops(0, ()), np.float32),
    (16, 4, 4, 5, 1, (2, 2, 2, 2), 0.0, jit.epilogue_ops(0, ()), np.uint16),  # rows spill to the channel's end
    (16, 3, 2, 5, 1, (2, 2, 2, 2), 0.0, jit.epilogue_ops(0, ()), np.uint16),  # a kernel wider than the map
    (48, 14, 14, 5, 1, (2, 2, 2, 2), 0.0, jit.epilogue_ops(1, ()), np.uint16),
    (40, 14, 13, 3, 2, (1, 1, 1, 1), 0.0, jit.epilogue_ops(1, ()), np.uint16),  # an odd width: a row's last input unread
    (19, 9, 10, 5, 2, (2, 1, 0, 3), 0.5, jit.epilogue_ops(4, ()), np.uint16),
    (17, 8, 8, 3, 3, (0, 0, 0, 0), 0.0, jit.epilogue_ops(0, ()), np.float32),
    # the wider maps 256-bit hosts give the blocks
    (21, 16, 16, 3, 1, (1, 1, 1, 1), 0.0, jit.epilogue_ops(3, (0.0, 6.0)), np.uint16),
    (18, 20, 19, 5, 1, (2, 2, 2, 2), 0.0, jit.epilogue_ops(1, ()), np.uint16),
    (20, 56, 55, 3, 2, (1, 1, 1, 1), 0.0, jit.epilogue_ops(3, (0.0, 6.0)), np.uint16),
]


@pytest.mark.parametrize(("c", "h", "w", "k", "stride", "pads", "padv", "ops", "storage"), BLOCKS,
                         ids=[f"{c}x{h}x{w}-k{k}-s{s}-{p}-{np.dtype(t).name}" for c, h, w, k, s, p, _, _, t in BLOCKS])
@pytest.mark.parametrize("parts", [1, 3])
def test_channel_blocks_give_the_planes_bits(c: int, h: int, w: int, k: int, stride: int,
                                             pads: tuple[int, int, int, int], padv: float, ops: np.ndarray,
                                             storage: type, parts: int) -> None:
    """``jit.dwblocks`` (small maps, 16 channels at a time) computes what ``jit.depthwise``
    does on its planes, bit for bit, on shapes its rule sends either way, in any split of the
    blocks; both are checked against ncnn above."""
    pt, pb, pl, pr = pads
    oh, ow = (h + pt + pb - k) // stride + 1, (w + pl + pr - k) // stride + 1
    rng = np.random.default_rng(c)
    x = to_bf16(rng.standard_normal((c, h, w)).astype(np.float32))
    w16 = to_bf16(rng.standard_normal((c, k * k)).astype(np.float32))
    bias = rng.standard_normal(c).astype(np.float32)
    geo = jit.geometry(c, 1, 1, k, k, stride, stride, 1, 1, pt, pl, oh, ow)
    planes, blocks = np.zeros((c, oh * ow), storage), np.full((c, oh * ow), 7, storage)
    with jit.launch():
        jit.depthwise(x, x.reshape(c, -1), w16, bias, ops, np.float32(padv), geo, parts, planes)
        jit.dwblocks.depthwise_blocks(x, x.reshape(c, -1), jit.dwblocks.pack_weights(w16, c, k * k),
                                      jit.dwblocks.pack_bias(bias), ops, np.float32(padv), geo, parts, blocks)
    assert np.array_equal(planes.view(np.uint8), blocks.view(np.uint8))


# (channels, channel multiplier, h, w, k, stride, (top, bottom, left, right) pads, pad_value, ops)
ROWS = [
    (5, 1, 14, 14, 3, 1, (1, 1, 1, 1), 0.0, jit.epilogue_ops(4, ())),  # Sigmoid: the fp32 rows
    (3, 1, 7, 9, 3, 1, (1, 1, 1, 1), 0.0, jit.epilogue_ops(1, ())),
    (4, 1, 20, 37, 3, 1, (0, 2, 1, 0), -0.5, jit.epilogue_ops(3, (-0.5, 0.7))),  # asymmetric, pad_value, Clip
    (3, 2, 17, 33, 3, 1, (1, 1, 1, 1), 0.0, jit.epilogue_ops(0, ())),  # channel multiplier, three runs a row
    (3, 1, 14, 14, 5, 1, (2, 2, 2, 2), 0.0, jit.epilogue_ops(6, (0.2, 0.5))),  # HardSwish: the fp32 rows
    (2, 1, 5, 5, 5, 1, (2, 2, 2, 2), 0.0, jit.epilogue_ops(5, ())),  # a kernel as wide as the map; Mish
    (3, 1, 9, 12, 3, 1, (-1, -1, -1, -1), 0.0, jit.epilogue_ops(1, ())),  # cropping pads
    (3, 1, 14, 14, 3, 2, (1, 1, 1, 1), 0.0, jit.epilogue_ops(1, ())),
    (3, 1, 15, 15, 3, 2, (1, 1, 1, 1), 0.0, jit.epilogue_ops(0, ())),  # an odd map: the last column read
    (3, 2, 15, 37, 3, 2, (0, 1, 1, 0), 0.0, jit.epilogue_ops(3, (0.0, 6.0))),  # SAME-style pads
    (3, 1, 17, 41, 5, 2, (1, 2, 2, 1), 0.25, jit.epilogue_ops(1, ())),
    (2, 1, 9, 70, 3, 2, (1, 1, 1, 1), 0.0, jit.epilogue_ops(4, ())),  # Sigmoid: the fp32 rows, three runs
    (2, 1, 11, 12, 5, 2, (-1, 0, 0, -1), 0.0, jit.epilogue_ops(0, ())),
]


@pytest.mark.parametrize(("c", "og", "h", "w", "k", "stride", "pads", "padv", "ops"), ROWS,
                         ids=[f"{c}x{h}x{w}-m{m}-k{k}-s{s}-{p}" for c, m, h, w, k, s, p, _, _ in ROWS])
@pytest.mark.parametrize("parts", [1, 3])
def test_row_runs_give_the_planes_bits(c: int, og: int, h: int, w: int, k: int, stride: int,
                                      pads: tuple[int, int, int, int], padv: float, ops: np.ndarray,
                                      parts: int) -> None:
    """``jit.dwrows`` (16 outputs of a row in registers, masked loads from the planar input)
    computes what ``jit.depthwise`` does on its planes, bit for bit: pads of any sign and
    value, maps narrower and wider than a run, both epilogue paths (stored from the registers,
    or fp32 rows finished by ``apply_ops``), any split of the channels. (It runs on any host,
    fast only on AVX-512 ones, which take it.) Outside the written rows nothing changes."""
    pt, pb, pl, pr = pads
    oh, ow = (h + pt + pb - k) // stride + 1, (w + pl + pr - k) // stride + 1
    rng = np.random.default_rng(c * k + stride)
    x = to_bf16(rng.standard_normal((c, h, w)).astype(np.float32))
    w16 = to_bf16(rng.standard_normal((c * og, k * k)).astype(np.float32))
    bias = rng.standard_normal(c * og).astype(np.float32)
    geo = jit.geometry(c, 1, og, k, k, stride, stride, 1, 1, pt, pl, oh, ow)
    planes = np.zeros((c * og, oh * ow), np.uint16)
    rows = np.full((c * og + 1, oh * ow), 7, np.uint16)  # a row past the output (its first rows: contiguous)
    with jit.launch():
        jit.depthwise(x, x.reshape(c, -1), w16, bias, ops, np.float32(padv), geo, parts, planes)
        jit.dwrows.depthwise_rows(x, w16, bias, ops, np.float32(padv), geo, parts, rows[:-1])
    assert np.array_equal(planes, rows[:-1])
    assert (rows[-1] == 7).all()


@pytest.mark.parametrize(("shape", "k", "params", "wide", "other"), [
    ((8, 14, 14), 5, "4=2", "rows", "blocks"), ((8, 28, 28), 5, "4=2", "rows", "planes"),
    ((8, 14, 14), 5, "3=2 4=2", "rows", "blocks"), ((8, 32, 32), 5, "3=2 4=2", "rows", "blocks"),
    ((8, 14, 14), 3, "4=1", "rows", "blocks"), ((8, 28, 28), 3, "4=1", "rows", "planes"),
    ((8, 56, 56), 3, "3=2 4=1", "rows", "blocks"), ((8, 64, 64), 3, "3=2 4=1", "rows", "planes"),
    ((8, 7, 7), 5, "4=2", "blocks", "blocks"), ((8, 7, 7), 3, "4=1", "rows", "blocks"),
    ((8, 14, 14), 5, "4=2 15=-1 14=2 16=-1", "rows", "planes"), ((8, 9, 9), 5, "2=2 4=4", "planes", "planes"),
    ((8, 24, 24), 7, "4=3", "planes", "planes"), ((8, 12, 12), 3, "3=3 4=1", "blocks", "blocks")])
def test_depthwise_layers_take_the_path_the_rules_say(tmp_path: Path, shape: tuple[int, int, int], k: int,
                                                      params: str, wide: str, other: str) -> None:
    """On AVX-512 hosts (``wide``) undilated 3x3 and 5x5 depthwise layers at stride 1 and 2 run
    as row runs (``jit.dwrows``), pads of any sign, but 5x5 ones at stride 1 with outputs up to
    8 wide on channel blocks; elsewhere (``other``) outputs up to 16 wide at stride 1 and up to
    28 at stride 2 on channel blocks, wider maps and cropping pads on the planes; dilated and
    wide 7x7 layers on the planes everywhere, stride 3 on a small map on blocks. Its fp32 and bf16
    forms agree with its stored bits either way."""
    path = wide if jit.VECTORS.vector_bits == 512 else other
    param = tmp_path / "one.param"
    param.write_text(param_text({"data": shape}, [conv("ConvolutionDepthWise", shape[0], shape[0], (k, k),
                                                       f"{params} 9=1", shape[0])]))
    graph = load_model(param, None, {"data": shape}, seed=3)
    layer = next(lay for lay in graph.layers if lay.type == "ConvolutionDepthWise")
    kernel = REGISTRY[layer.type](layer, [shape])
    assert (kernel.rows, kernel.blocks) == (path == "rows", path == "blocks")
    u = to_bf16(np.random.default_rng(4).uniform(-2, 2, shape).astype(np.float32))
    wide = kernel.forward([from_bf16(u)])[0].copy()
    stored = np.empty(kernel.out_shapes[0], dtype=np.uint16)
    kernel.forward_store([u], [stored], [])
    assert kernel.forward_bf16([u])[0].tobytes() == wide.tobytes()
    assert stored.tobytes() == to_bf16(wide).tobytes()


def test_channel_blocks_take_wider_maps_where_vectors_are_narrower() -> None:
    """``dwblocks.worthwhile`` on either vector width, whatever this host's: with 256-bit vectors
    the planes' rows vectorize less, and the blocks take 3x3 layers to 16 outputs wide at stride
    1 and to 28 at stride 2, where 512-bit hosts keep them to 10 and 14."""
    same = (1, 1, 1, 1)
    for ow, stride, narrow, wide in [(10, 1, True, True), (14, 1, True, False), (16, 1, True, False),
                                     (20, 1, False, False), (14, 2, True, True), (28, 2, True, False),
                                     (56, 2, False, False)]:
        rule = functools.partial(jit.dwblocks.worthwhile, 3, 3, stride, stride, 1, 1, 1, same, ow)
        assert (rule(wide=False), rule(wide=True)) == (narrow, wide), (ow, stride)
    assert jit.dwblocks.worthwhile(5, 5, 1, 1, 1, 1, 1, (2, 2, 2, 2), 20, wide=False)
    assert not jit.dwblocks.worthwhile(5, 5, 1, 1, 1, 1, 1, (2, 2, 2, 2), 20, wide=True)


# (input shape, out channels, strides and activation): 1x1 unpadded strided layers
STRIDED_1X1 = [
    ((19, 13, 17), 21, "3=2"),  # odd sizes: the last row and column read
    ((40, 28, 28), 150, "3=2 9=1"),  # 150 rows: several row chunks on 16 threads
    ((300, 9, 9), 40, "3=2"),  # K = 300 > KC
    ((8, 15, 22), 16, "3=3 13=2"),  # strides per axis
    ((64, 57, 57), 40, "3=2 9=2 -23310=1,0.1"),  # several pixel blocks, a fused LeakyReLU
]


@pytest.mark.parametrize("shape,out,params", STRIDED_1X1, ids=[f"{s}-{o}-{p}" for s, o, p in STRIDED_1X1])
def test_strided_1x1_layers_decimate_with_the_strided_gemms_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 shape: tuple[int, int, int], out: int,
                                                                 params: str) -> None:
    """A 1x1 unpadded strided layer runs as the stride-1 GEMM on its input's decimation
    (``jit.conv.conv_gemm_decimated``, on ``DOT`` hosts; forced here on any host): the bits of
    the strided GEMM's panels, on 1 to 16 threads' splits, and ncnn's result."""
    line = conv("Convolution", shape[0], out, (1, 1), params)
    param = tmp_path / "one.param"
    param.write_text(param_text({"data": shape}, [line]))
    layer = next(lay for lay in load_model(param, None, {"data": shape}, seed=5).layers if lay.type == "Convolution")
    kernels = {}
    for decimate in (True, False):
        monkeypatch.setattr(jit.conv, "decimates", lambda geo, groups, d=decimate: d)
        kernels[decimate] = REGISTRY[layer.type](layer, [shape])
    assert kernels[True].decimated_geo is not None and kernels[False].decimated_geo is None
    u = to_bf16(np.random.default_rng(6).uniform(-2, 2, shape).astype(np.float32))
    outs = []
    for n in (1, 2, 16):
        monkeypatch.setattr(threads, "THREADS", n)
        for kernel in kernels.values():
            outs.append(np.full(kernel.out_shapes[0], 7, dtype=np.uint16))
            kernel.forward_store([u], [outs[-1]], [])
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)
    monkeypatch.undo()
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(7))


def test_strided_1x1_layers_decimate_where_the_rule_says() -> None:
    """On ``DOT`` hosts (where measured) a dense 1x1 unpadded layer strided along either axis
    with 14x14 outputs or more (resnet50's 28x28 and 14x14 ones); never 3x3, padded, grouped or
    stride-1 layers, nor 7x7 outputs (resnet50's last stage)."""
    def geo(k: int, sh: int, sw: int, pad: int, out: int = 14) -> np.ndarray:
        return jit.geometry(1, 8, 8, k, k, sh, sw, 1, 1, pad, pad, out, out)

    assert jit.conv.decimates(geo(1, 2, 2, 0), 1) == jit.conv.decimates(geo(1, 1, 3, 0, 28), 1) == jit.conv.DOT
    assert not any(jit.conv.decimates(g, groups) for g, groups in (
        (geo(1, 1, 1, 0), 1), (geo(3, 2, 2, 0), 1), (geo(1, 2, 2, 1), 1), (geo(1, 2, 2, 0), 2), (geo(1, 2, 2, 0, 7), 1)))


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kind", ["conv", "direct", "dw", "fc"])
def test_fused_activation_types_match_ncnn(tmp_path: Path, kind: str, act: str) -> None:
    if kind == "conv":
        line, shape = conv("Convolution", 5, 7, (3, 3), f"4=1 {act}"), (5, 9, 10)
    elif kind == "direct":
        line, shape = conv("Convolution", 3, 7, (3, 3), f"3=2 4=1 {act}"), (3, 19, 20)
    elif kind == "dw":
        line, shape = conv("ConvolutionDepthWise", 5, 5, (3, 3), f"4=1 {act}", group=5), (5, 9, 10)
    else:
        line, shape = f"InnerProduct op 1 1 data out 0=19 1=1 2={19 * 60} {act}", (60,)
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(3))


@pytest.mark.parametrize("shape,out", [((7, 5, 3), 23), ((37,), 16), ((5, 33), 17), ((3, 300), 40)],
                         ids=["flat-3d", "flat-1d", "rows", "rows-wide"])
def test_inner_product_matches_ncnn(tmp_path: Path, shape: tuple[int, ...], out: int) -> None:
    n_in = shape[-1] if len(shape) == 2 else int(np.prod(shape))
    line = f"InnerProduct op 1 1 data out 0={out} 1=1 2={out * n_in}"
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(4))


CHAIN = [
    "Convolution c1 1 1 data a 0=24 1=3 11=3 3=2 4=1 5=1 6=648",
    "ConvolutionDepthWise dw 1 1 a b 0=24 1=3 11=3 4=1 5=1 6=216 7=24 9=1",
    "Convolution c2 1 1 b c 0=40 1=1 11=1 5=1 6=960",
    "Sigmoid s 1 1 c d",
    "InnerProduct fc 1 1 d out 0=10 1=1 2=" + str(10 * 40 * 17 * 15),
]


def chain_plan(tmp_path: Path) -> tuple[Plan, dict[str, np.ndarray]]:
    param = tmp_path / "chain.param"
    param.write_text(param_text({"data": (3, 34, 29)}, CHAIN))
    graph = load_model(param, None, {"data": (3, 34, 29)}, seed=5)
    x = np.random.default_rng(6).uniform(-2, 2, (3, 34, 29)).astype(np.float32)
    return Plan(graph), {"data": x}


def test_same_bits_with_one_and_more_threads_and_run_to_run(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    plan, feed = chain_plan(tmp_path)
    assert [s for s in plan._program if s.kind is StepKind.STORE]  # the jit kernels store
    assert plan.fused == [("c2", "s")]
    monkeypatch.setattr(threads, "THREADS", 1)
    one = plan.run(feed)["out"]
    monkeypatch.setattr(threads, "THREADS", max(2, threads.available_cores()))
    many = plan.run(feed)["out"]
    again = plan.run(feed)["out"]
    # as split for 16 threads (smaller pixel blocks, more row chunks), whatever runs them
    monkeypatch.setattr(threads, "THREADS", 16)
    split16 = plan.run(feed)["out"]
    assert one.tobytes() == many.tobytes() == again.tobytes() == split16.tobytes()


@pytest.mark.parametrize(("og", "npix"), [(192, 49), (112, 196), (1152, 49), (64, 12544), (16, 12544)])
def test_gemm_split_gives_every_thread_work_where_the_layer_has_it(og: int, npix: int) -> None:
    for n in (1, 2, 4, 16):
        pixels, rb = jit.gemm_split(1, og, npix, n)
        assert pixels % jit.conv.NR == 0 and jit.conv.MIN_BLOCK <= pixels <= jit.conv.NB
        rows = -(-og // jit.conv.MR)
        tasks = -(-npix // pixels) * -(-rows // rb)
        # about two tasks a thread, unless the blocks are already the smallest
        assert tasks >= 2 * n or pixels == jit.conv.MIN_BLOCK, (n, pixels, rb, tasks)
        if n == 1:
            assert pixels == jit.conv.NB  # one thread: the largest blocks


def test_plans_on_several_threads_at_once(tmp_path: Path) -> None:
    """The scheduler runs Plans on worker threads: concurrent kernel launches give each Plan
    its own, unchanged result."""
    plan, feed = chain_plan(tmp_path)
    want = plan.run(feed)["out"]
    others = [chain_plan(tmp_path)[0] for _ in range(3)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        got = list(pool.map(lambda p: [p.run(feed)["out"] for _ in range(3)], others))
    assert all(r.tobytes() == want.tobytes() for rs in got for r in rs)


@pytest.mark.parametrize("channels", [6, 3], ids=["gemm", "direct"])
def test_forward_paths_agree_with_the_plan(tmp_path: Path, channels: int) -> None:
    """``forward`` (fp32 in and out) and ``forward_bf16`` compute what the Plan's bf16 store
    path does, before the one RNE narrowing."""
    param = tmp_path / "one.param"
    shape = (channels, 15, 14)
    line = conv("Convolution", channels, 9, (3, 3), "4=1 3=2 9=2 -23310=1,0.1")
    param.write_text(param_text({"data": shape}, [line]))
    graph = load_model(param, None, {"data": shape}, seed=8)
    u = to_bf16(np.random.default_rng(9).uniform(-2, 2, shape).astype(np.float32))
    layer = next(lay for lay in graph.layers if lay.type == "Convolution")
    kernel = REGISTRY[layer.type](layer, [shape])
    assert kernel.direct == (channels <= jit.direct.MAX_CHANNELS)
    wide = kernel.forward([from_bf16(u)])[0].copy()
    raw = kernel.forward_bf16([u])[0].copy()
    stored = np.empty(kernel.out_shapes[0], dtype=np.uint16)
    kernel.forward_store([u], [stored], [])
    assert wide.tobytes() == raw.tobytes()
    assert stored.tobytes() == to_bf16(wide).tobytes()
    assert np.array_equal(Plan(graph).run({"data": from_bf16(u)})["out"], from_bf16(stored))


def test_threads_default_to_the_cores_the_process_may_use(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    proc = tmp_path / "cgroup"
    proc.write_text("0::/jobs/vkserve\n")
    group = tmp_path / "fs" / "jobs" / "vkserve"
    group.mkdir(parents=True)
    monkeypatch.setattr(threads, "PROC_CGROUP", proc)
    monkeypatch.setattr(threads, "CGROUP_ROOT", tmp_path / "fs")
    assert threads.available_cores() == cores  # no cpu.max anywhere
    (group / "cpu.max").write_text("max 100000\n")
    assert threads.available_cores() == cores
    (group.parent / "cpu.max").write_text("150000 100000\n")  # 1.5 cores on the parent
    assert threads.available_cores() == 1
    monkeypatch.setenv("VKSERVE_CPU_THREADS", "3")
    assert threads.resolve()[0] == 3
    monkeypatch.setattr(threads, "THREADS", 1)
    jit.use_threads()
    assert numba.get_num_threads() == 1


@numba.njit
def store_vector(src: np.ndarray, dst: np.ndarray) -> None:
    store_row(src, 0, dst, 0, 0, src.size)


def test_kernel_narrowing_is_the_engines_rne() -> None:
    """The kernels' store rounds like ``bf16.to_bf16``: ties to even, NaN kept (quiet), Inf
    kept, overflow to Inf; widening is exact."""
    rng = np.random.default_rng(10)
    bits = np.concatenate([
        rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
        np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                  0x7FC00000, 0x7F800001, 0xFF800001, 0x00000000, 0x80000000, 0x00008000], dtype=np.uint32),
    ])
    values = bits.view(np.float32)
    out = np.empty((1, values.size), dtype=np.uint16)
    with np.errstate(invalid="ignore"):
        store_vector(values, out)
    assert out[0].tobytes() == to_bf16(values).tobytes()
    wide = np.empty((1, values.size), dtype=np.float32)
    store_vector(from_bf16(out[0]), wide)
    assert wide[0].view(np.uint32).tobytes() == from_bf16(out[0]).view(np.uint32).tobytes()


@pytest.mark.parametrize(("c", "og", "hw", "k", "stride", "threads_for"), [
    (512, 512, 7, 3, 1, 2),    # resnet50's last 3x3 layers: 1 pixel block, K = 4608 (18 K blocks)
    (96, 72, 14, 3, 2, 16),    # strided, padded, 2 K blocks, 16 threads' split
    (40, 200, 9, 1, 1, 16),    # 1x1 flat input, a partial strip
])
def test_shared_input_panels_give_the_same_bits(c: int, og: int, hw: int, k: int, stride: int,
                                               threads_for: int) -> None:
    """Row chunks reading input panels packed once (``shared_panels_shape``) compute exactly what
    chunks packing their own do, and ncnn's geometry is kept (checked on whole layers above)."""
    rng = np.random.default_rng(7)
    x = to_bf16(rng.standard_normal((c, hw, hw)).astype(np.float32))
    kt = c * k * k
    w16 = to_bf16(rng.standard_normal((og, kt)).astype(np.float32) * 0.05)
    wp = jit.pack_gemm_weights(w16, 1, og, kt)
    bias = rng.standard_normal(og).astype(np.float32)
    pad = k // 2
    oh = (hw + 2 * pad - k) // stride + 1
    geo = jit.geometry(1, c, og, k, k, stride, stride, 1, 1, pad, pad, oh, oh)
    ops = jit.epilogue_ops(1, [])
    pixels, rows = jit.gemm_split(1, og, oh * oh, threads_for)
    shape = jit.conv.shared_panels_shape(1, og, oh * oh, kt, pixels, rows)
    assert shape[0] > 0  # these layers' rows are split: the panels are shared
    results = []
    for shared, parts in ((np.empty(shape, jit.conv.PANEL), 64), (np.empty((0, 0, *shape[2:]), jit.conv.PANEL), 1),
                          (np.empty((0, 0, *shape[2:]), jit.conv.PANEL), 3)):
        out = np.empty((og, oh * oh), np.uint16)  # (the tasks in runs of any length: the same bits)
        jit.conv_gemm(x, x[:0, 0, 0], jit.epilogue.NO_SCALE_ACT, wp, bias, ops, np.float32(0), geo, pixels, rows,
                      shared, parts, out)
        results.append(out)
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()
    # and against the plain definition (fp32 sums of the widened operands, ReLU, bf16)
    xw = np.pad(from_bf16(x), ((0, 0), (pad, pad), (pad, pad)))
    cols = np.stack([xw[:, ky:ky + stride * oh:stride, kx:kx + stride * oh:stride]
                     for ky in range(k) for kx in range(k)], axis=1).reshape(kt, oh * oh)
    w = from_bf16(w16)
    want = np.maximum(w @ cols + bias[:, None], 0)
    np.testing.assert_allclose(from_bf16(results[0]), want, rtol=1e-2, atol=1e-2)


def test_unsplit_rows_pack_their_own_panels() -> None:
    pixels, rows = jit.gemm_split(1, 64, 3136, 1)
    assert jit.conv.shared_panels_shape(1, 64, 3136, 576, pixels, rows)[0] == 0


@pytest.mark.parametrize("kc", [0, 1, 2, 7, 256])
def test_half_strip_kernel_sums_odd_and_even_depths_apart(kc: int) -> None:
    """The half-strip register tile (a block's last 1-8 pixels) keeps the odd depths' products in
    sums of their own and adds them to the even depths' after the loop: the running sums it was
    given, plus every product once (an odd depth count's last product with the even ones), in
    that fixed order; a whole strip's kernel gives the same values within fp32 rounding."""
    rng = np.random.default_rng(kc)
    mr, nr = jit.conv.MR, jit.conv.NR
    a = rng.uniform(-1, 1, (max(kc, 1), mr)).astype(np.float32)
    b = rng.uniform(-1, 1, (2, max(kc, 1), nr)).astype(np.float32)
    start = rng.uniform(-1, 1, (mr, 2 * nr)).astype(np.float32)
    half, whole = start.copy(), start.copy()
    jit.conv._micro_half(a, b, half, kc, 0, 1)
    jit.conv._micro(a, b, whole, kc, 0, 1)
    expect = start[:, nr:].astype(np.float64) + a[:kc].astype(np.float64).T @ b[1, :kc].astype(np.float64)
    assert np.allclose(half[:, nr : nr + nr // 2], expect[:, : nr // 2], rtol=1e-5, atol=1e-5)
    untouched = np.r_[0:nr, nr + nr // 2 : 2 * nr]  # the other strip, and past the half strip
    assert np.array_equal(half[:, untouched], start[:, untouched])
    assert np.allclose(half[:, nr : nr + nr // 2], whole[:, nr : nr + nr // 2], rtol=1e-5, atol=1e-5)
