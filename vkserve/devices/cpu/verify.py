"""`vkserve verify` on the CPU engine: its outputs against the ncnn package (CPU, fp32) on the
same input and weights, under the bf16 tolerance, which `vkserve verify` judges against ncnn's
own bf16 storage path (vkserve.devices.reference)."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from vkserve.devices.cpu.executor import Plan
from vkserve.devices.progress import Progress
from vkserve.devices.reference import VerifyReport, random_inputs, verify_outputs
from vkserve.models.graph import Graph


def verify_cpu(
    graph: Graph,
    param_path: str | os.PathLike[str],
    bin_path: str | os.PathLike[str] | None,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    *,
    reduced: bool = False,
    progress: Progress | None = None,
) -> VerifyReport:
    """Run ``graph`` on the CPU engine and through ncnn (seeded inputs when ``inputs`` is None;
    ``bin_path`` None: the graph's own weights); ``reduced``: judge against ncnn's bf16 run
    too (`verify_outputs`); ``progress`` hears of each stage."""
    if inputs is None:
        inputs = random_inputs({n: graph.blob_shapes[n] for n in graph.input_names}, seed)
    feed = inputs

    def run(names: list[str]) -> tuple[dict[str, np.ndarray], str, str]:
        if progress is not None:
            progress.stage("running the CPU engine")
        plan = Plan(graph, {n: a.shape for n, a in feed.items()}, outputs=names)
        return plan.run(feed), "cpu", "bf16"

    return verify_outputs(graph, param_path, bin_path, inputs, "bf16", run, reduced=reduced,
                          progress=progress)
