"""`vkserve verify` on a Vulkan device: the Plan's outputs against the ncnn package (CPU,
fp32) on the same input and weights, under the tolerance of the precision asked for (fp32 or
fp16); `vkserve verify` judges fp16 against ncnn's own fp16 run (its Vulkan path on the same
device, else its CPU fp16 storage; vkserve.devices.reference)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from vkserve.devices.capabilities import DeviceKind
from vkserve.devices.names import device_name
from vkserve.devices.progress import Progress
from vkserve.devices.reference import VerifyReport, verify_outputs
from vkserve.devices.vulkan.engine import load_plan
from vkserve.models.graph import Graph


def verify_vulkan(graph: Graph, param_path: str | os.PathLike[str],
                  bin_path: str | os.PathLike[str] | None, inputs: Mapping[str, np.ndarray],
                  device_index: int, precision: str, cache_dir: Path | None = None, *,
                  reduced: bool = False, progress: Progress | None = None) -> VerifyReport:
    """Run ``graph`` on Vulkan device ``device_index`` and through ncnn; ``reduced``: judge fp16
    against ncnn's fp16 run too (`verify_outputs`); ``progress`` hears of each stage and of the
    Plan's pipelines."""
    name = device_name(DeviceKind.VULKAN, device_index)

    def run(names: list[str]) -> tuple[dict[str, np.ndarray], str, str]:
        if progress is not None:
            progress.stage(f"building the Vulkan Plan on {name}")
        with load_plan(graph, device_index, precision, {n: a.shape for n, a in inputs.items()},
                       names, cache_dir, progress) as loaded:
            if progress is not None:
                progress.stage(f"running the Plan on {name} ({loaded.device.caps.name})")
            return loaded.plan.run(inputs), name, loaded.plan.precision.value

    return verify_outputs(graph, param_path, bin_path, inputs, precision, run, reduced=reduced,
                          vulkan_device=device_index, progress=progress)
