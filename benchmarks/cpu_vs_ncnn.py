"""vkserve's bf16 CPU engine vs ncnn on the CPU (fp32, and bf16 storage), side by side.

    python benchmarks/cpu_vs_ncnn.py [--threads N] [--repeat K] [--rounds R] [--models DIR]
                                     [--only NAME,...] [--rss] [--json OUT]

Every model runs with seeded random weights (the same .bin for both), the same input and
the same thread count (ncnn's num_threads; vkserve's numba kernels through
VKSERVE_CPU_THREADS and numpy's BLAS pool, both set in the environment before they load).
The three engines run interleaved in one process, R rounds of K timed runs each after one
warm-up (and, for vkserve, the runs in which its Plan chooses between one thread and N:
``vkserve.devices.cpu.thread_choice``, made first, before ncnn's nets are built; the count it kept
and the choice's medians on each count are reported); reported: the median
of all R x K runs. Each block of K runs starts after a pause and
one untimed run: both engines' OpenMP pools spin for a while after their work (ncnn's
blocktime, vkserve's GOMP_SPINCOUNT on 4+ threads), and 16 spinning workers of one engine
beside 16 working ones of the other measured the contention, not the engine.

``--rss``: peak resident memory per model and engine, each measured in a child process of its
own (``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after loading the model and running it
twice, its kernels already compiled into numba's cache and loaded by the first run, then the
JIT compiler's pages let go, as the daemon's load of a model does),
with the child's peak after its imports alone (``base``), so the model's own share is peak -
base, and its resident memory at the end (``now``: VmRSS, what a serving process holds). They run before this
process loads anything large: a child's ru_maxrss starts from its parent's peak. The vkserve child imports numba and llvmlite (its JIT), the ncnn child only ncnn
and numpy: both peaks are what a process serving that model would hold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = HERE.parent / "tests" / "data" / "models"
ENGINES = ("vkserve_bf16", "ncnn_fp32", "ncnn_bf16")
#: seconds between engine blocks (see the timing loop)
QUIET_S = 0.1


def peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def resident_kib() -> int:
    """This process's resident memory now (VmRSS), KiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def rss_child(engine: str, param: Path, bin_path: Path, blobs: dict[str, object], threads: int) -> None:
    """In a child process: load and run one model on one engine (``blobs``: input shapes by
    name, output names); print its peak RSS (KiB), after the imports and at the end, and its
    RSS at the end. The vkserve child lets the pages of LLVM's library its imports read go, as
    the daemon's start does, loads the model's kernels from numba's cache in its first run, as
    the daemon's warm-up does, and then lets them go again (``scheduler.engine.after_warm_up``)."""
    import numpy as np

    if engine == "vkserve_bf16":
        from vkserve.devices.cpu.executor import Plan
        from vkserve.devices.cpu.jit.residency import release_compiler_pages
        from vkserve.models.graph import load_model
    else:
        import ncnn  # noqa: F401

        from vkserve.devices.reference import ncnn_extract, ncnn_mats, ncnn_net
    base = peak_kib()
    if engine == "vkserve_bf16":
        release_compiler_pages()  # as the daemon's start does (``scheduler.engine.prepare_device``)
    rng = np.random.default_rng(0)
    inputs = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in blobs["inputs"].items()}
    if engine == "vkserve_bf16":
        plan = Plan(load_model(param, bin_path, input_shapes={n: tuple(s) for n, s in blobs["inputs"].items()}))
        plan.run(inputs)  # the warm-up: the kernels load from numba's cache
        release_compiler_pages()
        plan.run(inputs)
    else:
        net = ncnn_net(param, bin_path, bf16=engine == "ncnn_bf16", threads=threads)
        for _ in range(2):
            ncnn_extract(net, ncnn_mats(inputs), blobs["outputs"])
    print(json.dumps({"base_kib": base, "peak_kib": peak_kib(), "now_kib": resident_kib()}))


