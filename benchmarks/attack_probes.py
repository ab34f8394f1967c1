"""What abusive clients cost the daemon, with its default limits (issue 11).

    python benchmarks/attack_probes.py [--json OUT] [--slowloris 200] [--partial 64]
                                       [--preauth 300] [--seconds 10] [--slowloris-seconds S]

Starts `vkserve serve` (benchmarks/daemon_harness.py) with the digits example on the CPU, a
Unix socket and TCP with a token, default limits otherwise, and measures one probe at a time:

- slowloris: N Unix connections each send the header of a max-size frame, then 1 byte a
  second; the daemon's RSS (VmRSS, and VmHWM the peak) and how many it still holds at the end;
- partial frames: N Unix connections each send the first MiBs of a 64 MiB frame (as much as
  the daemon reads) and stall; RSS, the bytes it accepted, and a local infer meanwhile;
- pre-auth flood: N silent TCP connections (from 127.0.0.2..11; one closed by the daemon is
  opened again at once) while a local client sends requests over the Unix socket, a new
  connection each (as `vkserve infer` does): requests ok/failed and their p50/p99;
- wrong tokens: 16 threads try tokens over TCP for a few seconds: attempts answered a second.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon_harness import start_daemon
from benchmarks.daemon_overhead import digits_repository
from vkserve.client import Client
from vkserve.client.protocol import FrameDecoder, encode_frame

TOKEN = "attack-probe-token-0123456789"
MiB = 1024 * 1024
FRAME = 64 * MiB  # the default max_frame_size
SAMPLE = np.load(ROOT / "vkserve/examples/digits/samples/3.npy").astype(np.float32)


def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def local_infer(sock: Path) -> float:
    """One request on a new Unix connection; its seconds (raises on failure)."""
    t0 = time.perf_counter()
    with Client.connect(f"unix:{sock}", connect_timeout=10) as c:
        c.infer("digits", {"data": SAMPLE}, timeout=10)
    return time.perf_counter() - t0


def server_status(sock: Path) -> dict[str, Any]:
    with Client.connect(f"unix:{sock}") as c:
        return c.status()["server"]


def open_unix(sock: Path, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(sock))
        out.append(s)
    return out


def closed_by_daemon(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the daemon answered or closed (readable)."""
    n = 0
    for s in socks:
        r, _, _ = select.select([s], [], [], 0)
        n += bool(r)
    return n


def probe_slowloris(sock: Path, pid: int, n: int, seconds: float) -> dict[str, Any]:
    base, _ = memory(pid)
    socks = open_unix(sock, n)
    for s in socks:
        s.sendall(struct.pack(">I", FRAME))
        s.setblocking(False)
    peak = base
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s in socks:
            try:
                s.send(b"\0")
            except OSError:
                pass
        peak = max(peak, memory(pid)[0])
        time.sleep(1.0)
    infer_ms = local_infer(sock) * 1e3
    held = n - closed_by_daemon(socks)
    for s in socks:
        s.close()
    return {"connections": n, "seconds": seconds, "rss_before_mib": base / MiB,
            "rss_peak_mib": peak / MiB, "rss_growth_mib": (peak - base) / MiB,
            "still_open": held, "local_infer_ms": infer_ms}


