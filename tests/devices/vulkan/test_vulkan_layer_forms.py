"""Every form of the shape / resampling layers and of the fused activations through a Vulkan
Plan against the ncnn package (``tests/support/layer_forms.py``'s cases, as the CPU test).

The resampling layers (Interp, Softmax, Pooling) run in fp32 and both fp16 modes; the fused
activations (whose convolutions are tested in every mode elsewhere) in fp32 and fp16
arithmetic; the pure copies (Crop, Permute, Padding, Flatten), exact in every mode, in fp32
and fp16 storage. Forms this engine cannot run are refused when the Plan is built.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.layer_forms import ALL, Case, case_id
from tests.support.vulkan_engine import MODES, check_against_ncnn, engine_device, graph_of
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan, PlanError

__all__ = ["engine_device"]  # the fixture, imported for pytest

PRECISIONS = {"interp": MODES, "softmax": MODES, "pooling": MODES,
              "activation": [Precision.FP32, Precision.FP16_ARITHMETIC]}
COPIES = [Precision.FP32, Precision.FP16_STORAGE]
RUNS = [(case, precision) for kind, cases in ALL.items() for case in cases
        for precision in PRECISIONS.get(kind, COPIES)]


@pytest.mark.parametrize("case,precision", RUNS,
                         ids=[f"{case_id(c)}-{p.value}" for c, p in RUNS])
def test_form_matches_ncnn(tmp_path: Path, engine_device: VulkanDevice, case: Case,
                           precision: Precision) -> None:
    line, shapes = case
    check_against_ncnn(tmp_path, engine_device, line, shapes, precision)


def test_reflect_as_wide_as_the_blob_is_refused(engine_device: VulkanDevice) -> None:
    """ncnn reads outside the blob there: refused, not a wrong answer."""
    graph = graph_of(["Padding op 1 1 data out 7=4 4=2"], {"data": (4, 5, 6)})
    with pytest.raises(PlanError, match="reflect padding as wide as the blob"):
        Plan(engine_device, graph, None, Precision.FP32)
