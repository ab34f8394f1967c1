"""The shape layers pnnx exports write (Reshape with a shape expression, Squeeze, ExpandDims,
MemoryData, numpy-style Crop) on both engines against the ncnn package.

Each case is a small net built from .param text: Input layers, a ReLU in front (so the layer
under test reads a computed blob, not the staged input), the layer under test and sometimes a
BinaryOp after it; its output blob is ``out``. The models package's seeded random weights are
written to a .bin for ncnn. The output's shape must be ncnn's and its values within the
engine's tolerance: the bf16 CPU engine by the verify metrics, Vulkan within 1e-5 (fp32) or
2e-2 (fp16 modes) of the reference's max abs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.params import param_text
from tests.support.paths import PNNX_DIR
from tests.support.vulkan_engine import MODES, engine_device
from vkserve.devices.capabilities import Precision
from vkserve.devices.cpu.executor import Plan as CpuPlan
from vkserve.devices.reference import compare, run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph, load_model
from vkserve.models.weights import write_bin

__all__ = ["engine_device"]  # the fixture, imported for pytest

PRE = "ReLU pre 1 1 data x 0=0.1"

CASES: dict[str, tuple[list[str], dict[str, tuple[int, ...]]]] = {
    # Reshape with a shape expression (pnnx: 6="0w,-1", 6="0w,1h,1c" with a reference blob)
    "reshape-0w-m1": ([PRE, 'Reshape op 1 1 x out 6="0w,-1"'], {"data": (3, 4, 5)}),
    "reshape-m1": ([PRE, 'Reshape op 1 1 x out 6="-1"'], {"data": (3, 4, 5)}),
    "reshape-reverse": ([PRE, 'Reshape op 1 1 x out 6="0c,0h,0w"'], {"data": (3, 4, 5)}),
    "reshape-mul": ([PRE, 'Reshape op 1 1 x out 6="*(0w,0h),0c"'], {"data": (3, 4, 5)}),
    "reshape-floordiv": ([PRE, 'Reshape op 1 1 x out 6="//(0c,1),-1,2"'], {"data": (3, 4, 5)}),
    "reshape-truediv": ([PRE, 'Reshape op 1 1 x out 6="/(0w,2),-1"'], {"data": (3, 4, 5)}),
    "reshape-add-sub": ([PRE, 'Reshape op 1 1 x out 6="+(0w,1),-(0h,1),-1"'], {"data": (4, 3, 5)}),
    "reshape-keep-0": ([PRE, 'Reshape op 1 1 x out 6="0w,0,-1"'], {"data": (3, 4, 5)}),
    "reshape-4d": ([PRE, 'Reshape op 1 1 x out 6="0w,2,//(0h,2),0c"'], {"data": (3, 4, 5)}),
    "reshape-max": ([PRE, 'Reshape op 1 1 x out 6="max(0w,2),-1"'], {"data": (3, 4, 5)}),
    "reshape-batch-n": ([PRE, 'Reshape op 1 1 x out 6="1,1,//(60,0n),0n"'], {"data": (3, 4, 5)}),
    "reshape-ref-blob": ([PRE, 'Reshape op 2 1 x ref out 6="0w,1h,1c"'],
                         {"data": (12, 5), "ref": (2, 6, 3)}),
    "reshape-from-4d": ([PRE, 'Reshape op 1 1 x out 6="0w,-1"'], {"data": (2, 3, 4, 5)}),
    # batch reshapes (12 / 13 batch axes, as pnnx writes after global pooling), batch of 1
    "reshape-batch-pnnx": ([PRE, 'Reshape op 1 1 x out 12=0 13=0 6="1,1,//(60,0n),0n"'],
                           {"data": (60,)}),
    "reshape-batch-pnnx-3d": ([PRE, 'Reshape op 1 1 x out 12=0 13=0 6="1,1,//(60,0n),0n"'],
                              {"data": (3, 4, 5)}),
    "reshape-batch-axis-1": ([PRE, 'Reshape op 1 1 x out 12=1 13=0 6="-1,0,0n"'], {"data": (3, 4, 5)}),
    "reshape-batch-in-only": ([PRE, 'Reshape op 1 1 x out 12=0 6="-1,0n"'], {"data": (3, 4, 5)}),
    "reshape-batch-out-only": ([PRE, 'Reshape op 1 1 x out 13=0 6="-1,0n"'], {"data": (3, 4, 5)}),
    "reshape-batch-params": ([PRE, "Reshape op 1 1 x out 12=0 13=0 0=-1 1=1 2=1"], {"data": (3, 4, 5)}),
    # Squeeze: flags and axes
    "squeeze-c": ([PRE, "Squeeze op 1 1 x out 2=1"], {"data": (1, 4, 5)}),
    "squeeze-hw": ([PRE, "Squeeze op 1 1 x out 0=1 1=1"], {"data": (6, 1, 1)}),
    "squeeze-flag-not-1": ([PRE, "Squeeze op 1 1 x out 0=1 1=1"], {"data": (6, 3, 1)}),
    "squeeze-axes": ([PRE, "Squeeze op 1 1 x out -23303=1,0"], {"data": (1, 7, 5)}),
    "squeeze-axes-neg": ([PRE, "Squeeze op 1 1 x out -23303=2,-1,1"], {"data": (4, 1, 1)}),
    "squeeze-4d-d": ([PRE, "Squeeze op 1 1 x out -23303=1,1"], {"data": (3, 1, 4, 5)}),
    "squeeze-2d-all": ([PRE, "Squeeze op 1 1 x out 0=1 1=1"], {"data": (1, 1)}),
    "squeeze-axis-not-1": ([PRE, "Squeeze op 1 1 x out -23303=1,1"], {"data": (2, 3, 4)}),
    # ExpandDims: axes of the output
    "expand-1d-0": ([PRE, "ExpandDims op 1 1 x out -23303=1,0"], {"data": (7,)}),
    "expand-1d-1": ([PRE, "ExpandDims op 1 1 x out -23303=1,1"], {"data": (7,)}),
    "expand-1d-two": ([PRE, "ExpandDims op 1 1 x out -23303=2,0,2"], {"data": (7,)}),
    "expand-2d-neg": ([PRE, "ExpandDims op 1 1 x out -23303=1,-1"], {"data": (3, 5)}),
    "expand-3d-d": ([PRE, "ExpandDims op 1 1 x out -23303=1,1"], {"data": (3, 4, 5)}),
    "expand-2d-c": ([PRE, "ExpandDims op 1 1 x out -23303=1,0"], {"data": (4, 5)}),
    # MemoryData: raw (load_type 1, default) and flagged (0) weights, 1-D to 4-D
    "memorydata-3d": (["MemoryData md 0 1 m 0=5 1=4 2=3", PRE, "BinaryOp add 2 1 x m out 0=0"],
                      {"data": (3, 4, 5)}),
    "memorydata-vit": (["MemoryData md 0 1 m 0=6 1=1", PRE, "Concat cat 2 1 m x out 0=0"],
                       {"data": (4, 6)}),
    "memorydata-flagged": (["MemoryData md 0 1 m 0=7 21=0", PRE, "BinaryOp add 2 1 x m out 0=2"],
                           {"data": (7,)}),
    "memorydata-4d": (["MemoryData md 0 1 m 0=3 1=2 11=2 2=2", PRE,
                       "BinaryOp add 2 1 x m out 0=0"], {"data": (2, 2, 2, 3)}),
    "memorydata-channel": (["MemoryData md 0 1 m 0=1 1=1 2=3", PRE,
                            "BinaryOp add 2 1 x m out 0=0"], {"data": (3, 4, 5)}),
    "memorydata-alone": (["MemoryData out_md 0 1 out 0=5 1=2"], {}),
    # Crop in the numpy starts/ends/axes form pnnx writes
    "crop-pnnx-axis0": ([PRE, "Crop op 1 1 x out -23310=1,1 -23311=1,0 -23309=1,0"],
                        {"data": (5, 4, 3)}),
    "crop-pnnx-hw": ([PRE, "Crop op 1 1 x out -23309=2,1,0 -23310=2,-1,3 -23311=2,1,2"],
                     {"data": (3, 6, 7)}),
    "crop-pnnx-open-end": ([PRE, "Crop op 1 1 x out -23309=1,2 -23310=1,2147483647 -23311=1,-1"],
                           {"data": (3, 4, 9)}),
}


def build(tmp_path: Path, case: str) -> tuple[Graph, Path, Path, dict[str, np.ndarray]]:
    lines, shapes = CASES[case]
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text(param_text(shapes, lines))
    graph = load_model(param, None, dict(shapes), seed=7)
    write_bin(graph.layers, bin_path)
    rng = np.random.default_rng(5)
    feed = {name: rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
            for name, shape in shapes.items()}
    return graph, param, bin_path, feed


def reference(param: Path, bin_path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    return run_ncnn(param, bin_path, feed, ["out"])["out"]


@pytest.mark.parametrize("case", list(CASES))
def test_cpu_engine_matches_ncnn(tmp_path: Path, case: str) -> None:
    graph, param, bin_path, feed = build(tmp_path, case)
    want = reference(param, bin_path, feed)
    assert graph.blob_shapes["out"] == want.shape
    got = CpuPlan(graph, outputs=["out"]).run(feed)["out"]
    assert got.shape == want.shape
    report = compare("out", got, want)
    assert report.ok, report


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", list(CASES))
def test_vulkan_engine_matches_ncnn(tmp_path: Path, engine_device: VulkanDevice, case: str,
                                    precision: Precision) -> None:
    graph, param, bin_path, feed = build(tmp_path, case)
    want = reference(param, bin_path, feed)
    with Plan(engine_device, graph, None, precision, outputs=["out"]) as plan:
        got = plan.run(feed)["out"]
    assert got.shape == want.shape
    tol = 1e-5 if precision is Precision.FP32 else 2e-2
    scale = max(float(np.abs(want).max()), 1e-6)
    assert float(np.max(np.abs(got - want))) <= tol * scale, case


def test_pnnx_exports_get_past_reshape_expressions() -> None:
    """No pnnx export is refused for its shape expressions any more (other layers may still
    be missing: those errors name the file, line and layer)."""
    for param in sorted(PNNX_DIR.glob("*.param")):
        try:
            load_model(param, None)
        except ModelFormatError as e:
            assert "shape expression" not in str(e), str(e)
            assert param.name in str(e) and " line " in str(e) and "layer '" in str(e), str(e)
