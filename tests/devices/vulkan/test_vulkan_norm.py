"""BatchNorm, Scale, Bias, LayerNorm, RMSNorm, GroupNorm and InstanceNorm through a Vulkan Plan
against the ncnn package, 1-D to 4-D blobs, in fp32 and the engine's fp16 modes (fp16s, fp16sa).

Each case is a one-layer .param with the models package's seeded random weights (written to a
.bin for ncnn); the output must match ncnn's within 1e-4 of the reference's max abs in fp32 and
2e-2 in the fp16 modes. Element counts are not multiples of 4 or of the local size 64.
"""

from __future__ import annotations

import pytest

from tests.support.vulkan_engine import MODES, check_against_ncnn, engine_device

__all__ = ["engine_device"]  # the fixture, imported for pytest

SHAPES = [(7,), (5, 9), (6, 5, 7), (3, 4, 5, 6), (70, 3, 5)]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("params", ["", "1=1.000000e-03"])
def test_batchnorm(tmp_path, engine_device, shape, params, precision):
    check_against_ncnn(tmp_path, engine_device, f"BatchNorm op 1 1 data out 0={shape[0]} {params}",
          {"data": shape}, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias_term", [0, 1])
def test_scale(tmp_path, engine_device, shape, bias_term, precision):
    check_against_ncnn(tmp_path, engine_device, f"Scale op 1 1 data out 0={shape[0]} 1={bias_term}",
          {"data": shape}, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scale_two_inputs(tmp_path, engine_device, shape, precision):
    check_against_ncnn(tmp_path, engine_device, "Scale op 2 1 data s out 0=-233",
          {"data": shape, "s": (shape[0],)}, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape, size", [((7,), 1), ((5, 9), 3), ((6, 5, 7), 6), ((3, 4, 5, 6), 3),
                                         ((4, 5, 6), 9)], ids=str)
def test_bias(tmp_path, engine_device, shape, size, precision):
    check_against_ncnn(tmp_path, engine_device, f"Bias op 1 1 data out 0={size}", {"data": shape}, precision)


# (shape, affine_size): every run length ncnn picks for each rank; runs shorter and longer
# than the work group of 64
LAST_DIMS = [((7,), 7), ((5, 9), 9), ((6, 5, 7), 7), ((6, 5, 7), 35), ((3, 4, 5, 6), 6),
             ((3, 4, 5, 6), 30), ((3, 4, 5, 6), 120), ((2, 300), 300)]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape, size", LAST_DIMS, ids=str)
@pytest.mark.parametrize("params", ["", "2=0", "1=0.5 2=1"])
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_last_dims_norm(tmp_path, engine_device, kind, shape, size, params, precision):
    check_against_ncnn(tmp_path, engine_device, f"{kind} op 1 1 data out 0={size} {params}", {"data": shape},
          precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape, group", [((6,), 3), ((6, 5), 2), ((6, 4, 5), 3), ((6, 2, 3, 5), 6),
                                          ((8, 3, 5), 1), ((4, 20, 9), 2)], ids=str)
@pytest.mark.parametrize("params", ["", "3=0", "2=0.5 3=1"])
def test_groupnorm(tmp_path, engine_device, shape, group, params, precision):
    check_against_ncnn(tmp_path, engine_device, f"GroupNorm op 1 1 data out 0={group} 1={shape[0]} {params}",
          {"data": shape}, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape", [(6, 4, 5), (3, 2, 3, 5), (2, 1, 3), (3, 17, 13)], ids=str)
@pytest.mark.parametrize("params", ["", "2=0", "1=0.5 2=1"])
def test_instancenorm(tmp_path, engine_device, shape, params, precision):
    check_against_ncnn(tmp_path, engine_device, f"InstanceNorm op 1 1 data out 0={shape[0]} {params}",
          {"data": shape}, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shape", [(7,), (5, 9), (6, 5, 7), (3, 4, 5, 6)], ids=str)
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_last_dims_norm_no_affine_size(tmp_path, engine_device, kind, shape, precision):
    """affine=0 with affine_size left at 0: 3-D blobs normalise h*w, 4-D ones d*h*w."""
    check_against_ncnn(tmp_path, engine_device, f"{kind} op 1 1 data out 2=0", {"data": shape}, precision)