def probe_partial(sock: Path, pid: int, n: int, each: int, hold: float) -> dict[str, Any]:
    base, _ = memory(pid)
    socks = open_unix(sock, n)
    for s in socks:
        s.sendall(struct.pack(">I", FRAME))
        s.setblocking(False)
    chunk = memoryview(bytes(256 * 1024))
    sent = [0] * n
    peak = base
    last = time.monotonic()
    while time.monotonic() - last < 2.0 and min(sent) < each:  # until nobody makes progress
        moved = False
        for i, s in enumerate(socks):
            if sent[i] < each:
                try:
                    sent[i] += s.send(chunk[: min(len(chunk), each - sent[i])])
                    moved = True
                except BlockingIOError:
                    pass
                except OSError:
                    sent[i] = each
        if moved:
            last = time.monotonic()
            peak = max(peak, memory(pid)[0])
        else:
            time.sleep(0.02)
    end = time.monotonic() + hold
    while time.monotonic() < end:
        peak = max(peak, memory(pid)[0])
        time.sleep(0.25)
    status = server_status(sock)
    try:
        infer_ms: float | None = local_infer(sock) * 1e3
    except Exception:  # noqa: BLE001 (reported as a failure)
        infer_ms = None
    _, hwm = memory(pid)
    for s in socks:
        s.close()
    return {"connections": n, "frame_mib": FRAME / MiB, "tried_mib_each": each / MiB,
            "sent_mib_total": sum(sent) / MiB, "rss_before_mib": base / MiB,
            "rss_peak_mib": peak / MiB, "rss_growth_mib": (peak - base) / MiB,
            "vmhwm_mib": hwm / MiB,
            "reserved_mib": status.get("buffered_bytes_reserved", 0) / MiB,
            "local_infer_ms": infer_ms}


class SilentFlood:
    """Keeps ``n`` silent TCP connections open from the client's side: one the daemon answers
    or closes is closed and opened again at once."""

    def __init__(self, addr: tuple[str, int], n: int) -> None:
        self.addr, self.n = addr, n
        self.sources = [f"127.0.0.{i}" for i in range(2, 12)]
        self.connects = 0
        self.failed_connects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket | None:
        src = self.sources[self.connects % len(self.sources)]
        self.connects += 1
        try:
            return socket.create_connection(self.addr, timeout=5, source_address=(src, 0))
        except OSError:
            self.failed_connects += 1
            return None

    def _run(self) -> None:
        socks = [s for s in (self._open() for _ in range(self.n)) if s is not None]
        while not self._stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.1) if socks else ([], [], [])
            for s in ready:
                socks.remove(s)
                s.close()
            while len(socks) < self.n and not self._stop.is_set():
                s = self._open()
                if s is None:
                    time.sleep(0.05)
                    break
                socks.append(s)
        for s in socks:
            s.close()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def requests_for(sock: Path, seconds: float) -> dict[str, Any]:
    ok, failed, times, errors = 0, 0, [], set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            times.append(local_infer(sock))
            ok += 1
        except Exception as exc:  # noqa: BLE001 (counted and named)
            failed += 1
            errors.add(str(exc)[:100])
            time.sleep(0.01)
    ms = sorted(t * 1e3 for t in times)
    return {"ok": ok, "failed": failed,
            "p50_ms": statistics.median(ms) if ms else None,
            "p99_ms": float(np.percentile(ms, 99)) if ms else None,
            "errors": sorted(errors)[:3]}


def probe_preauth(sock: Path, addr: tuple[str, int], n: int, seconds: float) -> dict[str, Any]:
    quiet = requests_for(sock, 3.0)
    with SilentFlood(addr, n) as flood:
        time.sleep(2.0)  # the flood is up
        during = requests_for(sock, seconds)
        try:
            status = server_status(sock)
        except Exception:  # noqa: BLE001 (the status request is one more local client)
            status = {}
        connects = flood.connects
    return {"silent_connections": n, "seconds": seconds, "attacker_connects": connects,
            "daemon_connections": status.get("connections"),
            "daemon_unauthenticated": status.get("unauthenticated_connections"),
            "quiet": quiet, "during": during}


