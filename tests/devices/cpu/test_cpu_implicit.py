"""Dense convolutions from the input's padded planes, on AMX tiles (``jit.implicit``) or by
bf16 pair products (``jit.implicit_pairs``), against the ncnn package: 1x1 (AMX only) and 3x3,
5x5 and rectangular kernels, strides 2 and 3 (the planes' stride phases), dilation, asymmetric,
negative and SAME pads with pad_value, channel counts off the 32-channel steps, odd ones and
row counts off the row blocks, output widths off the 32-position blocks, every fused
activation; and the same bits with 1 and N
threads and from run to run. Runs where the CPU has AMX and the OS grants it (``conv.AMX``), or
multiplies bf16 pairs (``conv.DOT``: AMD's AVX-512 BF16 cores); the other-path children of
``test_cpu_vectors`` run it for the path a host does not use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.cpu_engine import check_against_ncnn
from tests.support.params import param_text
from vkserve.devices.cpu import jit, threads
from vkserve.devices.cpu.bf16 import to_bf16
from vkserve.devices.cpu.kernels import REGISTRY
from vkserve.models.graph import load_model

pytestmark = pytest.mark.skipif(not (jit.conv.AMX or jit.implicit_pairs.worthwhile(1, 9)),
                                reason="the planes' kernels need AMX tiles (and the OS's grant) or bf16 pair products")


def from_planes(kernel) -> bool:  # noqa: ANN001
    return kernel.implicit or kernel.pairs


def split_of(kernel):  # noqa: ANN001, ANN201
    if kernel.implicit:
        return jit.implicit.split
    return lambda og, geo, threads: jit.implicit_pairs.split(og, geo, threads, kernel.columns)


def conv_line(c: int, out: int, k: tuple[int, int], params: str) -> str:
    return f"Convolution op 1 1 data out 0={out} 1={k[1]} 11={k[0]} 6={out * c * k[0] * k[1]} 5=1 {params}"


def kernel_for(tmp_path: Path, shape: tuple[int, int, int], line: str):  # noqa: ANN201
    param = tmp_path / "one.param"
    param.write_text(param_text({"data": shape}, [line]))
    graph = load_model(param, None, {"data": shape}, seed=11)
    layer = next(lay for lay in graph.layers if lay.type.startswith("Convolution"))
    return REGISTRY[layer.type](layer, [shape])


# (input shape, out channels, (kh, kw), params)
CASES = [
    ((16, 9, 11), 5, (1, 1), ""),  # 1x1: 16 channels (half a step), one row block short
    ((64, 14, 14), 64, (1, 1), ""),  # two whole steps, four row blocks
    ((33, 13, 17), 40, (3, 3), "4=1"),  # a step and one channel; 2.5 row blocks
    ((32, 7, 7), 512, (3, 3), "4=1"),  # many row blocks on a map smaller than a block
    ((20, 12, 12), 19, (3, 3), "2=2 4=2"),  # dilation 2
    ((17, 10, 13), 24, (3, 3), "4=1 15=2 14=0 16=1 18=0.75"),  # asymmetric pads, pad_value
    ((24, 9, 10), 17, (3, 3), "4=-233"),  # SAME_UPPER
    ((18, 12, 13), 16, (3, 3), "4=-1 15=-1 14=-1 16=-1"),  # negative pads (crops)
    ((16, 17, 19), 33, (5, 5), "4=2"),
    ((21, 12, 11), 18, (3, 5), "12=2 4=1 14=2"),  # rectangular kernel, dilation on one axis
    ((48, 30, 31), 70, (3, 3), "4=1"),  # 30 blocks of 32 positions, the last partial
    ((32, 15, 17), 48, (3, 3), "3=2 4=1"),  # stride 2: four phases, odd sizes
    ((40, 14, 14), 36, (1, 1), "3=2"),  # 1x1 stride 2: one phase read of four
    ((16, 13, 12), 20, (3, 3), "4=-233 3=2"),  # SAME_UPPER at stride 2
    ((24, 19, 20), 17, (5, 5), "3=2 4=2 18=0.5"),  # 5x5 stride 2, pad_value
    ((20, 16, 15), 24, (3, 3), "13=2 3=1 4=1"),  # stride 2 on rows alone
    ((18, 17, 19), 21, (3, 3), "3=3 2=2 4=2"),  # stride 3 with dilation 2
]


@pytest.mark.parametrize("shape,out,k,params", CASES, ids=[f"{s}-{o}-{k}-{p}" for s, o, k, p in CASES])
def test_implicit_matches_ncnn(tmp_path: Path, shape: tuple[int, int, int], out: int, k: tuple[int, int],
                               params: str) -> None:
    line = conv_line(shape[0], out, k, params)
    assert from_planes(kernel_for(tmp_path, shape, line)) == (jit.conv.AMX or k != (1, 1))  # 1x1: the pairs' GEMM
    check_against_ncnn(tmp_path, line, {"data": shape}, np.random.default_rng(21))


ACTS = ["9=1", "9=2 -23310=1,0.1", "9=3 -23310=2,-0.5,0.7", "9=4", "9=5", "9=6 -23310=2,0.2,0.5"]


@pytest.mark.parametrize("act", ACTS)
def test_implicit_fused_activations_match_ncnn(tmp_path: Path, act: str) -> None:
    line = conv_line(24, 20, (3, 3), f"4=1 {act}")
    assert from_planes(kernel_for(tmp_path, (24, 11, 12), line))
    check_against_ncnn(tmp_path, line, {"data": (24, 11, 12)}, np.random.default_rng(22))


def test_grouped_and_narrow_layers_stay_elsewhere(tmp_path: Path) -> None:
    """Grouped and depthwise layers, the few-channel layers of ``jit.direct`` and, on AMX, fewer
    than 16 input channels (mostly padding of its 32-channel steps) do not run here."""
    cases = [((32, 12, 12), "ConvolutionDepthWise op 1 1 data out 0=32 1=3 6=4608 5=1 4=1 7=2"),
             ((32, 12, 12), "ConvolutionDepthWise op 1 1 data out 0=32 1=3 6=288 5=1 4=1 7=32"),
             ((4, 12, 12), conv_line(4, 16, (3, 3), "4=1"))]
    for shape, line in cases:
        assert not from_planes(kernel_for(tmp_path, shape, line))
    assert from_planes(kernel_for(tmp_path, (15, 12, 12), conv_line(15, 16, (3, 3), "4=1"))) == (not jit.conv.AMX)


def test_implicit_same_bits_with_one_and_more_threads_and_run_to_run(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = kernel_for(tmp_path, (40, 20, 21), conv_line(40, 150, (3, 3), "4=1 9=1"))
    assert from_planes(kernel)
    u = to_bf16(np.random.default_rng(23).uniform(-2, 2, (40, 20, 21)).astype(np.float32))
    runs = []
    for n in (1, max(2, threads.available_cores()), 3, 16, 1):
        monkeypatch.setattr(threads, "THREADS", n)
        out = np.empty(kernel.out_shapes[0], dtype=np.uint16)
        kernel.forward_store([u], [out], [])
        runs.append(out.tobytes())
    assert len(set(runs)) == 1
    assert split_of(kernel)(150, kernel.geo, 16) < split_of(kernel)(150, kernel.geo, 1)  # row chunks split


#: layers on narrow maps: (input shape, out channels, (kh, kw), params); their positions end in a
#: whole strip, an odd strip, or 1-4 left for the tail kernel
COLUMN_CASES = [((64, 7, 7), 40, (3, 3), "4=1"),  # 49 positions: three strips and one
                ((33, 10, 10), 70, (3, 3), "4=1 9=3 -23310=2,-0.5,0.7"),  # 100: six strips and four
                ((20, 12, 12), 19, (3, 3), "2=2 4=2 18=0.5"),  # dilation, pad_value
                ((17, 10, 13), 24, (5, 3), "4=1 14=2 15=0 16=1"),  # asymmetric pads, 5 x 3
                ((18, 4, 5), 16, (3, 3), "4=-1 15=-1 14=-1 16=-1"),  # crops: 2 x 3 outputs, a tail alone
                ((40, 14, 28), 24, (3, 3), "4=1"),  # as wide as the column planes go
                ((32, 15, 17), 48, (3, 3), "3=2 4=1"),  # stride 2: a plane per row phase and column
                ((18, 17, 19), 21, (3, 3), "3=3 2=2 4=2"),  # stride 3, dilation 2
                ((20, 16, 13), 24, (3, 3), "13=2 3=1 4=1"),  # stride 2 on rows alone
                ((24, 27, 27), 32, (3, 3), "3=2 4=1")]  # as wide as a strided layer's go


@pytest.mark.skipif(not jit.implicit_pairs.worthwhile(1, 9), reason="the column planes are the pair products'")
@pytest.mark.parametrize("shape,out,k,params", COLUMN_CASES, ids=[f"{s}-{o}-{k}-{p}" for s, o, k, p in COLUMN_CASES])
def test_column_planes_give_the_bits_of_the_padded_planes(tmp_path: Path, shape: tuple[int, int, int], out: int,
                                                          k: tuple[int, int], params: str) -> None:
    """Narrow layers read one plane per row phase and kernel column, OW wide (no positions
    between output rows), where wider ones read the padded planes' stride phases: the same layer
    both ways gives the same bits, on one thread and in several tasks."""
    kernel = kernel_for(tmp_path, shape, conv_line(shape[0], out, k, params))
    assert kernel.pairs and kernel.columns
    u = to_bf16(np.random.default_rng(24).uniform(-2, 2, shape).astype(np.float32))
    outs = set()
    for columns in (True, False):
        for threads_, parts in ((1, 1), (16, 5)):
            planes = np.zeros(jit.implicit_pairs.pairs_planes_shape(kernel.geo, shape[0], columns), np.uint16)
            y = np.empty((out, int(np.prod(kernel.out_shapes[0][1:]))), np.uint16)
            jit.implicit_pairs.conv_pairs(u, u.reshape(shape[0], -1), u[:0, 0, 0], jit.epilogue.NO_SCALE_ACT,
                                          kernel.weight, kernel.bias, jit.epilogue_ops(1, []), kernel.pad_value,
                                          kernel.geo, columns, jit.implicit_pairs.split(out, kernel.geo, threads_,
                                                                                        columns), planes, parts, y)
            outs.add(y.tobytes())
    assert len(outs) == 1
