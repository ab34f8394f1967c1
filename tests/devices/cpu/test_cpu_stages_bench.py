"""``benchmarks/cpu_stages_vs_ncnn.py`` runs end to end (one run a stage), so the benchmark
behind RESULTS.md's per-stage tables cannot rot; a blob the model lacks is named."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.paths import REPO

SCRIPT = str(REPO / "benchmarks" / "cpu_stages_vs_ncnn.py")


def test_the_stage_benchmark_times_every_stage_on_both_engines() -> None:
    stages = ["conv1_conv1_relu", "res2b_res2b_relu", "fc1000"]
    done = subprocess.run([sys.executable, SCRIPT, "--model", "resnet18", "--stages", ",".join(stages),
                           "--runs", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\S+) \| (-?[\d.]+) \| ([\d.]+) \| (\S+) \|$", done.stdout, re.M)
    assert [r[0] for r in rows] == stages, done.stdout
    assert all(float(ours) > 0 for _, _, ours, _ in rows), done.stdout


def test_a_blob_the_model_lacks_is_named() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--model", "squeezenet", "--stages", "pool1,nowhere",
                           "--runs", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "squeezenet has no blob nowhere" in done.stderr, done.stderr[-2000:]
