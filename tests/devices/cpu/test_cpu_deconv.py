"""Deconvolution and DeconvolutionDepthWise on the CPU engine against the ncnn package.

Each case is a one-layer .param with the models package's seeded random weights (written to a
.bin for ncnn); the bf16 engine must meet the verify tolerance (cosine >= 0.999, max abs err
<= 2 % of the reference's max abs). Cases cover strides 1-3, dilation 1-2, symmetric and
asymmetric pads, output_pad, output_w / output_h with SAME_UPPER / SAME_LOWER, groups
(depthwise and 1 < group < channels), bias on / off and the fused activations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.deconv_cases import BAD_CASES, CASES, deconv_line
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model
from vkserve.models.layers import ShapeError

RNG = np.random.default_rng(2468)


def write_param(path: Path, shape: tuple[int, ...], line: str) -> None:
    path.write_text("7767517\n2 2\n" + "Input data 0 1 data\n" + line + "\n")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_deconv(tmp_path: Path, case) -> None:
    param = tmp_path / "case.param"
    write_param(param, case.shape, deconv_line(case))
    inputs = {"data": RNG.uniform(-2.0, 2.0, size=case.shape).astype(np.float32)}
    graph = load_model(param, None, {"data": case.shape}, seed=7)
    report = verify_cpu(graph, param, None, inputs)
    details = [(o.name, o.shape, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]
    assert report.ok, details


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.id)
def test_deconv_errors(tmp_path: Path, case) -> None:
    param = tmp_path / "case.param"
    write_param(param, case.shape, deconv_line(case))
    with pytest.raises((ShapeError, ModelFormatError)):
        load_model(param, None, {"data": case.shape}, seed=7)