def child(*args: str) -> str:
    """Run this script with ``args`` in a child process; its last line of output."""
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=os.environ)
    if out.returncode != 0:
        raise SystemExit(f"child {' '.join(args[:2])} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def prepare(params: list[Path], folder: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """In a child process: write each model's seeded .bin into ``folder`` and run it once on
    vkserve (so that the memory children load compiled kernels from numba's cache instead of
    compiling them); print the inputs' shapes and the output names by model."""
    from vkserve.devices.cpu.executor import Plan
    from vkserve.devices.reference import random_inputs
    from vkserve.models.graph import load_model
    from vkserve.models.weights import write_random_bin

    blobs = {}
    for param in params:
        bin_path = folder / (param.stem + ".bin")
        write_random_bin(param, bin_path, seed=0)
        plan = Plan(load_model(param, bin_path, input_shapes=shapes or None))
        plan.run(random_inputs({n: plan.blob_shapes[n] for n in plan.input_names}))
        blobs[param.stem] = {"inputs": {n: list(plan.blob_shapes[n]) for n in plan.input_names},
                             "outputs": list(plan.output_names)}
    print(json.dumps(blobs))


def cpu_flags() -> str:
    """The SIMD-relevant flags of /proc/cpuinfo (what the kernels may be compiled for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith(("flags", "Features"))), [])
    keep = ("avx", "fma", "f16c", "amx", "sse4", "asimd", "sve", "bf16", "neon")
    return " ".join(f for f in flags if f.startswith(keep))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    ap.add_argument("--only", default="", help="comma-separated model names (default: every .param)")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=d0,d1,...",
                    help="an input's shape where the .param declares none (pnnx exports: "
                         "--models tests/data/models/pnnx --shape in0=3,224,224)")
    ap.add_argument("--rss", action="store_true", help="also peak RSS per model and engine (child processes)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rss-child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--param", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--bin", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--blobs", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VKSERVE_CPU_THREADS"):
        os.environ[var] = str(args.threads)
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.timing import interleaved_ms  # noqa: PLC0415
    from vkserve.cli.commands._inputs import parse_shapes  # noqa: PLC0415 (light: no numba in this process yet)

    only = {n for n in args.only.split(",") if n}
    shapes = parse_shapes(args.shape)
    params = [p for p in sorted(args.models.glob("*.param")) if not only or p.stem in only]
    if args.prepare:
        prepare(params, args.prepare, shapes)
        return 0
    if args.rss_child:
        rss_child(args.rss_child, args.param, args.bin, json.loads(args.blobs), args.threads)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # this process stays small until the memory children have run: a child's ru_maxrss
        # starts from its parent's peak (Linux keeps the high-water mark across fork and exec)
        blobs = json.loads(child("--prepare", tmp, "--models", str(args.models), "--only", args.only,
                                 *(f"--shape={s}" for s in args.shape)))
        rss: dict[str, dict[str, dict[str, int]]] = {}
        if args.rss:
            for param in params:
                rss[param.stem] = {
                    e: json.loads(child("--rss-child", e, "--param", str(param), "--bin", f"{tmp}/{param.stem}.bin",
                                        "--blobs", json.dumps(blobs[param.stem]), "--threads", str(args.threads)))
                    for e in ENGINES}
        from vkserve.devices.cpu.executor import Plan
        from vkserve.devices.reference import ncnn_extract, ncnn_mats, ncnn_net, random_inputs
        from vkserve.models.graph import load_model

        for param in params:
            bin_path = Path(tmp) / (param.stem + ".bin")
            plan = Plan(load_model(param, bin_path, input_shapes=shapes or None))
            inputs = random_inputs({n: plan.blob_shapes[n] for n in plan.input_names})
            # vkserve's own thread choice first, on a quiet machine: made right after ncnn's runs,
            # its runs on N threads met ncnn's N workers still spinning (their blocktime) and a
            # Plan on the 16-core Xeon kept one thread for that (yolov4-tiny 1.88x, RESULTS.md)
            time.sleep(QUIET_S)
            while plan.thread_choice.chosen is None:
                plan.run(inputs)
            choice_ms = {n: round(plan.thread_choice.median(n) * 1e3, 2) for n in sorted(plan.thread_choice.samples)}
            mats = ncnn_mats(inputs)
            nets = {bf16: ncnn_net(param, bin_path, bf16=bf16, threads=args.threads) for bf16 in (False, True)}
            runs: dict[str, Callable[[], object]] = {
                "vkserve_bf16": lambda: plan.run(inputs),
                "ncnn_fp32": lambda: ncnn_extract(nets[False], mats, plan.output_names),
                "ncnn_bf16": lambda: ncnn_extract(nets[True], mats, plan.output_names),
            }
            # each engine's runs in blocks on a quiet machine: the other engine's OpenMP workers
            # stop spinning first (ncnn's for up to its 20 ms blocktime, vkserve's ~0.3 ms)
            ms = interleaved_ms(runs, args.rounds, warmup=0, repeat=args.repeat, quiet_s=QUIET_S)
            for net in nets.values():
                net.clear()
            row: dict[str, object] = {"model": param.stem}
            row.update({f"{e}_ms": round(v, 2) for e, v in ms.items()})
            row["vkserve_threads"] = plan.thread_choice.chosen
            row["vkserve_choice_ms"] = choice_ms
            row["ratio_vs_ncnn_bf16"] = round(ms["vkserve_bf16"] / ms["ncnn_bf16"], 2)
            row["ratio_vs_ncnn_fp32"] = round(ms["vkserve_bf16"] / ms["ncnn_fp32"], 2)
            if args.rss:
                for engine, got in rss[param.stem].items():
                    row[f"{engine}_rss_mib"] = round(got["peak_kib"] / 1024, 1)
                    row[f"{engine}_base_mib"] = round(got["base_kib"] / 1024, 1)
                    row[f"{engine}_now_mib"] = round(got["now_kib"] / 1024, 1)
                row["rss_ratio_vs_ncnn_bf16"] = round(row["vkserve_bf16_rss_mib"] / row["ncnn_bf16_rss_mib"], 2)
                row["now_ratio_vs_ncnn_bf16"] = round(row["vkserve_bf16_now_mib"] / row["ncnn_bf16_now_mib"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or ''}".strip(", ")
    flags = cpu_flags()
    runs_each = args.rounds * args.repeat
    print(f"\nmachine: {machine}; threads {args.threads}; median of {runs_each} runs "
          f"({args.rounds} interleaved rounds)\nCPU flags: {flags}\n")
    print("| model | vkserve bf16 (ms) | its threads (choice's medians, ms) | ncnn fp32 (ms) | ncnn bf16 (ms) "
          "| vs ncnn bf16 | vs ncnn fp32 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        choice = ", ".join(f"{n}: {ms}" for n, ms in r["vkserve_choice_ms"].items()) or "fixed"
        print(f"| {r['model']} | {r['vkserve_bf16_ms']} | {r['vkserve_threads']} ({choice}) | {r['ncnn_fp32_ms']} "
              f"| {r['ncnn_bf16_ms']} | {r['ratio_vs_ncnn_bf16']}x | {r['ratio_vs_ncnn_fp32']}x |")
    if args.rss:
        print("\nRSS, MiB: peak (after imports alone: base); at the end, after two runs (now)\n")
        print("| model | vkserve bf16 | ncnn fp32 | ncnn bf16 | vkserve vs ncnn bf16: peak | now |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            cells = " | ".join(f"{r[f'{e}_rss_mib']} (base {r[f'{e}_base_mib']}; now {r[f'{e}_now_mib']})"
                               for e in ENGINES)
            print(f"| {r['model']} | {cells} | {r['rss_ratio_vs_ncnn_bf16']}x | {r['now_ratio_vs_ncnn_bf16']}x |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "cpu_flags": flags, "threads": args.threads,
                                         "repeat": args.repeat, "rounds": args.rounds, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
