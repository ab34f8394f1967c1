"""In-process throughput of the Vulkan engine per batch size: ``Plan.run`` (batch 1) against
``Plan.run_batch`` of N items (one submission, the items recorded layer by layer).

    python benchmarks/batch_throughput.py [--models mobilenet resnet50] [--batches 1 2 4 8 16]
                                          [--precision fp16] [--device 0] [--seconds 3]

For each model and batch size: items per second over ``--seconds`` of back-to-back runs on one
thread (one instance), and the median milliseconds per run. Seeded random weights and inputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["mobilenet", "resnet50"])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from vkserve.devices.discovery import discover_devices
    from vkserve.devices.reference import random_inputs
    from vkserve.devices.vulkan.engine import load_plan
    from vkserve.models.graph import load_model

    caps = discover_devices()[args.device]
    print(json.dumps({"device": caps.name, "precision": args.precision}), flush=True)
    rows = []
    for model in args.models:
        graph = load_model(ROOT / "tests" / "data" / "models" / f"{model}.param")
        loaded = load_plan(graph, args.device, args.precision)
        try:
            plan = loaded.plan
            for n in args.batches:
                batch = [random_inputs({b: graph.blob_shapes[b] for b in graph.input_names}, seed=i)
                         for i in range(n)]

                def once(batch: list = batch) -> None:
                    if len(batch) == 1:
                        plan.run(batch[0])
                    else:
                        plan.run_batch(batch)

                for _ in range(3):
                    once()
                times: list[float] = []
                end = time.perf_counter() + args.seconds
                while time.perf_counter() < end:
                    t0 = time.perf_counter()
                    once()
                    times.append(time.perf_counter() - t0)
                row = {"model": model, "batch": n, "runs": len(times),
                       "ms_per_run": round(statistics.median(times) * 1e3, 3),
                       "items_per_s": round(n * len(times) / sum(times), 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            loaded.close()
    print("\n| model | batch | ms per run (median) | items/s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['ms_per_run']} | {r['items_per_s']} |")
    if args.json:
        args.json.write_text(json.dumps({"device": caps.name, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
