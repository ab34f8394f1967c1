"""The CPU kernels of the activation / element-wise math layers (TanH, AbsVal, ELU, SELU, Mish,
Softplus, GELU, Exp, Log, Power, Erf, Threshold, PReLU) against the ncnn package, 1-D to 4-D
blobs of awkward sizes, over their parameters; bf16 verify tolerance."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.devices.cpu.test_cpu_layers import check
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model

SHAPES = [(7,), (5, 3), (7, 5, 3), (3, 2, 5, 7)]

# (layer line, input range): Log and fractional Power need positive arguments
LINES = [
    ("TanH op 1 1 data out", (-3.0, 3.0)),
    ("AbsVal op 1 1 data out", (-3.0, 3.0)),
    ("ELU op 1 1 data out", (-3.0, 3.0)),
    ("ELU op 1 1 data out 0=1.000000e+00", (-3.0, 3.0)),
    ("SELU op 1 1 data out", (-3.0, 3.0)),
    ("SELU op 1 1 data out 0=1.500000e+00 1=2.000000e+00", (-3.0, 3.0)),
    ("Mish op 1 1 data out", (-4.0, 4.0)),
    ("Softplus op 1 1 data out", (-4.0, 4.0)),
    ("GELU op 1 1 data out", (-3.0, 3.0)),
    ("GELU op 1 1 data out 0=1", (-3.0, 3.0)),
    ("Exp op 1 1 data out", (-2.0, 2.0)),
    ("Exp op 1 1 data out 0=2.000000e+00 1=5.000000e-01 2=2.500000e-01", (-2.0, 2.0)),
    ("Exp op 1 1 data out 1=-1.500000e+00 2=1.000000e+00", (-2.0, 2.0)),
    ("Log op 1 1 data out", (0.1, 3.0)),
    ("Log op 1 1 data out 0=1.000000e+01 1=2.000000e+00 2=5.000000e-01", (0.1, 3.0)),
    ("Log op 1 1 data out 1=-1.000000e+00 2=4.000000e+00", (0.1, 3.0)),
    ("Power op 1 1 data out", (-3.0, 3.0)),
    ("Power op 1 1 data out 0=2.000000e+00 1=1.500000e+00 2=-5.000000e-01", (-3.0, 3.0)),
    ("Power op 1 1 data out 0=3.000000e+00", (-2.0, 2.0)),
    ("Power op 1 1 data out 0=5.000000e-01 1=2.000000e+00 2=1.000000e+00", (0.0, 3.0)),
    ("Power op 1 1 data out 0=-1.500000e+00 2=1.000000e+00", (0.5, 3.0)),
    ("Erf op 1 1 data out", (-3.0, 3.0)),
    ("Threshold op 1 1 data out", (-3.0, 3.0)),
    ("Threshold op 1 1 data out 0=5.000000e-01", (-3.0, 3.0)),
]


def _rand(shape: tuple[int, ...], lo: float, hi: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", LINES, ids=lambda c: c[0].replace(" op 1 1 data out", ""))
def test_activation(tmp_path: Path, case: tuple[str, tuple[float, float]],
                    shape: tuple[int, ...]) -> None:
    line, (lo, hi) = case
    check(tmp_path, [line], {"data": _rand(shape, lo, hi, len(shape))})


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("per_channel", [False, True])
def test_prelu(tmp_path: Path, shape: tuple[int, ...], per_channel: bool) -> None:
    n = shape[0] if per_channel else 1
    check(tmp_path, [f"PReLU op 1 1 data out 0={n}"], {"data": _rand(shape, -3.0, 3.0, 5)})


EDGE_VALUES = np.array([-100.0, -20.0, -5.0, -1e-6, -0.0, 0.0, 1e-6, 5.0, 20.0, 88.0],
                       np.float32)
EDGE = [
    # (layer line, input): large magnitudes (overflowing exp inside), signed zeros, tiny values
    *((f"{t} op 1 1 data out", EDGE_VALUES) for t in
      ("TanH", "AbsVal", "ELU", "SELU", "Mish", "Softplus", "GELU", "Erf", "Threshold")),
    ("GELU op 1 1 data out 0=1", EDGE_VALUES),
    # powf's cases: negative bases with integral exponents, 0 ^ 0
    ("Exp op 1 1 data out 0=-2.000000e+00", np.arange(-3, 4, dtype=np.float32)),
    ("Power op 1 1 data out 0=3.000000e+00", np.arange(-3, 4, dtype=np.float32)),
    ("Power op 1 1 data out 0=-2.000000e+00", np.array([-3, -2, -1, 1, 2, 3], np.float32)),
    ("Power op 1 1 data out 0=0.000000e+00", np.array([-2, -0.0, 0, 2], np.float32)),
]


@pytest.mark.parametrize("case", EDGE, ids=lambda c: c[0].replace(" op 1 1 data out", ""))
def test_activation_edge_values(tmp_path: Path, case: tuple[str, np.ndarray]) -> None:
    line, x = case
    check(tmp_path, [line], {"data": x})


@pytest.mark.parametrize("line,message", [
    ("PReLU op 1 1 data out 0=4", "4 slopes but the input (3, 5, 7) has 3 channels"),
    ("PReLU op 1 1 data out", "param 0 (num_slope): must be at least 1"),
])
def test_prelu_bad_slope_count(tmp_path: Path, line: str, message: str) -> None:
    param = tmp_path / "case.param"
    param.write_text(f"7767517\n2 2\nInput data 0 1 data\n{line}\n")
    with pytest.raises(ModelFormatError, match=re.escape(message)):
        load_model(param, None, {"data": (3, 5, 7)}, seed=1)
