"""One Crop window (`CropParams.window`) for both engines, against the ncnn package, on the
forms where the engines' former copies of it disagreed: out* = 0 (ncnn: an empty crop, not
"to the end"), unset (-233) offsets (with a reference blob ncnn reads the window from the
reference's data: not a centre crop), negative sizes, the reference-input form, and
numpy-style starts without axes.

Inputs are small integers, exact in bf16 and fp16, so a crop (a copy) must match ncnn
exactly on the CPU engine (bf16 storage) and on the Vulkan engine (fp32).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import vkserve.devices.vulkan.layers.misc  # noqa: F401 (registers VulkanCrop)
from tests.support.vulkan_engine import engine_device
from vkserve.devices.capabilities import Precision
from vkserve.devices.cpu.executor import Plan as CpuPlan
from vkserve.devices.cpu.kernels import REGISTRY
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.devices.vulkan.layers.base import VULKAN_LAYERS
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model, parse_param_text
from vkserve.models.layers import ShapeError

__all__ = ["engine_device"]  # the fixture, imported for pytest

X = (6, 5, 7)

# id: (params, input shape, reference shape or None, expected (offsets, sizes)) -- ncnn's answer
ACCEPTED = {
    "out-unset-is-to-the-end": ("0=1 3=-233 4=-233 5=-233", X, None, ((0, 0, 1), (6, 5, 6))),
    "out-mixed": ("0=1 1=1 2=2 3=3 4=-233 5=2", X, None, ((2, 1, 1), (2, 4, 3))),
    "out-capped-by-the-input": ("0=1 3=100 4=-233 5=-233", X, None, ((0, 0, 1), (6, 5, 6))),
    "offset2-with-unset-out": ("0=1 6=1 3=-233 4=-233 5=-233", X, None, ((0, 0, 1), (6, 5, 5))),
    "2d-out-unset": ("0=2 1=1 3=-233 4=3", (5, 7), None, ((1, 2), (3, 5))),
    "reference": ("0=1 1=2", X, (3, 2, 4), ((0, 2, 1), (3, 2, 4))),
    "reference-of-lower-rank": ("0=1 1=2", X, (2, 4), ((0, 2, 1), (6, 2, 4))),
    "reference-channels": ("2=1", X, (2, 5, 7), ((1, 0, 0), (2, 5, 7))),
    "reference-default-offsets": ("0=0", X, (3, 2, 4), ((0, 0, 0), (3, 2, 4))),
    "numpy-end-zero-is-the-end": ("-23309=1,1 -23310=1,0 -23311=1,2", X, None, ((0, 0, 1), (6, 5, 6))),
    "numpy-negative-start": ("-23309=1,-3 -23310=1,-1 -23311=1,0", X, None, ((3, 0, 0), (2, 5, 7))),
    "numpy-every-axis": ("-23309=3,1,2,3 -23310=3,4,5,6", X, None, ((1, 2, 3), (3, 3, 3))),
}

# id: (params, input shape, reference shape or None, what ncnn does)
REFUSED = {
    "out-zero": ("0=1 3=0 4=-233 5=-233", X, None, "fails"),
    "out-zero-by-default": ("0=1 3=3", X, None, "fails"),
    "out-negative": ("0=1 3=-1 4=-233 5=-233", X, None, "fails"),
    "out-negative-2d": ("0=1 3=-2 4=-1", (5, 7), None, "fails"),
    "offset2-only": ("6=1 7=1 8=1", X, None, "fails"),
    # ncnn reads the window (woffset, hoffset, coffset, outw, outh, outc) from the reference
    # blob's data: data-dependent (here all zeros, so an empty crop)
    "reference-woffset-unset": ("0=-233", X, (3, 2, 4), "fails"),
    # ncnn takes -233 as the offset and reads outside the input: undefined, not run here
    "offset-unset": ("0=-233 3=3 4=-233 5=-233", X, None, "undefined"),
    "reference-hoffset-unset": ("1=-233", X, (3, 2, 4), "undefined"),
    "reference-coffset-unset": ("2=-233", X, (3, 2, 4), "undefined"),
    # starts/ends for one axis but no axes: ncnn takes every axis and reads past the arrays, so
    # its result depends on memory it never set (it fails in some runs, not all): undefined
    "numpy-without-axes-too-few": ("-23309=1,2 -23310=1,5", X, None, "undefined"),
}


def param_text(params: str, shape: tuple[int, ...], reference: tuple[int, ...] | None) -> str:
    inputs = ["x"] + (["r"] if reference else [])
    lines = [f"Input {n} 0 1 {n}" for n in inputs]
    lines.append(f"Crop crop {len(inputs)} 1 {' '.join(inputs)} out {params}")
    return f"7767517\n{len(lines)} {len(inputs) + 1}\n" + "\n".join(lines) + "\n"


def feed(shape: tuple[int, ...], reference: tuple[int, ...] | None) -> dict[str, np.ndarray]:
    x = {"x": np.arange(1, np.prod(shape) + 1, dtype=np.float32).reshape(shape)}
    return x | ({"r": np.zeros(reference, np.float32)} if reference else {})


def ncnn_crop(tmp_path: Path, params: str, shape: tuple[int, ...],
              reference: tuple[int, ...] | None) -> np.ndarray:
    (tmp_path / "crop.param").write_text(param_text(params, shape, reference))
    (tmp_path / "crop.bin").write_bytes(b"")
    return run_ncnn(tmp_path / "crop.param", tmp_path / "crop.bin", feed(shape, reference),
                    ["out"])["out"]


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_both_engines_crop_as_ncnn(tmp_path: Path, engine_device: VulkanDevice, case: str) -> None:
    params, shape, reference, (offsets, sizes) = ACCEPTED[case]
    inputs = feed(shape, reference)
    want = inputs["x"][tuple(slice(o, o + n) for o, n in zip(offsets, sizes))]
    np.testing.assert_array_equal(ncnn_crop(tmp_path, params, shape, reference), want)
    shapes = {n: a.shape for n, a in inputs.items()}
    graph = load_model(tmp_path / "crop.param", None, shapes)
    assert graph.layers[-1].params.window(shape, reference) == (offsets, sizes)
    np.testing.assert_array_equal(CpuPlan(graph).run(inputs)["out"], want)
    with Plan(engine_device, graph, None, Precision.FP32) as plan:
        np.testing.assert_array_equal(plan.run(inputs)["out"], want)


@pytest.mark.parametrize("case", list(REFUSED))
def test_both_engines_refuse_what_ncnn_cannot_crop(tmp_path: Path, case: str) -> None:
    params, shape, reference, ncnn = REFUSED[case]
    if ncnn == "fails":  # the extract fails (an empty crop) or gives a Mat of negative size
        with pytest.raises((RuntimeError, ValueError), match="extract failed|negative"):
            ncnn_crop(tmp_path, params, shape, reference)
    text = param_text(params, shape, reference)
    (tmp_path / "refused.param").write_text(text)
    shapes = {"x": shape} | ({"r": reference} if reference else {})
    with pytest.raises(ModelFormatError, match="shape inference"):
        load_model(tmp_path / "refused.param", None, shapes)
    layer = parse_param_text(text, "refused.param")[-1]
    in_shapes = [shape] + ([reference] if reference else [])
    with pytest.raises(ShapeError):
        REGISTRY["Crop"](layer, in_shapes)
    with pytest.raises(ShapeError):
        VULKAN_LAYERS["Crop"](layer, in_shapes, [(1,)], Precision.FP32)
