"""`vkserve verify` on a Vulkan device: the Plan's outputs against the ncnn package (CPU,
fp32) on the same input and weights, under the tolerance of the precision asked for (fp32 or
fp16); `vkserve verify` judges fp16 against ncnn's own fp16 run (its Vulkan path on the same
device, else its CPU fp16 storage; vkserve.devices.reference)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from vkserve.devices.reference import VerifyReport, verify_outputs
from vkserve.devices.vulkan.engine import load_plan
from vkserve.models.graph import Graph


def verify_vulkan(graph: Graph, param_path: str | os.PathLike[str],
                  bin_path: str | os.PathLike[str] | None, inputs: Mapping[str, np.ndarray],
                  device_index: int, precision: str, cache_dir: Path | None = None, *,
                  reduced: bool = False) -> VerifyReport:
    """Run ``graph`` on Vulkan device ``device_index`` and through ncnn; ``reduced``: judge fp16
    against ncnn's fp16 run too (`verify_outputs`)."""

    def run(names: list[str]) -> tuple[dict[str, np.ndarray], str, str]:
        with load_plan(graph, device_index, precision, {n: a.shape for n, a in inputs.items()},
                       names, cache_dir) as loaded:
            return (loaded.plan.run(inputs), f"vulkan:{device_index} ({loaded.device.caps.name})",
                    loaded.plan.precision.value)

    return verify_outputs(graph, param_path, bin_path, inputs, precision, run, reduced=reduced,
                          vulkan_device=device_index)
