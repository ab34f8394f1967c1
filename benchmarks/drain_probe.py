"""Answers during a drain: requests sent after SIGTERM, answered ok / UNAVAILABLE / lost.

    python benchmarks/drain_probe.py [--connections 16] [--in-flight 4] [--delay 0.2]
                                     [--interval 0.002] [--json OUT]

Starts `vkserve serve` (benchmarks/daemon_harness.py) with the `slow` model on the CPU, every
run slowed by ``--delay`` seconds (the daemon's test hook), then SIGTERM in two scenarios:

- stream: one connection, one slow request in flight at SIGTERM, then a request every
  ``--interval`` seconds on the same connection;
- pool: ``--connections`` connections, each keeping ``--in-flight`` requests in flight
  (every answer is replaced by a new request), SIGTERM once all of them are in flight.

Clients behave as the protocol asks (vkserve/client/messages.py): they send until the
daemon's goodbye (an id-0 UNAVAILABLE frame), then close their sending side and read to EOF;
a client that never gets one sends until EOF or a broken pipe. "lost" counts requests sent
(written whole to the socket) without an answer when the connection ended.
"""

from __future__ import annotations

import argparse
import json
import selectors
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon_harness import start_daemon
from tests.support.daemon import SLOW_SHAPE, write_slow_model
from vkserve.client import Client
from vkserve.client.protocol import FrameDecoder, encode_frame, encode_tensors, parse_response

_INPUTS = encode_tensors({"data": np.zeros(SLOW_SHAPE, np.float32)})


def _request(rid: int) -> bytes:
    return encode_frame({"v": 1, "id": rid, "op": "infer", "model": "slow", "inputs": _INPUTS})


@dataclass(eq=False)
class Conn:
    """One raw connection and what happened on it."""

    sock: socket.socket
    decoder: FrameDecoder = field(default_factory=lambda: FrameDecoder(2**31))
    next_id: int = 1
    pending: set[int] = field(default_factory=set)
    sent: int = 0
    sent_after_term: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    goodbye: bool = False
    write_closed: bool = False
    eof: bool = False

    def send(self, after_term: bool) -> bool:
        """One slow request; False once the connection cannot take more."""
        if self.goodbye or self.write_closed or self.eof:
            return False
        rid = self.next_id
        self.next_id += 1
        try:
            self.sock.sendall(_request(rid))
        except OSError:  # broken pipe, reset: the daemon closed; this one was never sent
            self.write_closed = True
            return False
        self.pending.add(rid)
        self.sent += 1
        self.sent_after_term += after_term
        return True

    def read(self) -> list[int]:
        """Read what is there; returns the ids answered (goodbye handled here)."""
        try:
            data = self.sock.recv(1 << 20)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return []
        self.decoder.feed(data)
        done = []
        while (msg := self.decoder.next_message()) is not None:
            r = parse_response(msg)
            if r.id == 0:
                self.answers[f"id0 {r.error.code if r.error else 'ok'}"] += 1
                if r.error is not None and r.error.code == "UNAVAILABLE" and not self.goodbye:
                    self.goodbye = True  # the daemon closes: send nothing more
                    self._close_write()
                continue
            self.pending.discard(r.id)
            self.answers["ok" if r.ok else str(r.error.code)] += 1
            done.append(r.id)
        return done

    def _close_write(self) -> None:
        if not self.write_closed:
            self.write_closed = True
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def _wait_in_flight(sock_path: Path, n: int, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    with Client.connect(f"unix:{sock_path}") as c:
        while time.monotonic() < end:
            if c.status()["server"]["infer_in_flight"] >= n:
                return
            time.sleep(0.01)
    raise SystemExit(f"never {n} requests in flight")


def run_scenario(name: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    repo = tmp / "models"
    write_slow_model(repo)
    proc, sock_path = start_daemon(
        tmp, repo, env={"VKSERVE_TEST_DEVICE_DELAY": f"cpu={args.delay}"},
        server=f"drain_timeout = {args.drain_timeout}\nmax_requests_per_connection = 1024",
        scheduler="queue_limit_per_model = 4096")
    stream = name == "stream"
    n_conn, keep = (1, 1) if stream else (args.connections, args.in_flight)
    conns = []
    for _ in range(n_conn):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(sock_path))
        s.settimeout(30)
        conns.append(Conn(s))
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
        for _ in range(keep):
            c.send(after_term=False)
    _wait_in_flight(sock_path, n_conn * keep)
    term_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    next_tick = term_at
    open_conns = set(conns)
    while open_conns:
        now = time.monotonic()
        if now - term_at > args.limit:
            break
        if stream and now >= next_tick:
            conns[0].send(after_term=True)
            next_tick = now + args.interval
        timeout = max(0.0, next_tick - now) if stream and not conns[0].goodbye else 0.5
        for key, _ in sel.select(timeout):
            c = key.data
            for _rid in c.read():
                if not stream:
                    c.send(after_term=True)  # keep `keep` in flight until the goodbye
            if c.eof:
                sel.unregister(c.sock)
                open_conns.discard(c)
    exit_code = proc.wait(60)
    drain_s = time.monotonic() - term_at
    for c in conns:
        c.sock.close()
    answers: Counter[str] = Counter()
    for c in conns:
        answers.update(c.answers)
    sent = sum(c.sent for c in conns)
    answered = sum(v for k, v in answers.items() if not k.startswith("id0"))
    return {
        "scenario": name,
        "connections": n_conn,
        "in_flight_each": keep,
        "sent": sent,
        "sent_after_sigterm": sum(c.sent_after_term for c in conns),
        "ok": answers.get("ok", 0),
        "unavailable": answers.get("UNAVAILABLE", 0),
        "other_errors": answered - answers.get("ok", 0) - answers.get("UNAVAILABLE", 0),
        "lost": sum(len(c.pending) for c in conns),
        "goodbyes": sum(c.goodbye for c in conns),
        "unfinished_connections": len(open_conns),
        "drain_seconds": round(drain_s, 3),
        "exit_code": exit_code,
    }


COLUMNS = ["scenario", "connections", "in_flight_each", "sent", "sent_after_sigterm", "ok",
           "unavailable", "other_errors", "lost", "goodbyes", "drain_seconds", "exit_code"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--delay", type=float, default=0.2, help="seconds added to every run")
    ap.add_argument("--interval", type=float, default=0.002, help="stream: seconds between requests")
    ap.add_argument("--drain-timeout", type=float, default=20.0)
    ap.add_argument("--limit", type=float, default=60.0, help="give up after this many seconds")
    ap.add_argument("--scenarios", default="stream,pool")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    for name in args.scenarios.split(","):
        with tempfile.TemporaryDirectory(prefix="vkdrain") as tmp:
            rows.append(run_scenario(name, Path(tmp), args))
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    print("  ".join(c.rjust(widths[c]) for c in COLUMNS))
    for r in rows:
        print("  ".join(str(r[c]).rjust(widths[c]) for c in COLUMNS))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows},
                                        indent=2) + "\n")
    return 1 if any(r["lost"] or r["exit_code"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
