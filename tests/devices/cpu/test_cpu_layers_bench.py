"""``benchmarks/cpu_layers_vs_ncnn.py`` runs end to end (one run a layer kind), so the benchmark
behind RESULTS.md's single-layer tables cannot rot: layers of one kind are measured once and
counted, and a model without the types asked for is named."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.paths import REPO

SCRIPT = str(REPO / "benchmarks" / "cpu_layers_vs_ncnn.py")


def test_each_kind_of_layer_is_timed_once_on_both_engines_and_counted() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--model", "squeezenet", "--limit", "3", "--rounds", "1",
                           "--repeat", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\S+)(?: \(x(\d+)\))? \| Convolution \| (\S+) -> (\S+) \| ([\d.]+) \| ([\d.]+) \|",
                      done.stdout, re.M)
    # squeezenet's first layers: conv1, fire2's squeeze, then its expand1x1, which fire3's repeats
    assert [(name, count, shape_in) for name, count, shape_in, *_ in rows] == [
        ("conv1", "", "3x227x227"), ("fire2/squeeze1x1", "", "64x56x56"), ("fire2/expand1x1", "2", "16x56x56")
    ], done.stdout
    assert all(float(ours) > 0 and float(theirs) > 0 for *_, ours, theirs in rows), done.stdout


def test_a_model_without_those_layers_is_named() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--model", "squeezenet", "--types", "LSTM"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "squeezenet.param has no layer of the types LSTM" in done.stderr, done.stderr
