"""`vkserve profile --device cpu`: each CPU Plan step's wall time, summed per layer type."""

from __future__ import annotations

import json
import subprocess

import numpy as np

from tests.support.daemon import vkserve_cmd
from tests.support.paths import REPO
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.reference import random_inputs
from vkserve.models.graph import load_model

DIGITS = REPO / "vkserve" / "examples" / "digits"


def vk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(vkserve_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=300)


def test_profile_on_the_cpu_lists_every_step_and_the_fused_activations() -> None:
    p = vk("profile", str(DIGITS), "--device", "cpu", "--threads", "1", "--runs", "3", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert (report["device"], report["precision"], report["threads"]) == ("cpu", "bf16", 1)
    steps = {s["name"]: s for s in report["steps"]}
    # the .param's layers, less Input (an alias) and the ReLUs run in their producers' epilogues
    assert list(steps) == ["conv1", "pool1", "fc1", "fc2", "prob"]
    assert steps["conv1"]["fused"] == ["relu1"] and steps["conv1"]["type"] == "Convolution"
    assert all(s["ms"] > 0 for s in steps.values())
    by_type = {t["type"]: t for t in report["by_type"]}
    assert by_type["InnerProduct"]["steps"] == 2
    assert abs(sum(t["ms"] for t in by_type.values()) - report["step_ms"]) < 1e-3


def test_profile_text_names_the_thread_count_and_the_slowest_steps() -> None:
    p = vk("profile", str(DIGITS), "--device", "cpu", "--threads", "2", "--runs", "2", "--top", "2")
    assert p.returncode == 0, p.stderr
    assert "2 threads (cpu.threads)" in p.stdout and "by layer type:" in p.stdout
    slowest = p.stdout.split("slowest 2 steps:")[1].strip().splitlines()
    assert len(slowest) == 2


def test_profile_runs_are_the_plans_runs() -> None:
    """Profiling leaves the Plan as it was: a run after it gives the same bits as before."""
    graph = load_model(DIGITS / "model.param", DIGITS / "model.bin")
    plan = Plan(graph)
    inputs = random_inputs({n: plan.blob_shapes[n] for n in plan.input_names})
    before = plan.run(inputs)
    assert len(plan.profile(inputs, runs=2)) == 5
    after = plan.run(inputs)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
