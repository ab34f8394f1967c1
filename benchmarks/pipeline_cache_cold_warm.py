"""Cold vs warm time to create every built-in pipeline, per Vulkan device.

    python benchmarks/pipeline_cache_cold_warm.py [--runs N] [--json OUT]

Each measurement is a fresh process running `vkserve cache warm` (every built-in shader in
every precision the device supports): cold with an empty cache folder, warm with the file
the cold run saved. The time is the whole warm-up (`seconds` in its JSON), not process start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# NVIDIA keeps its own shader disk cache; off, so that cold means cold.
os.environ.setdefault("__GL_SHADER_DISK_CACHE", "0")

ROOT = Path(__file__).resolve().parent.parent


def warm(cache_dir: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "vkserve", "cache", "warm", "--cache-dir",
                          cache_dir, "--json"], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    return [r for r in json.loads(out.stdout) if r["device"] != "cpu"]  # the GPUs' pipelines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="cold/warm pairs (median reported)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    pairs: dict[str, list[tuple[dict, dict]]] = {}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            for cold, hot in zip(warm(d), warm(d)):
                pairs.setdefault(cold["device"], []).append((cold, hot))
    rows = []
    for device, runs in pairs.items():
        cold_s = statistics.median(c["seconds"] for c, _ in runs)
        warm_s = statistics.median(h["seconds"] for _, h in runs)
        c, h = runs[-1]
        rows.append({"device": device, "name": c["device_name"], "pipelines": c["pipelines"],
                     "cold_seconds": cold_s, "warm_seconds": warm_s,
                     "cold_glsl_compiles": c["glsl_compiles"],
                     "warm_glsl_compiles": h["glsl_compiles"],
                     "driver_blob_bytes": h["driver_blob_bytes"],
                     "warm_over_cold": round(warm_s / cold_s, 3)})
    for r in rows:
        print(f"{r['device']} ({r['name']}): {r['pipelines']} pipelines; cold "
              f"{r['cold_seconds']:.3f} s ({r['cold_glsl_compiles']} GLSL compiles), warm "
              f"{r['warm_seconds']:.3f} s ({r['warm_glsl_compiles']} compiles, driver blob "
              f"{r['driver_blob_bytes']} bytes): warm/cold = {r['warm_over_cold']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
