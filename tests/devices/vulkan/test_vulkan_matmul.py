"""Gemm and MatMul through a Vulkan Plan against the ncnn package, in fp32 and the fp16 modes.
MatMul: 1-D to 4-D operands with broadcast batch axes, with and without transB. Gemm:
A / B / C as inputs or weights, transA / transB, alpha / beta, every C broadcast,
output_N1M / output_transpose, 1-D and (c, 1, w) operands, and the lines pnnx writes for
Linear layers (vit_tiny, convnext_tiny). The output must match ncnn's within 1e-4 of the
reference's max abs in fp32 and 2e-2 in the fp16 modes.
"""

from __future__ import annotations

import pytest

from tests.devices.cpu.test_cpu_matmul import GEMM_CASES, MATMUL_CASES, PNNX_GEMM
from tests.support.vulkan_engine import MODES, check_against_ncnn, engine_device

__all__ = ["engine_device"]  # the fixture, imported for pytest


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("line, shapes", GEMM_CASES,
                         ids=[c[0][8:] + str(list(c[1].values())) for c in GEMM_CASES])
def test_gemm(tmp_path, engine_device, line, shapes, precision):
    check_against_ncnn(tmp_path, engine_device, line, shapes, precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("m, n, k", PNNX_GEMM, ids=str)
def test_gemm_pnnx_linear(tmp_path, engine_device, m, n, k, precision):
    check_against_ncnn(tmp_path, engine_device,
          f"Gemm gemm_0 1 1 a out 10=4 2=0 3=1 4=0 5=1 6=1 7={m} 8={n} 9={k}", {"a": (m, k)},
          precision)


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("line, shapes", MATMUL_CASES,
                         ids=[c[0][10:] + str(list(c[1].values())) for c in MATMUL_CASES])
def test_matmul(tmp_path, engine_device, line, shapes, precision):
    check_against_ncnn(tmp_path, engine_device, line, shapes, precision)
