"""One-layer nets on the CPU engine (bf16 storage) checked against the ncnn package."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.params import param_text
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.models.graph import load_model


def check_against_ncnn(tmp_path: Path, line: str, shapes: dict[str, tuple[int, ...]],
                       rng: np.random.Generator) -> None:
    """Inputs of ``shapes`` (uniform in [-2, 2) from ``rng``), then ``line``, with seeded random
    weights: every output within the bf16 verify tolerance of ncnn's fp32 result."""
    param = tmp_path / "case.param"
    param.write_text(param_text(shapes, [line]))
    inputs = {n: rng.uniform(-2.0, 2.0, size=s).astype(np.float32) for n, s in shapes.items()}
    graph = load_model(param, None, shapes, seed=7)
    report = verify_cpu(graph, param, None, inputs)
    details = [(o.name, o.shape, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]
    assert report.ok, details
