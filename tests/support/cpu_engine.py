"""One-layer nets on the CPU engine (bf16 storage) checked against the ncnn package."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np

from tests.support.params import param_text
from vkserve.devices.cpu import jit, threads
from vkserve.devices.cpu.executor import Plan
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


#: (threads, tasks a kernel splits its work into; None: its own choice)
SPLITS = ((1, None), (2, None), (2, 1), (2, 7), (2, 5000))


def outputs_on_splits(plan: Plan, inputs: dict[str, np.ndarray], output: str) -> list[np.ndarray]:
    """``plan``'s ``output`` run under each of ``SPLITS`` (``threads.THREADS`` and
    ``jit.task_count`` patched): a kernel whose results depend on its split gives different
    bits."""
    saved = threads.THREADS
    outs = []
    try:
        for n, tasks in SPLITS:
            threads.THREADS = n
            with mock.patch.object(jit, "task_count", (lambda units, t=tasks: min(units, t))
                                   if tasks else jit.task_count):
                outs.append(plan.run(inputs)[output])
    finally:
        threads.THREADS = saved
    return outs
