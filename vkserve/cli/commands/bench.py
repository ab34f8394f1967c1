"""`vkserve bench`: load a running daemon and report throughput and latency percentiles."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import trio

from vkserve.cli.commands._client import add_address_arguments, run_client_command
from vkserve.cli.commands._inputs import UsageError, load_inputs
from vkserve.cli.commands.infer import random_inputs
from vkserve.cli.output import print_json
from vkserve.client import AsyncClient, Client
from vkserve.client.loadgen import BenchSettings, LevelResult, Window, sweep

NAME = "bench"
HELP = "load generator: concurrency sweep or fixed rate against a running daemon"

COLUMNS = ["mode", "level", "throughput", "items_per_s", "server_batch", "p50_ms", "p90_ms", "p95_ms",
           "p99_ms", "server_queue_ms", "server_run_ms", "requests", "windows", "stable", "errors"]


def _numbers(text: str, kind: type) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive numbers")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=lambda t: _numbers(t, int), default=None,
                      metavar="N[,N...]", help="outstanding requests per level (default 1,4,16)")
    load.add_argument("--rate", type=lambda t: _numbers(t, float), default=None,
                      metavar="R[,R...]", help="requests per second per level")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=file.npy")
    parser.add_argument("--batch", type=int, default=1, metavar="N",
                        help="send each request as a client batch of N items (a leading batch "
                             "dimension; the model's max_batch_size bounds N)")
    parser.add_argument("--inline", action="store_true",
                        help="keep large tensors in the frames on a Unix socket (default: shared "
                             "memory from 64 KiB)")
    parser.add_argument("--window", type=float, default=2.0, metavar="SECONDS",
                        help="measurement window (default 2)")
    parser.add_argument("--max-windows", type=int, default=10)
    parser.add_argument("--stable-windows", type=int, default=3,
                        help="windows that must agree within --tolerance (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.1)
    parser.add_argument("--json", action="store_true",
                        help="print the results as one JSON object on stdout (no table, no "
                             "progress lines)")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="write the results as CSV")
    parser.add_argument("--plot", type=Path, metavar="FILE.png",
                        help="latency vs throughput plot (needs matplotlib: pip install "
                             "'vkserve[plot]')")
    add_address_arguments(parser)


def format_table(results: list[LevelResult]) -> str:
    head = ["load", "req/s", "items/s", "batch", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "queue ms",
            "run ms", "requests", "stable", "errors"]
    rows = [[f"{r.mode} {r.level:g}", f"{r.throughput:.1f}", f"{r.items_per_s:.1f}",
             "-" if r.server_batch is None else f"{r.server_batch:.2f}", f"{r.p50_ms:.2f}",
             f"{r.p90_ms:.2f}", f"{r.p95_ms:.2f}", f"{r.p99_ms:.2f}",
             "-" if r.server_queue_ms is None else f"{r.server_queue_ms:.2f}",
             "-" if r.server_run_ms is None else f"{r.server_run_ms:.2f}",
             str(r.requests), "yes" if r.stable else "no",
             ",".join(f"{k}:{v}" for k, v in r.errors.items()) or "-"] for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, results: list[LevelResult]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in results:
            row = dataclasses.asdict(r)
            row["errors"] = ";".join(f"{k}={v}" for k, v in r.errors.items())
            writer.writerow({k: row[k] for k in COLUMNS})


def write_plot(path: Path, model: str, results: list[LevelResult]) -> None:
    try:
        import matplotlib  # noqa: PLC0415 (optional extra)
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'vkserve[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in ("concurrency", "rate"):
        rs = [r for r in results if r.mode == mode]
        if not rs:
            continue
        for q, style in (("p50_ms", "o-"), ("p99_ms", "s--")):
            ax.plot([r.items_per_s for r in rs], [getattr(r, q) for r in rs], style,
                    label=f"{q[:-3]} ({mode})")
        for r in rs:
            ax.annotate(f"{r.level:g}", (r.items_per_s, r.p50_ms), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
    ax.set_xlabel("throughput (inferences/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"vkserve bench: {model}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _progress(mode: str, level: float, n: int, window: Window) -> None:
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"  {mode} {level:g}: window {n}: {window.throughput:.1f} req/s, "
          f"p50 {window.p50 * 1e3:.2f} ms", end=end, file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    def body(client: Client) -> int:
        inputs = load_inputs(args.input)
        inputs.update(random_inputs(client, args.model, set(inputs), seed=0))
        if args.batch < 1:
            raise UsageError(f"--batch {args.batch}: give 1 or more")
        settings = BenchSettings(args.model, inputs, args.window, args.max_windows,
                                 args.stable_windows, args.tolerance, batch=args.batch)
        address = (f"tcp://{args.tcp}" if args.tcp and not args.tcp.startswith("tcp://")
                   else args.tcp) or (f"unix:{args.socket}" if args.socket else None)

        def connect() -> AbstractAsyncContextManager[AsyncClient]:
            return AsyncClient.connect(address, token=args.token, shared_memory=not args.inline)

        concurrencies = args.concurrency or ([] if args.rate else [1, 4, 16])
        results = trio.run(lambda: sweep(connect, settings, concurrencies=concurrencies,
                                         rates=args.rate or [],
                                         progress=None if args.json else _progress))
        if args.json:
            print_json({"model": args.model, "results": [dataclasses.asdict(r) for r in results]},
                       indent=2)
        else:
            if sys.stderr.isatty():
                print(file=sys.stderr)
            print(format_table(results))
        if args.csv:
            write_csv(args.csv, results)
        if args.plot:
            write_plot(args.plot, args.model, results)
        return 0

    return run_client_command(NAME, args, body)
