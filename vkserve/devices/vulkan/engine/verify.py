"""`vkserve verify` on a Vulkan device: the Plan's outputs against the ncnn package (CPU,
fp32) on the same input and weights.

Tolerances (issue 5): fp32 cosine >= 0.9999 and max abs error <= 0.5 % of the reference's max
abs; fp16 cosine >= 0.999 and <= 2 %. Detection outputs are compared by box matching as on
the CPU engine (vkserve.devices.cpu.reference); the tensors feeding a final detection or Softmax
layer are compared too (`tensors_to_compare`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from vkserve.devices.cpu.reference import (
    OutputReport,
    VerifyReport,
    compare,
    compare_detections,
    run_ncnn,
    tensors_to_compare,
    write_bin,
)
from vkserve.devices.vulkan.engine import load_plan
from vkserve.models.graph import Graph

TOLERANCE = {"fp32": (0.9999, 0.005), "fp16": (0.999, 0.02)}  # (cosine min, max abs err / ref)


def judge(report: OutputReport, precision: str) -> OutputReport:
    """Re-decide `ok` of a tensor comparison with the Vulkan tolerance of `precision`."""
    cosine_min, rel_max = TOLERANCE[precision]
    if report.cosine is not None and report.max_abs_err is not None:
        report.ok = bool(report.cosine >= cosine_min
                         and report.max_abs_err <= rel_max * (report.ref_max_abs or 0.0))
    return report


def verify_vulkan(graph: Graph, param_path: str | os.PathLike[str],
                  bin_path: str | os.PathLike[str] | None, inputs: Mapping[str, np.ndarray],
                  device_index: int, precision: str, cache_dir: Path | None = None) -> VerifyReport:
    names, det_outputs = tensors_to_compare(graph)
    with load_plan(graph, device_index, precision, {n: a.shape for n, a in inputs.items()},
                   names, cache_dir) as loaded:
        ours = loaded.plan.run(inputs)
        device = f"vulkan:{device_index} ({loaded.device.caps.name})"
        mode = loaded.plan.precision.value
    with tempfile.TemporaryDirectory(prefix="vkserve-verify-") as tmp:
        if bin_path is None:
            bin_path = os.path.join(tmp, "model.bin")
            write_bin(graph, bin_path)
        ref = run_ncnn(param_path, bin_path, inputs, names)
    reports = [compare_detections(n, ours[n], ref[n]) if n in det_outputs
               else judge(compare(n, ours[n], ref[n]), precision) for n in names]
    return VerifyReport(model=os.path.basename(os.fspath(param_path)), device=device,
                        precision=mode, ok=all(r.ok for r in reports), outputs=reports)
