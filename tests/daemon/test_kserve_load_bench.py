"""``benchmarks/kserve_load.py --smoke`` runs end to end: tritonclient (HTTP and gRPC) drives a
real daemon, checked against vkserve's own client first, so the benchmark cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def test_the_kserve_load_benchmark_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "kserve_load.py"), "--smoke",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["protocol"], r["concurrency"]) for r in rows} == {(p, c) for p in ("http", "grpc") for c in (1, 4)}
    for row in rows:
        assert row["errors"] == 0 and row["requests"] > 0, row
        assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert "| protocol | concurrency | req/s | p50 ms | p99 ms | errors |" in done.stdout
