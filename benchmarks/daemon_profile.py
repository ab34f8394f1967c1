"""Where a sequential request's time goes: the daemon's per-request path, stage by stage.

    python benchmarks/daemon_profile.py [--devices cpu|gpu] [--requests N] [--py-spy PATH]
        [--raw OUT.txt] [--json OUT.json]

Runs the digits example (a tiny model, so the path around the run dominates) and measures,
with one sync client and N sequential requests each:
- ``ping`` round trip over the Unix socket (framing, the event loop, the socket: the floor);
- ``infer`` round trip and the run time the replies carry;
- the same model through ``Scheduler.infer`` in this process (no socket, no connection code);
- the same model's ``run_batch`` called directly (the engine alone, no scheduler);
and, with ``--py-spy``, samples the daemon during the infer requests (non-blocking, 1 kHz):
per-thread busy/idle shares and the busiest frames of the event-loop thread. The event loop's
own CPU time per request (its thread's, from /proc) is given beside the wall-clock figures: it
varies far less than they do on a machine shared with other work.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon_harness import start_daemon  # noqa: E402
from benchmarks.daemon_overhead import cpu_seconds, digits_repository  # noqa: E402
from benchmarks.timing import median_ms  # noqa: E402
from vkserve.client import Client  # noqa: E402
from vkserve.scheduler import ModelRepository, Scheduler  # noqa: E402
from vkserve.scheduler.reports import ModelState  # noqa: E402

#: leaf frames where a thread waits rather than works
_IDLE = ("get_events", "_epoll_wait", "SimpleQueue.get", "Condition.wait", "Event.wait",
         "_thread_cache.py:211", "acquire", "wait (threading.py")


def loop_cpu_seconds(pid: int) -> float:
    """CPU seconds of the daemon's main thread (its trio loop) so far."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def in_process(repo: Path, x: np.ndarray, n: int) -> dict[str, float]:
    """Scheduler.infer and the engine's run_batch, sequential, in this process."""
    out: dict[str, float] = {}

    async def main() -> None:
        scheduler = Scheduler(repository=ModelRepository(repo))
        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
            await scheduler.wait_until(
                lambda: all(m.state is ModelState.READY for m in scheduler.models()))
            for _ in range(100):
                await scheduler.infer("digits", {"data": x})
            times, runs = [], []
            for _ in range(n):
                t0 = time.perf_counter()
                result = await scheduler.infer("digits", {"data": x})
                times.append(time.perf_counter() - t0)
                runs.append(result.run_seconds)
            out["scheduler_infer_ms"] = statistics.median(times) * 1e3
            out["scheduler_run_ms"] = statistics.median(runs) * 1e3
            await scheduler.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
    return out


def summarize(raw: Path) -> dict[str, object]:
    """py-spy's raw (collapsed) stacks -> busy share per thread, busiest loop frames."""
    busy: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    frames: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        thread = parts[0].split(": ", 1)[-1]
        n = int(count)
        total[thread] += n
        if len(parts) == 1 or any(mark in parts[-1] for mark in _IDLE):
            continue  # waiting (no Python frame: blocked in native code, or for the GIL)
        busy[thread] += n
        if thread.startswith("MainThread"):
            for frame in set(parts[1:]):
                frames[frame] += n
    return {"threads": {t: {"samples": total[t], "busy": busy[t]} for t in total},
            "loop_frames_inclusive": frames.most_common(40)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--py-spy", type=Path, help="py-spy executable: sample the daemon")
    ap.add_argument("--raw", type=Path, help="keep py-spy's raw stacks in this file (default: a temporary one)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    x = np.load(ROOT / "vkserve/examples/digits/samples/3.npy").astype(np.float32)
    n = args.requests
    result: dict[str, object] = {"machine": f"{os.uname().machine}, {os.cpu_count()} cores",
                                 "devices": args.devices, "requests": n}
    with tempfile.TemporaryDirectory() as d:
        repo = digits_repository(Path(d), args.devices)
        raw = args.raw or Path(d) / "py_spy_raw.txt"
        proc, sock = start_daemon(Path(d), repo)
        try:
            with Client.connect(f"unix:{sock}") as c:
                for _ in range(200):
                    c.infer("digits", {"data": x})
                    c.ping()
                result["ping_ms"] = median_ms(c.ping, n, warmup=0)
                spy = None
                if args.py_spy is not None:
                    spy = subprocess.Popen([str(args.py_spy), "record", "-r", "1000", "--nonblocking",
                                            "--threads", "--idle", "-f", "raw", "-o", str(raw),
                                            "-p", str(proc.pid)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1.0)
                before, loop_before = cpu_seconds(proc.pid), loop_cpu_seconds(proc.pid)
                runs: list[float] = []

                def infer() -> None:
                    runs.append(c.infer_detailed("digits", {"data": x}).run_seconds or 0.0)

                result["infer_ms"] = median_ms(infer, n, warmup=0)
                result["daemon_cpu_ms_per_infer"] = (cpu_seconds(proc.pid) - before) / n * 1e3
                result["loop_cpu_ms_per_infer"] = (loop_cpu_seconds(proc.pid) - loop_before) / n * 1e3
                result["daemon_run_ms"] = statistics.median(runs) * 1e3
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        result.update(in_process(repo, x, n))
        if args.py_spy is not None and raw.exists():
            result["py_spy"] = summarize(raw)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
