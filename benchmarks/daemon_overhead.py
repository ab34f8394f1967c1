"""Per-request overhead of the daemon and its throughput at concurrency 1/4/16.

    python benchmarks/daemon_overhead.py [--devices cpu|gpu|all] [--model digits|NAME]
        [--shape NAME=d0,d1,...] [--requests N] [--concurrency 1,4,16] [--scheduler "cpu_instances = 1"] [--json OUT]

Starts `vkserve serve` on a temporary Unix socket with the digits example (a tiny model), or
NAME.param of tests/data/models with seeded random weights (fp16 on a GPU; inputs of 600 KB for
mobilenet, which the client sends through shared memory; outputs that large come back the
same way, e.g. ``--model pnnx/deeplabv3_mbv3 --shape in0=3,256,256``: 5.5 MB of scores), on
the chosen devices, then:
- one sync client, N sequential requests: round-trip p50/p99, the daemon's own run time
  for the same requests (`run_seconds` in each reply) and the same model run in-process
  (the engine the daemon uses, no daemon); overhead = round trip - in-process run time;
- the daemon's CPU seconds per request over those N requests (its process's user + system
  time, every thread: a figure other load on the machine changes little);
- the per-stage split the replies carry (median queue, copy-in, device, copy-out seconds) and
  how the GPUs read the inputs that came in shared memory (in place or copied);
- `vkserve bench`'s load generator at each concurrency (throughput, p50/p99), with the
  daemon's CPU per request over the whole sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon_harness import start_daemon  # noqa: E402
from vkserve.cli.commands._inputs import parse_shapes  # noqa: E402
from vkserve.client import AsyncClient, Client, InferReply  # noqa: E402
from vkserve.client.loadgen import BenchSettings, sweep  # noqa: E402
from vkserve.models.graph import Graph, load_model  # noqa: E402

DIGITS = ROOT / "vkserve" / "examples" / "digits"
MODELS = ROOT / "tests" / "data" / "models"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3


Shapes = dict[str, tuple[int, ...]]


def model_repository(tmp: Path, model: str, devices: str, shapes: Shapes) -> Path:
    if model == "digits":
        return digits_repository(tmp, devices)
    folder = tmp / "models" / Path(model).name  # served under its file's name
    folder.mkdir(parents=True)
    shutil.copy(MODELS / f"{model}.param", folder / "model.param")
    inputs = "".join(f"{name} = {list(shape)}\n" for name, shape in shapes.items())
    (folder / "config.toml").write_text(f'random_weights = true\nprecision = "fp16"\n'
                                        f'devices = "{devices}"\nwarmup = 2\n'
                                        + (f"[inputs]\n{inputs}" if inputs else ""))
    return tmp / "models"


def model_inputs(model: str, shapes: Shapes) -> dict[str, np.ndarray]:
    if model == "digits":
        return {"data": np.load(DIGITS / "samples" / "3.npy").astype(np.float32)}
    graph = model_graph(model, shapes)
    rng = np.random.default_rng(0)
    return {n: rng.uniform(-1, 1, graph.blob_shapes[n]).astype(np.float32) for n in graph.input_names}


def digits_repository(tmp: Path, devices: str) -> Path:
    repo = tmp / "models"
    shutil.copytree(ROOT / "vkserve" / "examples" / "digits", repo / "digits")
    cfg = repo / "digits" / "config.toml"
    cfg.write_text(cfg.read_text().replace("warmup = 2", f'warmup = 2\ndevices = "{devices}"'))
    return repo


def model_graph(model: str, shapes: Shapes) -> Graph:
    """The digits example with its weights, or a benchmark model with the daemon's seeded
    random weights (``random_weights = true``, seed 0)."""
    if model == "digits":
        return load_model(DIGITS / "model.param", DIGITS / "model.bin")
    return load_model(MODELS / f"{model}.param", input_shapes=shapes or None)


def in_process_ms(devices: str, model: str, shapes: Shapes, inputs: dict[str, np.ndarray],
                  n: int) -> tuple[float, str]:
    """Median run time of the model on the engine the daemon would use."""
    graph = model_graph(model, shapes)
    if devices == "cpu":
        from vkserve.devices.cpu.executor import Plan

        plan = Plan(graph)
        run, engine, close = (lambda: plan.run(inputs)), "cpu (bf16)", (lambda: None)
    else:
        from vkserve.devices.vulkan.engine import load_plan

        loaded = load_plan(graph, 0, "fp16")
        run, engine = (lambda: loaded.plan.run(inputs)), f"vulkan {loaded.device.caps.name}"
        close = loaded.close  # before exit: a Plan left to the interpreter's teardown crashed it
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    finally:
        close()
    return statistics.median(times) * 1e3, engine


def served(sock: Path) -> int:
    """Requests the daemon has answered so far (its status)."""
    with Client.connect(f"unix:{sock}") as c:
        return int(c.status()["server"]["requests_done"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="cpu", choices=["cpu", "gpu", "all"])
    ap.add_argument("--model", default="digits", help="digits, or NAME.param of tests/data/models")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=d0,d1,...",
                    help="an input's shape where the .param declares none (ncnn order)")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--scheduler", default="", help="extra [scheduler] lines for the daemon")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    shapes = parse_shapes(args.shape)
    x = model_inputs(args.model, shapes)
    served_as = Path(args.model).name
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as d:
        proc, sock = start_daemon(Path(d), model_repository(Path(d), args.model, args.devices, shapes),
                                  scheduler=args.scheduler)
        try:
            rtt: list[float] = []
            with Client.connect(f"unix:{sock}") as c:
                for _ in range(50):
                    c.infer(served_as, x)
                cpu_before = cpu_seconds(proc.pid)
                for _ in range(args.requests):
                    t0 = time.perf_counter()
                    c.infer(served_as, x)
                    rtt.append(time.perf_counter() - t0)
                sequential_cpu = (cpu_seconds(proc.pid) - cpu_before) / args.requests

            async def replies() -> list[InferReply]:
                async with AsyncClient.connect(f"unix:{sock}") as tc:
                    return [await tc.infer_detailed(served_as, x) for _ in range(200)]

            answers = trio.run(replies)
            stages = {name: round(statistics.median(getattr(r, name) or 0.0 for r in answers) * 1e3, 4)
                      for name in ("queue_seconds", "copy_in_seconds", "device_seconds",
                                   "copy_out_seconds", "run_seconds")}
            settings = BenchSettings(served_as, x, window_seconds=args.window,
                                     max_windows=8)
            served_before, cpu_before = served(sock), cpu_seconds(proc.pid)
            levels = trio.run(lambda: sweep(lambda: AsyncClient.connect(f"unix:{sock}"),
                                            settings, concurrencies=concurrencies))
            sweep_cpu = (cpu_seconds(proc.pid) - cpu_before) / max(1, served(sock) - served_before)
            with Client.connect(f"unix:{sock}") as c:  # inputs in shared memory, by how GPUs read them
                shared = {d["device"]: {"in_place": d.get("inputs_in_place"), "copied": d.get("shared_inputs_copied")}
                          for d in c.status()["devices"] if d["kind"] == "vulkan"}
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    local_ms, engine = in_process_ms(args.devices, args.model, shapes, x, 500)
    result = {
        "machine": f"{os.uname().machine}, {os.cpu_count()} cores",
        "devices": args.devices, "model": args.model, "shapes": shapes, "engine": engine,
        "requests": args.requests,
        "rtt_p50_ms": round(pct(rtt, 50), 3), "rtt_p99_ms": round(pct(rtt, 99), 3),
        "scheduler": args.scheduler,
        "server_stages_p50_ms": stages,
        "shared_inputs": shared,
        "daemon_cpu_ms_per_request": {"sequential": round(sequential_cpu * 1e3, 3),
                                      "sweep": round(sweep_cpu * 1e3, 3)},
        "in_process_p50_ms": round(local_ms, 3),
        "overhead_p50_ms": round(pct(rtt, 50) - local_ms, 3),
        "overhead_p99_ms": round(pct(rtt, 99) - local_ms, 3),
        "throughput": [{"concurrency": int(r.level), "req_per_s": r.throughput,
                        "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "server_batch": r.server_batch,
                        "stable": r.stable}
                       for r in levels],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
