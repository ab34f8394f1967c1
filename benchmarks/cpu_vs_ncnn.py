"""vkserve's bf16 CPU engine vs ncnn on the CPU (fp32, and bf16 storage), side by side.

    python benchmarks/cpu_vs_ncnn.py [--threads N] [--repeat K] [--models DIR] [--json OUT]

Every model runs with seeded random weights (the same .bin for both), the same input and
the same thread count (ncnn's num_threads; vkserve's numba kernels through
VKSERVE_CPU_THREADS and numpy's BLAS pool, both set in the environment before they load).
Reports the median of K runs after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = HERE.parent / "tests" / "data" / "models"


def median_ms(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VKSERVE_CPU_THREADS"):
        os.environ[var] = str(args.threads)
    sys.path.insert(0, str(HERE.parent))
    from vkserve.devices.cpu.executor import Plan
    from vkserve.devices.reference import ncnn_extract, ncnn_mats, ncnn_net, random_inputs
    from vkserve.models.graph import load_model
    from vkserve.models.weights import write_random_bin

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for param in sorted(args.models.glob("*.param")):
            bin_path = Path(tmp) / (param.stem + ".bin")
            write_random_bin(param, bin_path, seed=0)
            graph = load_model(param, bin_path)
            plan = Plan(graph)
            inputs = random_inputs({n: plan.blob_shapes[n] for n in plan.input_names})
            ours = median_ms(lambda: plan.run(inputs), args.repeat)
            row = {"model": param.stem, "vkserve_bf16_ms": round(ours, 2)}
            mats = ncnn_mats(inputs)
            for label, bf16 in (("ncnn_fp32_ms", False), ("ncnn_bf16_ms", True)):
                net = ncnn_net(param, bin_path, bf16=bf16, threads=args.threads)
                row[label] = round(median_ms(
                    lambda: ncnn_extract(net, mats, plan.output_names), args.repeat), 2)
                net.clear()
            row["ratio_vs_ncnn_bf16"] = round(ours / row["ncnn_bf16_ms"], 2)
            row["ratio_vs_ncnn_fp32"] = round(ours / row["ncnn_fp32_ms"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or ''}".strip(", ")
    print(f"\nmachine: {machine}; threads {args.threads}; median of {args.repeat}\n")
    print("| model | vkserve bf16 (ms) | ncnn fp32 (ms) | ncnn bf16 (ms) | vs ncnn bf16 | vs ncnn fp32 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['vkserve_bf16_ms']} | {r['ncnn_fp32_ms']} | {r['ncnn_bf16_ms']} "
              f"| {r['ratio_vs_ncnn_bf16']}x | {r['ratio_vs_ncnn_fp32']}x |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "threads": args.threads,
                                         "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
