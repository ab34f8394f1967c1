"""Daemon throughput of one model on one GPU against all GPUs, in one run.

    python benchmarks/multi_gpu_throughput.py [--model resnet50] [--models DIR]
        [--concurrency 8,32] [--json OUT]

For each device set (first GPU only, then every GPU) it starts `vkserve serve` with the model
(seeded random weights, fp16) restricted to those devices, drives it with `vkserve bench`'s
load generator at each concurrency until stable, and reports requests per second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon_harness import start_daemon  # noqa: E402
from vkserve.client import TrioClient  # noqa: E402
from vkserve.client.loadgen import BenchSettings, sweep  # noqa: E402


def repository(tmp: Path, param: Path, devices: str) -> Path:
    folder = tmp / "models" / param.stem
    folder.mkdir(parents=True)
    shutil.copy(param, folder / "model.param")
    (folder / "config.toml").write_text(
        f"random_weights = true\nprecision = \"fp16\"\ndevices = {devices}\n"
        "cpu_fallback = false\nwarmup = 2\nqueue_limit = 1024\n")
    return tmp / "models"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--models", type=Path, default=ROOT / "tests" / "data" / "models")
    ap.add_argument("--concurrency", default="8,32")
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from vkserve.devices.discovery import discover_devices
    from vkserve.models.graph import load_model

    gpus = [d.index for d in discover_devices() if d.kind.value == "vulkan"]
    param = args.models / f"{args.model}.param"
    graph = load_model(param, None)
    rng = np.random.default_rng(0)
    inputs = {n: rng.uniform(-1, 1, graph.blob_shapes[n]).astype(np.float32)
              for n in graph.input_names}
    levels = [int(c) for c in args.concurrency.split(",")]
    runs = []
    for label, devices in (("1 GPU", f"[{gpus[0]}]"), (f"{len(gpus)} GPUs", '"gpu"')):
        with tempfile.TemporaryDirectory() as d:
            proc, sock = start_daemon(Path(d), repository(Path(d), param, devices))
            try:
                settings = BenchSettings(args.model, inputs, window_seconds=args.window,
                                         max_windows=8)
                results = trio.run(lambda: sweep(lambda: TrioClient.connect(f"unix:{sock}"),
                                                 settings, concurrencies=levels))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
        for r in results:
            row = {"devices": label, "concurrency": int(r.level), "req_per_s": r.throughput,
                   "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "stable": r.stable,
                   "errors": r.errors}
            runs.append(row)
            print(json.dumps(row), flush=True)
    best = {label: max(r["req_per_s"] for r in runs if r["devices"] == label)
            for label in dict.fromkeys(r["devices"] for r in runs)}
    print(json.dumps({"model": args.model, "gpus": len(gpus), "best_req_per_s": best}))
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "runs": runs, "best": best},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
