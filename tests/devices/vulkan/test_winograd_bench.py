"""``benchmarks/winograd_layers.py`` runs end to end on lavapipe (a two-layer net, one replay),
so the script behind Winograd's rule cannot rot unnoticed: every eligible layer is listed with
its shape, the kernel it runs otherwise and a time for each tile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

NET = """7767517
4 4
Input data 0 1 data 0=10 1=10 2=64
Convolution deep 1 1 data a 0=128 1=3 4=1 5=1 6=73728 9=1
Convolution wide 1 1 a b 0=16 1=5 4=2 5=1 6=51200
Convolution last 1 1 b out 0=8 1=3 4=1 5=1 6=1152
"""  # (wide: a 5x5 kernel, not eligible)


def test_the_winograd_benchmark_lists_every_eligible_layer(tmp_path: Path) -> None:
    (tmp_path / "tiny.param").write_text(NET)
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "winograd_layers.py"), "--models",
                           str(tmp_path), "--only", "tiny", "--precisions", "fp32", "--tiles", "2", "4",
                           "--runs", "1", "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    layers = {r["layer"]: r for r in rows}
    assert set(layers) == {"deep (Convolution)", "last (Convolution)", "(whole model, GPU)"}
    deep = layers["deep (Convolution)"]
    assert (deep["in"], deep["out"], deep["h"], deep["w"], deep["other"]) == (64, 128, 10, 10, "conv_gemm")
    assert deep["gemm"] == "gemm" and deep["other_ms"] > 0 and deep["F2_ms"] > 0 and deep["F4_ms"] > 0
    assert "| tiny | fp32 | deep (Convolution) | 64 -> 128, 10x10 | conv_gemm |" in done.stdout
