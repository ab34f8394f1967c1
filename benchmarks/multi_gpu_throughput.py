"""One GPU against every GPU, with and without dynamic batching, in one run (issue 18).

    python benchmarks/multi_gpu_throughput.py [--models resnet50,mobilenet] [--model-dir DIR]
        [--concurrency 8,32,128] [--seconds 5] [--warmup 2] [--clients 4]
        [--scheduler "instances_per_device = 2"] [--json OUT]
    python benchmarks/multi_gpu_throughput.py --smoke [--json OUT]
        [--failover-after RUNS]

For each model, device set (the first GPU; every GPU) and batching (off: ``max_batch_size =
1``; on: ``max_batch_size = --batch``) it starts `vkserve serve` on a temporary Unix socket with
the model (its .param from ``--model-dir``, seeded random weights, fp16) on those devices, then
at each concurrency drives it from ``--clients`` load processes (one connection each, the
concurrency split between them, shared memory for large inputs as the client does by default),
so the load generator is not the ceiling. Each level runs ``--warmup`` seconds unmeasured, then
``--seconds`` measured: requests per second, client-side p50/p99, the mean batch the daemon
reported, errors. Last, failover under load: the first model on every device at the second
concurrency level while the first GPU fails as a lost device after ``--failover-after`` runs
(the daemon's fault hook); every request must still be answered. Prints a table and writes
every row as JSON.

``--smoke`` is the same run shrunk to what any machine has, so the script cannot rot (a test
runs it): the digits model (random weights), the first Vulkan device (lavapipe) against every
device (lavapipe + CPU), concurrency 2 and 8, fractions of a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon_harness import start_daemon  # noqa: E402


@dataclasses.dataclass(frozen=True)
class DeviceSet:
    label: str
    devices: str  # the model's config.toml value


@dataclasses.dataclass
class Load:
    """What one load process measured."""

    seconds: float
    latencies: list[float]
    batches: list[int]
    errors: dict[str, int]


def param_path(model_dir: Path, name: str) -> Path:
    """``DIR/NAME.param`` (ncnn's benchmark set), or a repository folder's ``DIR/NAME/model.param``."""
    folder = model_dir / name / "model.param"
    return folder if folder.exists() else model_dir / f"{name}.param"


def model_repository(tmp: Path, name: str, param: Path, devices: str, max_batch: int) -> Path:
    folder = tmp / "models" / name
    folder.mkdir(parents=True)
    (folder / "model.param").write_bytes(param.read_bytes())
    (folder / "config.toml").write_text(
        f'random_weights = true\nprecision = "fp16"\ndevices = {devices}\ncpu_fallback = false\n'
        f"warmup = 2\nqueue_limit = 1024\nmax_batch_size = {max_batch}\n")
    return tmp / "models"


def drive(sock: str, model: str, inputs: dict[str, np.ndarray], concurrency: int,
          warmup: float, seconds: float) -> Load:
    """A load process: ``concurrency`` requests always outstanding on one connection; only
    those answered within the measured ``seconds`` count."""
    import trio

    from vkserve.client import AsyncClient, ServerError

    async def main() -> Load:
        load = Load(seconds, [], [], {})
        measuring = False

        async def worker() -> None:
            while True:
                start = time.perf_counter()
                try:
                    reply = await client.infer_detailed(model, inputs)
                except ServerError as exc:
                    if measuring:
                        load.errors[exc.code] = load.errors.get(exc.code, 0) + 1
                    continue
                if measuring:
                    load.latencies.append(time.perf_counter() - start)
                    load.batches.append(reply.batch_size or 1)

        async with AsyncClient.connect(f"unix:{sock}") as client, trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
            await trio.sleep(warmup)
            measuring = True
            await trio.sleep(seconds)
            measuring = False
            nursery.cancel_scope.cancel()
        return load

    return trio.run(main)


def collect(pool: ProcessPoolExecutor, clients: int, sock: Path, model: str,
            inputs: dict[str, np.ndarray], concurrency: int, warmup: float,
            seconds: float) -> list[Load]:
    """``concurrency`` split across ``clients`` load processes, run at once."""
    shares = [concurrency // clients + (i < concurrency % clients) for i in range(clients)]
    futures = [pool.submit(drive, str(sock), model, inputs, share, warmup, seconds)
               for share in shares if share]
    return [f.result() for f in futures]


def summarise(loads: list[Load], seconds: float) -> dict[str, object]:
    latencies = [v for load in loads for v in load.latencies]
    batches = [b for load in loads for b in load.batches]
    errors: dict[str, int] = {}
    for load in loads:
        for code, n in load.errors.items():
            errors[code] = errors.get(code, 0) + n

    def ms(q: float) -> float | None:
        return round(float(np.percentile(latencies, q)) * 1e3, 3) if latencies else None

    return {"req_per_s": round(len(latencies) / seconds, 1), "p50_ms": ms(50), "p99_ms": ms(99),
            "mean_batch": round(float(np.mean(batches)), 2) if batches else None,
            "requests": len(latencies), "errors": errors}


def measure(pool: ProcessPoolExecutor, clients: int, sock: Path, model: str,
            inputs: dict[str, np.ndarray], concurrency: int, warmup: float,
            seconds: float) -> dict[str, object]:
    return summarise(collect(pool, clients, sock, model, inputs, concurrency, warmup, seconds),
                     seconds)


def table(rows: list[dict[str, object]]) -> str:
    head = "| model | devices | batching | concurrency | req/s | p50 ms | p99 ms | mean batch | errors |"
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['devices']} | {r['batching']} | {r['concurrency']} | "
                     f"{r['req_per_s']:,} | {r['p50_ms']} | {r['p99_ms']} | {r['mean_batch']} | "
                     f"{sum(r['errors'].values()) or '-'} |")  # type: ignore[union-attr]
    return "\n".join(lines)


def speedups(rows: list[dict[str, object]], sets: list[DeviceSet]) -> list[dict[str, object]]:
    """Every device set's throughput over the first set's, per model, batching and level."""
    out = []
    base = {(r["model"], r["batching"], r["concurrency"]): r["req_per_s"]
            for r in rows if r["devices"] == sets[0].label}
    for r in rows:
        one = base.get((r["model"], r["batching"], r["concurrency"]))
        if r["devices"] != sets[0].label and one:
            out.append({"model": r["model"], "devices": r["devices"], "batching": r["batching"],
                        "concurrency": r["concurrency"],
                        "x_first": round(float(r["req_per_s"]) / float(one), 2)})  # type: ignore[arg-type]
    return out


def device_sets(smoke: bool) -> list[DeviceSet]:
    from vkserve.devices.discovery import discover_devices

    gpus = [d.index for d in discover_devices() if d.kind.value == "vulkan"]
    if not gpus:
        raise SystemExit("no Vulkan device found")
    if smoke:
        return [DeviceSet("1 Vulkan device", f"[{gpus[0]}]"), DeviceSet("Vulkan + CPU", '"all"')]
    if len(gpus) < 2:  # one GPU's figures alone (issue 14 measures those on one H100)
        print(f"one Vulkan GPU only ({gpus}): measuring it alone, no comparison", file=sys.stderr)
        return [DeviceSet("1 GPU", f"[{gpus[0]}]")]
    return [DeviceSet("1 GPU", f"[{gpus[0]}]"), DeviceSet(f"{len(gpus)} GPUs", '"gpu"')]


FAILOVER_ROUNDS = 20


def run_failover(pool: ProcessPoolExecutor, args: argparse.Namespace, devices: DeviceSet,
                 level: int) -> dict[str, object]:
    """The first model on every device of `devices`, batching on, at `level`, while the first
    GPU fails as a lost device after ``--failover-after`` runs (the daemon's fault hook):
    every request of the whole run (no unmeasured warm-up) must be answered without error.
    The run goes on in rounds of ``--warmup + --seconds`` until a round has begun after the
    fault (at most `FAILOVER_ROUNDS`)."""
    from vkserve.models.graph import load_model

    model = args.models.split(",")[0]
    param = param_path(args.model_dir, model)
    graph = load_model(param, None)
    rng = np.random.default_rng(0)
    inputs = {n: rng.uniform(-1, 1, graph.blob_shapes[n]).astype(np.float32) for n in graph.input_names}
    first = devices.devices.strip("[]").split(",")[0] if devices.devices.startswith("[") else "0"
    with tempfile.TemporaryDirectory() as d:
        repo = model_repository(Path(d), model, param, devices.devices, args.batch)
        proc, sock = start_daemon(Path(d), repo, scheduler=args.scheduler, env={
            "VKSERVE_TEST_DEVICE_FAULT": f"{first}=1@{args.failover_after}"})
        log = Path(d) / "daemon.log"
        loads: list[Load] = []
        rounds = 0
        try:
            # rounds until the fault has fired (a slow or busy machine reaches the GPU's Nth run
            # later), then one more round served by the devices left
            while rounds < FAILOVER_ROUNDS:
                fired = "injected fault" in log.read_text()
                loads += collect(pool, args.clients, sock, model, inputs, level, 0.0,
                                 args.seconds + args.warmup)
                rounds += 1
                if fired:
                    break
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        fired = "injected fault" in log.read_text()
    return {"model": model, "devices": devices.label, "concurrency": level,
            "fault_after_runs": args.failover_after, "fault_fired": fired, "rounds": rounds,
            **summarise(loads, rounds * (args.seconds + args.warmup))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mobilenet")
    ap.add_argument("--model-dir", type=Path, default=ROOT / "tests" / "data" / "models")
    ap.add_argument("--concurrency", default="8,32,128")
    ap.add_argument("--batch", type=int, default=8, help="max_batch_size with batching on")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--clients", type=int, default=4, help="load processes")
    ap.add_argument("--scheduler", default="", help="extra [scheduler] lines for the daemons")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--failover-after", type=int, default=500,
                    help="last, a run where the first GPU fails after this many runs (0: none)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.smoke:
        args.models, args.model_dir = "digits", ROOT / "vkserve" / "examples"
        args.concurrency, args.seconds, args.warmup, args.clients = "2,8", 0.4, 0.2, 2
        args.failover_after = 20
    from vkserve.models.graph import load_model

    sets = device_sets(args.smoke)
    levels = [int(c) for c in args.concurrency.split(",")]
    rows: list[dict[str, object]] = []
    with ProcessPoolExecutor(args.clients, mp_context=multiprocessing.get_context("spawn")) as pool:
        for model in args.models.split(","):
            param = param_path(args.model_dir, model)
            graph = load_model(param, None)
            rng = np.random.default_rng(0)
            inputs = {n: rng.uniform(-1, 1, graph.blob_shapes[n]).astype(np.float32)
                      for n in graph.input_names}
            for devices in sets:
                for batching, max_batch in (("off", 1), ("on", args.batch)):
                    with tempfile.TemporaryDirectory() as d:
                        repo = model_repository(Path(d), model, param, devices.devices, max_batch)
                        proc, sock = start_daemon(Path(d), repo, scheduler=args.scheduler)
                        try:
                            for level in levels:
                                row = {"model": model, "devices": devices.label,
                                       "batching": batching, "concurrency": level,
                                       **measure(pool, args.clients, sock, model, inputs, level,
                                                 args.warmup, args.seconds)}
                                rows.append(row)
                                print(json.dumps(row), flush=True)
                        finally:
                            proc.send_signal(signal.SIGTERM)
                            proc.wait(timeout=120)
        # (a device to fail over to: the smoke run's CPU, or a second GPU)
        failover = (run_failover(pool, args, sets[-1], levels[min(1, len(levels) - 1)])
                    if args.failover_after and len(sets) > 1 else None)
    print(table(rows))
    result = {"machine": f"{os.uname().machine}, {os.cpu_count()} cores",
              "device_sets": [dataclasses.asdict(s) for s in sets], "clients": args.clients,
              "scheduler": args.scheduler,
              "seconds": args.seconds, "rows": rows, "speedup": speedups(rows, sets),
              "failover": failover}
    if failover:
        print("failover:", json.dumps(failover))
    for s in result["speedup"]:  # type: ignore[union-attr]
        print(json.dumps(s))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
