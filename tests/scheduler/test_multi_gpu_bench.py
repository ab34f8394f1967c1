"""``benchmarks/multi_gpu_throughput.py --smoke`` runs end to end (lavapipe + CPU, the digits
model, tiny counts), so the script the 2-GPU measurement needs cannot rot unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def test_the_multi_gpu_benchmark_smoke_run_measures_every_combination(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "multi_gpu_throughput.py"),
                           "--smoke", "--json", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    combos = {(r["devices"], r["batching"], r["concurrency"]) for r in rows}
    assert combos == {(d["label"], b, c) for d in result["device_sets"]
                      for b in ("off", "on") for c in (2, 8)}
    assert len(rows) == len(combos) == 8
    for row in rows:
        assert row["errors"] == {} and row["requests"] > 0 and row["req_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        if row["batching"] == "off":
            assert row["mean_batch"] == 1.0
    assert len(result["speedup"]) == 4
    # failover under load: the first GPU lost mid-run, every request still answered
    failover = result["failover"]
    assert failover["fault_fired"] and failover["errors"] == {} and failover["requests"] > 0, (
        json.dumps(failover))
    assert "| model | devices | batching | concurrency | req/s | p50 ms | p99 ms |" in done.stdout
