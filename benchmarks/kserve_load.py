"""Load through the Open Inference Protocol front ends, driven by Triton's own client library.

    python benchmarks/kserve_load.py [--model digits] [--model-dir DIR] [--concurrency 1,4,16]
        [--seconds 5] [--json OUT]
    python benchmarks/kserve_load.py --smoke [--json OUT]

What `perf_analyzer` measures, with `tritonclient` (its Python library): `vkserve serve` with
`[http]` and `[grpc]` on free loopback ports and the model (the digits example by default, its
shipped weights; or ``DIR/NAME/`` of a repository), then for each protocol and concurrency
level that many threads, each with its own `tritonclient` connection, send the model's input
(binary tensor data over HTTP, raw contents over gRPC) back to back for ``--seconds`` after a
warm-up: requests per second, client-side p50/p99, errors. The first answer of each protocol is
checked against vkserve's own client, so a broken front end cannot produce a fast figure.
``--smoke`` shrinks it to fractions of a second (a test runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon_harness import start_daemon  # noqa: E402
from vkserve.client import Client  # noqa: E402

PROTOCOLS = ("http", "grpc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def triton_infer(protocol: str, url: str, model: str, name: str, data: np.ndarray):
    """A callable sending one request on its own connection; returns the first output."""
    if protocol == "http":
        import tritonclient.http as tc
    else:
        import tritonclient.grpc as tc
    client = tc.InferenceServerClient(url)
    tensor = tc.InferInput(name, list(data.shape), "FP32")
    if protocol == "http":
        tensor.set_data_from_numpy(data, binary_data=True)
    else:
        tensor.set_data_from_numpy(data)

    def once() -> np.ndarray:
        result = client.infer(model, [tensor])
        return result.as_numpy(result.get_response()["outputs"][0]["name"] if protocol == "http"
                               else result.get_response().outputs[0].name)

    return once


def level(protocol: str, url: str, model: str, name: str, data: np.ndarray, threads: int,
          warmup: float, seconds: float) -> dict[str, object]:
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []
    start = time.monotonic() + warmup
    stop = start + seconds

    def worker(k: int) -> None:
        once = triton_infer(protocol, url, model, name, data)
        while True:
            t0 = time.monotonic()
            if t0 >= stop:
                return
            try:
                once()
            except Exception as exc:  # every failure is counted and reported, never raised
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if t0 >= start:
                latencies[k].append(time.monotonic() - t0)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    done = [v for per in latencies for v in per]

    def ms(q: float) -> float | None:
        return round(float(np.percentile(done, q)) * 1e3, 3) if done else None

    return {"protocol": protocol, "concurrency": threads, "req_per_s": round(len(done) / seconds, 1),
            "p50_ms": ms(50), "p99_ms": ms(99), "requests": len(done), "errors": len(errors),
            "first_error": errors[0] if errors else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="digits")
    ap.add_argument("--model-dir", type=Path, default=ROOT / "vkserve" / "examples")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.smoke:
        args.concurrency, args.seconds, args.warmup = "1,4", 0.5, 0.2
    levels = [int(c) for c in args.concurrency.split(",")]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as d:
        repo = Path(d) / "models"
        shutil.copytree(args.model_dir / args.model, repo / args.model)
        ports = {p: free_port() for p in PROTOCOLS}
        tables = "".join(f'[{p}]\nlisten = "127.0.0.1:{port}"\n' for p, port in ports.items())
        proc, sock = start_daemon(Path(d), repo, tables=tables)
        try:
            with Client.connect(f"unix:{sock}") as c:
                (info,) = [m for m in c.models() if m["name"] == args.model]
                ((name, shape),) = info["inputs"].items()  # a model of one fixed-shape input
                data = np.random.default_rng(0).uniform(-1, 1, [int(v) for v in shape]).astype(np.float32)
                native = next(iter(c.infer(args.model, {name: data}).values()))
            for protocol in PROTOCOLS:
                url = f"127.0.0.1:{ports[protocol]}"
                got = triton_infer(protocol, url, args.model, name, data)()
                if not np.allclose(got.reshape(native.shape), native, rtol=1e-5, atol=1e-6):
                    raise SystemExit(f"{protocol}: tritonclient's answer differs from vkserve's own client's")
                for n in levels:
                    row = level(protocol, url, args.model, name, data, n, args.warmup, args.seconds)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    print("| protocol | concurrency | req/s | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['protocol']} | {r['concurrency']} | {r['req_per_s']:,} | {r['p50_ms']} | {r['p99_ms']} | "
              f"{r['errors'] or '-'} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": f"{os.uname().machine}, {os.cpu_count()} cores",
                                         "model": args.model, "seconds": args.seconds, "rows": rows},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
