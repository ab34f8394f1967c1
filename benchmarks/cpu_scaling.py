"""How the CPU engine's time scales with threads, layer by layer (where a many-core box loses).

    python benchmarks/cpu_scaling.py [--threads 1,4,16] [--models DIR] [--only NAME,...]
                                     [--runs K] [--top N] [--json OUT]

Per model (seeded random weights): one CPU Plan, profiled step by step (``Plan.profile``,
median of K runs) at each thread count in turn, in one process; printed: the whole-run
median, the sum per layer type, and the steps that lose the most time at the highest count
against perfect scaling from the lowest. Also the cost of one empty parallel region (a
numba ``prange`` over one task per thread), the floor under every kernel launch: with many
small layers, launches x that floor is time no kernel work can win back. numba's thread
pool follows OMP_WAIT_POLICY / GOMP_SPINCOUNT as set in the environment (vkserve's default:
``vkserve.devices.cpu.jit.wait_settings``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = HERE.parent / "tests" / "data" / "models"


def region_cost_us(threads: int, repeat: int = 2000) -> float:
    """Median microseconds of an empty parallel region of ``threads`` tasks on that many
    threads (the pool woken, every worker handed one task, all joined)."""
    from numba import njit, prange

    from vkserve.devices.cpu import jit

    @njit(parallel=True)
    def touch(out):  # noqa: ANN001, ANN202
        for i in prange(out.shape[0]):
            out[i] += 1.0

    out = np.zeros(threads, dtype=np.float32)
    times = []
    for _ in range(repeat):
        with jit.launch(1 << 30):  # as a large kernel: all threads
            t0 = time.perf_counter()
            touch(out)
            times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default=f"1,{os.cpu_count() or 1}")
    ap.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    ap.add_argument("--only", default="")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from vkserve.devices.cpu import threads
    from vkserve.devices.cpu.executor import Plan
    from vkserve.devices.cpu.thread_choice import ThreadChoice
    from vkserve.devices.reference import random_inputs
    from vkserve.models.graph import load_model

    counts = [int(t) for t in args.threads.split(",")]
    only = {n for n in args.only.split(",") if n}
    params = sorted(p for p in args.models.glob("*.param") if not only or p.stem in only)
    policy = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                      if k in os.environ) or "vkserve's default (jit.wait_settings)"
    report: dict[str, object] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
                                 "wait_policy": policy, "threads": counts, "models": {}}
    print(f"machine: {report['machine']}; OpenMP wait: {policy}; median of {args.runs} runs")
    regions = {}
    for n in counts:
        threads.configure(n)
        regions[n] = round(region_cost_us(n), 2)
    report["empty_region_us"] = regions
    print("empty parallel region: " + ", ".join(f"{n} threads {us} us" for n, us in regions.items()))
    for param in params:
        graph = load_model(param, None, seed=0)
        plan = Plan(graph)
        inputs = random_inputs({n: plan.blob_shapes[n] for n in plan.input_names})
        per_count: dict[int, dict[str, float]] = {}
        whole: dict[int, float] = {}
        types: dict[str, str] = {}
        for n in counts:
            threads.configure(n)
            plan.thread_choice = ThreadChoice.fixed(n)  # this count, not the Plan's own choice
            plan.run(inputs)
            steps = plan.profile(inputs, runs=args.runs)
            per_count[n] = {s.name: s.ms for s in steps}
            types.update({s.name: s.type for s in steps})
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                plan.run(inputs)
                times.append(time.perf_counter() - t0)
            whole[n] = round(1e3 * statistics.median(times), 3)
        lo, hi = counts[0], counts[-1]
        by_type: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for n in counts:
            for name, ms in per_count[n].items():
                by_type[types[name]][n] += ms
        ideal = {name: per_count[lo][name] * lo / hi for name in per_count[lo]}
        lost = sorted(per_count[hi], key=lambda name: ideal[name] - per_count[hi][name])[:args.top]
        print(f"\n{param.stem}: whole run " + ", ".join(f"{n} threads {whole[n]} ms" for n in counts)
              + f"; {len(per_count[lo])} steps")
        for kind, row in sorted(by_type.items(), key=lambda kv: -kv[1][hi]):
            print(f"  {kind:22} " + "  ".join(f"{row[n]:8.3f}" for n in counts) + " ms")
        print(f"  steps losing most against ideal scaling {lo} -> {hi} threads:")
        for name in lost:
            print(f"    {name:28} {types[name]:20} " + "  ".join(f"{per_count[n][name]:7.3f}" for n in counts)
                  + f"  (ideal {ideal[name]:.3f})")
        report["models"][param.stem] = {  # type: ignore[index]
            "whole_ms": whole,
            "by_type": {k: {n: round(v, 4) for n, v in row.items()} for k, row in by_type.items()},
            "steps": {name: {"type": types[name], **{str(n): round(per_count[n][name], 4) for n in counts}}
                      for name in per_count[lo]},
        }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