def probe_tokens(addr: tuple[str, int], seconds: float, threads: int = 16) -> dict[str, Any]:
    answered = [0]
    stop = threading.Event()
    wrong = encode_frame({"v": 1, "id": 1, "op": "auth", "token": "x" * len(TOKEN)})

    def attacker() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(addr, timeout=15) as s:
                    s.sendall(wrong)
                    dec = FrameDecoder()
                    while (msg := dec.next_message()) is None:
                        data = s.recv(4096)
                        if not data:
                            break
                        dec.feed(data)
                    if msg is not None and msg.get("error", {}).get("message") == "wrong token":
                        answered[0] += 1
            except OSError:
                pass

    workers = [threading.Thread(target=attacker, daemon=True) for _ in range(threads)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join(20)
    took = time.monotonic() - t0
    return {"threads": threads, "seconds": round(took, 2), "wrong_tokens_answered": answered[0],
            "per_second": answered[0] / took}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fmt(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slowloris", type=int, default=200, help="slowloris connections")
    ap.add_argument("--partial", type=int, default=64, help="partial-frame connections")
    ap.add_argument("--partial-mib", type=int, default=32, help="MiB each tries to send")
    ap.add_argument("--preauth", type=int, default=300, help="silent TCP connections")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each probe")
    ap.add_argument("--slowloris-seconds", type=float,
                    help="length of the slowloris probe (default --seconds; past 60, the "
                         "default frame_timeout, the daemon has closed them)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results: dict[str, Any] = {"machine": f"{os.uname().machine}, {os.cpu_count()} cores"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        port = free_port()
        proc, sock = start_daemon(tmp, digits_repository(tmp, "cpu"),
                                  server=f'tcp = "127.0.0.1:{port}"\ntoken = "{TOKEN}"')
        try:
            local_infer(sock)
            results["slowloris"] = probe_slowloris(sock, proc.pid, args.slowloris,
                                                   args.slowloris_seconds or args.seconds)
            time.sleep(1.0)
            results["partial_frames"] = probe_partial(sock, proc.pid, args.partial,
                                                      args.partial_mib * MiB, args.seconds / 2)
            time.sleep(1.0)
            results["preauth_flood"] = probe_preauth(sock, ("127.0.0.1", port), args.preauth,
                                                     args.seconds)
            time.sleep(1.0)
            results["wrong_tokens"] = probe_tokens(("127.0.0.1", port), args.seconds / 2)
            results["daemon_log_warnings"] = sum(
                " WARNING " in ln for ln in (tmp / "daemon.log").read_text().splitlines())
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except Exception:  # noqa: BLE001
                proc.kill()
    s, p, a, t = (results[k] for k in ("slowloris", "partial_frames", "preauth_flood",
                                       "wrong_tokens"))
    rows = [
        ("slowloris", f"{s['connections']} conns, 1 B/s for {fmt(s['seconds'])} s",
         (f"RSS {fmt(s['rss_before_mib'])} -> {fmt(s['rss_peak_mib'])} MiB "
          f"(+{fmt(s['rss_growth_mib'])}); still open {s['still_open']}; "
          f"local infer {fmt(s['local_infer_ms'])} ms")),
        ("partial frames", f"{p['connections']} conns x {fmt(p['tried_mib_each'])} MiB of 64",
         (f"accepted {fmt(p['sent_mib_total'])} MiB; RSS {fmt(p['rss_before_mib'])} -> "
          f"{fmt(p['rss_peak_mib'])} MiB (+{fmt(p['rss_growth_mib'])}); reserved "
          f"{fmt(p['reserved_mib'])} MiB; local infer {fmt(p['local_infer_ms'])} ms")),
        ("pre-auth flood", f"{a['silent_connections']} silent TCP, {fmt(a['seconds'])} s",
         (f"unix requests ok {a['during']['ok']} failed {a['during']['failed']}, p50 "
          f"{fmt(a['during']['p50_ms'])} ms (quiet: {fmt(a['quiet']['p50_ms'])} ms); "
          f"daemon held {a['daemon_unauthenticated']} unauthenticated")),
        ("wrong tokens", f"{t['threads']} threads, {fmt(t['seconds'])} s",
         (f"{t['wrong_tokens_answered']} answered ({fmt(t['per_second'])}/s); "
          f"{results['daemon_log_warnings']} WARNING lines in the whole run")),
    ]
    width = max(len(r[0]) for r in rows)
    mid = max(len(r[1]) for r in rows)
    for name, setup, figures in rows:
        print(f"{name:<{width}}  {setup:<{mid}}  {figures}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
