"""Issue 11, "nothing lost, nobody locked out": connection budgets against real `vkserve serve`
subprocesses (small limits keep them fast), and the pieces in-process.

- silent unauthenticated TCP connections have their own budget (per address too) and never
  take places of Unix or authenticated clients;
- wrong tokens are throttled per address and logged sparingly (the metric counts them all);
- a frame must arrive within ``server.frame_timeout`` (a slowloris is closed);
- partial big frames share ``server.max_buffered_bytes``: RSS stays bounded, small requests
  flow, and the decoder never allocates what a header merely claims.
"""

from __future__ import annotations

import re
import signal
import socket
import struct
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Self

import numpy as np
import pytest
import trio
import trio.testing

from tests.support.daemon import (
    TOKEN,
    Daemon,
    Launch,
    Raw,
    make_repository,
    req,
    status,
)
from vkserve.client import Client
from vkserve.client.framing import FrameDecoder
from vkserve.daemon.config import ConfigError, parse_config
from vkserve.daemon.limits import AuthThrottle, BufferBudget, address_key

MiB = 1024 * 1024


def _daemon(tmp_path: Path, launch: Launch, server: str = "", *, tcp: bool = True) -> Daemon:
    repo = make_repository(tmp_path / "repo", slow=False)
    sock = tmp_path / "vk.sock"
    tcp_lines = f'tcp = "127.0.0.1:0"\ntoken = "{TOKEN}"\n' if tcp else ""
    return launch(tmp_path, f"""
[server]
socket = "{sock}"
{tcp_lines}{server}
[models]
repository = "{repo}"
""")


def _rejected(d: Daemon) -> dict[str, float]:
    assert d.metrics_port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m[1]: float(m[2]) for m in
            re.finditer(r'^vkserve_rejected_requests_total\{reason="([^"]+)"\} (\S+)$', text, re.MULTILINE)}


def _rss(d: Daemon) -> int:
    for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _infer_ok(client: Client) -> None:
    x = np.load(Path(__file__).resolve().parents[2] / "vkserve/examples/digits/samples/3.npy")
    out = client.infer("digits", {"data": x})
    assert int(np.argmax(out["prob"])) == 3


class SilentFlood:
    """A thread that keeps opening TCP connections that never send a byte (from several local
    addresses), as an attacker reconnecting after every timeout or eviction does."""

    def __init__(self, addr: tuple[str, int], sources: list[str], keep: int = 120) -> None:
        self.addr, self.sources, self.keep = addr, sources, keep
        self.opened = 0
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                s = socket.create_connection(self.addr, timeout=5,
                                             source_address=(self.sources[i % len(self.sources)], 0))
            except OSError:
                time.sleep(0.05)
                continue
            i += 1
            self.opened += 1
            self._socks.append(s)
            if len(self._socks) > self.keep:
                self._socks.pop(0).close()
            time.sleep(0.005)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self._socks:
            s.close()


# ------------------------------------------------------------------------------ item 1


def test_silent_unauthenticated_tcp_connections_lock_out_nobody(tmp_path: Path,
                                                               launch_daemon: Launch) -> None:
    """Before: silent TCP connections took the places of `max_connections` and Unix infers
    failed with UNAVAILABLE. Now they have their own budget (the oldest makes room for a newer
    one), Unix clients and clients with the token get in, and a connection that authenticates
    while `max_connections` is full is refused with the clear error."""
    d = _daemon(tmp_path, launch_daemon, "max_connections = 8\n")
    assert d.tcp is not None
    host, port = d.tcp
    with SilentFlood((host, port), [f"127.0.0.{i}" for i in range(2, 10)]) as flood:
        while flood.opened < 60:
            time.sleep(0.05)
        s = status(d)["server"]
        assert s["unauthenticated_connections"] <= 16, s
        locals_ = [Client.connect(f"unix:{d.socket}") for _ in range(5)]
        try:
            for k in range(30):  # every local infer is served
                _infer_ok(locals_[k % len(locals_)])
            # clients with the token get in (each from 127.0.0.1, the flood's own address
            # too: its connections make room for newer ones, and a client authenticates at once)
            tcp_clients = [Client.connect(f"{host}:{port}", token=TOKEN) for _ in range(2)]
            for c in tcp_clients:
                _infer_ok(c)
            with Raw(tcp=(host, port), source="127.0.0.2") as r:
                r.send(req(1, "auth", token=TOKEN))
                assert r.recv().ok
                r.send(req(2, "ping"))
                assert r.recv().ok
            end = time.monotonic() + 10  # until the daemon saw that Raw connection go
            while (s := tcp_clients[0].status()["server"])["connections"] - s["unauthenticated_connections"] > 7:
                assert time.monotonic() < end, s
                time.sleep(0.02)
            # 5 Unix + 2 TCP = 7 of 8
            # one more local client fits, the next one does not
            extra = Client.connect(f"unix:{d.socket}")
            _infer_ok(extra)
            with Raw(d.socket) as r:
                answers = r.read_to_eof()
                assert [(a.id, a.error.code) for a in answers] == [(0, "UNAVAILABLE")]
                assert "too many connections (limit 8)" in answers[0].error.message
            with Raw(tcp=(host, port)) as r:  # authenticated, but no place: refused, clearly
                r.send(req(1, "auth", token=TOKEN))
                a = r.recv()
                assert a.id == 1 and a.error.code == "UNAVAILABLE"
                assert "too many connections (limit 8)" in a.error.message
                assert r.read_to_eof() == []
            extra.close()
            for c in tcp_clients:
                c.close()
        finally:
            for c in locals_:
                c.close()
        opened = flood.opened
    assert opened > 24  # the flood went on the whole time
    rejected = _rejected(d)
    assert rejected.get("too_many_unauthenticated", 0) > 0, rejected


def test_unauthenticated_budget_per_address(tmp_path: Path, launch_daemon: Launch) -> None:
    """One address holds at most `max_unauthenticated_per_address`: its fifth silent
    connection closes its oldest (answered UNAVAILABLE), the other addresses keep theirs."""
    d = _daemon(tmp_path, launch_daemon, "max_unauthenticated_per_address = 2\n")
    assert d.tcp is not None
    other = Raw(tcp=d.tcp, source="127.0.0.3")
    mine = [Raw(tcp=d.tcp, source="127.0.0.2") for _ in range(2)]
    try:
        time.sleep(0.3)
        assert status(d)["server"]["unauthenticated_connections"] == 3
        newest = Raw(tcp=d.tcp, source="127.0.0.2")
        answers = mine[0].read_to_eof()
        assert [(a.id, a.error.code) for a in answers] == [(0, "UNAVAILABLE")]
        assert "from 127.0.0.2 (limit 2)" in answers[0].error.message
        newest.send(req(1, "auth", token=TOKEN))  # the newer ones live on
        assert newest.recv().ok
        other.send(req(1, "auth", token=TOKEN))
        assert other.recv().ok
        newest.sock.close()
    finally:
        other.sock.close()
        for r in mine:
            r.sock.close()


def test_wrong_token_flood_is_throttled_and_logged_sparingly(tmp_path: Path,
                                                             launch_daemon: Launch) -> None:
    """Before: ~2,000 wrong tokens a second, one WARNING each. Now an address gets a burst of 5
    then `auth_failures_per_second` (2), one WARNING per 5 s says how many were left out, the
    metric counts every one, and clients from other addresses are not slowed down."""
    d = _daemon(tmp_path, launch_daemon)
    assert d.tcp is not None
    wrong = [0]
    stop = threading.Event()

    def attacker() -> None:
        while not stop.is_set():
            try:
                with Raw(tcp=d.tcp) as r:
                    r.send(req(1, "auth", token="x" * 26))
                    a = r.recv(timeout=15)
                    if a is not None and a.error is not None and a.error.message == "wrong token":
                        wrong[0] += 1
            except (OSError, AssertionError):
                pass

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(6)]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(1.0)
    t0 = time.monotonic()  # meanwhile, a client with the token from another address
    with Raw(tcp=d.tcp, source="127.0.0.2") as r:
        r.send(req(1, "auth", token=TOKEN))
        assert r.recv().ok
    assert time.monotonic() - t0 < 1.0
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join(20)
    elapsed = time.monotonic() - start
    assert 3 <= wrong[0] <= 5 + 2 * elapsed + 2, (wrong[0], elapsed)
    assert _rejected(d).get("unauthenticated", 0) >= wrong[0]
    end = time.monotonic() + 10
    while "more wrong tokens in the last 5 s, not logged" not in d.log_text():
        assert time.monotonic() < end, d.log_text()[-3000:]
        time.sleep(0.2)
    lines = [ln for ln in d.log_text().splitlines() if "wrong token" in ln]
    assert all("WARNING" in ln for ln in lines)
    assert 1 <= len(lines) <= 4, lines
    logged = sum(": wrong token" in ln for ln in lines)
    left_out = sum(int(n) for n in re.findall(r"(\d+) more wrong tokens", "\n".join(lines)))
    assert logged + left_out >= wrong[0]  # each one is in a line or in a count


# ------------------------------------------------------------------------------ item 7


def test_slowloris_frame_is_closed_after_frame_timeout(tmp_path: Path,
                                                       launch_daemon: Launch) -> None:
    """Before: the idle timer restarted with every byte, so one byte every 0.25 s held a frame
    (and its buffer and place) forever. Now the frame must be whole within frame_timeout."""
    d = _daemon(tmp_path, launch_daemon, "frame_timeout = 1.5\n", tcp=False)
    with Raw(d.socket) as r:
        stop = threading.Event()

        def drip() -> None:
            r.sock.sendall(struct.pack(">I", 200))
            while not stop.wait(0.25):
                try:
                    r.sock.sendall(b"\x00")
                except OSError:
                    return

        start = time.monotonic()
        t = threading.Thread(target=drip, daemon=True)
        t.start()
        try:
            answers = r.read_to_eof(timeout=10)
        finally:
            stop.set()
            t.join()
        took = time.monotonic() - start
    assert [(a.id, a.error.code) for a in answers] == [(0, "BAD_REQUEST")]
    assert "server.frame_timeout (1.5 s)" in answers[0].error.message
    assert 1.3 < took < 4, took
    with Client.connect(f"unix:{d.socket}") as c:  # the daemon serves on
        _infer_ok(c)
    assert _rejected(d).get("frame_timeout") == 1


def _push(socks: list[socket.socket], each: int, patience: float = 1.0) -> list[int]:
    """Send up to ``each`` payload bytes on every socket (non-blocking) until none makes
    progress for ``patience`` seconds; bytes sent per socket."""
    chunk = memoryview(bytes(64 * 1024))
    sent = [0] * len(socks)
    for s in socks:
        s.setblocking(False)
    last = time.monotonic()
    while time.monotonic() - last < patience and min(sent) < each:
        moved = False
        for i, s in enumerate(socks):
            if sent[i] < each:
                try:
                    sent[i] += s.send(chunk[: min(len(chunk), each - sent[i])])
                    moved = True
                except BlockingIOError:
                    pass
        if moved:
            last = time.monotonic()
        else:
            time.sleep(0.02)
    return sent


def test_partial_big_frames_stay_within_the_buffer_budget(tmp_path: Path,
                                                          launch_daemon: Launch) -> None:
    """Before: every connection buffered its partial frame (24 x 6 MiB here, ~+150 MB RSS).
    Now big frames reserve their size from max_buffered_bytes (16 MiB) before they are read:
    the others wait unread, RSS stays within the budget, small requests are served, and when
    the stalled frames time out the budget is free for a big frame again."""
    d = _daemon(tmp_path, launch_daemon, "max_frame_size = 8388608\n"
                "max_buffered_bytes = 16777216\nframe_timeout = 4.0\n", tcp=False)
    with Client.connect(f"unix:{d.socket}") as c:  # warm up, big frame included
        _infer_ok(c)
    with Raw(d.socket) as r:
        r.send(req(1, "ping", pad=b"x" * (7 * MiB)))
        assert r.recv().ok
    time.sleep(0.3)
    before = _rss(d)
    socks = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(24)]
    try:
        for s in socks:
            s.connect(str(d.socket))
            s.sendall(struct.pack(">I", 8 * MiB))
        started = time.monotonic()
        sent = _push(socks, 6 * MiB)
        assert sum(sent) < 24 * 6 * MiB  # backpressure: most of them could not send it all
        grown = _rss(d) - before
        server = status(d)["server"]
        assert server["buffered_bytes_reserved"] <= 16 * MiB, server
        assert grown < 40 * MiB, f"RSS grew {grown / MiB:.0f} MiB; sent {[n // MiB for n in sent]}"
        t0 = time.monotonic()
        with Client.connect(f"unix:{d.socket}") as c:  # a normal client is served meanwhile
            _infer_ok(c)
        assert time.monotonic() - t0 < 2.0
        answers = []
        for s in socks:  # every stalled frame ends with the error frame (reserved or not)
            s.setblocking(True)
            s.settimeout(15)
            dec = FrameDecoder()
            while (msg := dec.next_message()) is None:
                data = s.recv(65536)
                assert data, "closed without the error frame"
                dec.feed(data)
            answers.append(msg["error"]["message"])
        assert time.monotonic() - started < 12
        assert all("server.frame_timeout (4 s)" in m for m in answers), answers[:3]
    finally:
        for s in socks:
            s.close()
    with Raw(d.socket) as r:  # the budget is free again
        r.send(req(2, "ping", pad=b"x" * (7 * MiB)))
        assert r.recv().ok
    assert status(d)["server"]["buffered_bytes_reserved"] == 0
    assert _rejected(d).get("frame_timeout") == 24


def test_drain_does_not_wait_for_frames_waiting_for_buffer_space(tmp_path: Path,
                                                                 launch_daemon: Launch) -> None:
    """SIGTERM: a connection waiting for buffer space (its frame unread) gets the goodbye and
    closes at once, as does the one whose frame is half read; the daemon exits 0 quickly."""
    d = _daemon(tmp_path, launch_daemon, "max_frame_size = 1048576\n"
                "max_buffered_bytes = 1048576\n", tcp=False)
    with Raw(d.socket) as reading, Raw(d.socket) as waiting:
        reading.send(struct.pack(">I", MiB) + bytes(300_000))
        time.sleep(0.3)
        waiting.send(struct.pack(">I", MiB) + bytes(1000))
        time.sleep(0.3)
        assert status(d)["server"]["buffered_bytes_reserved"] == MiB
        start = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        for r in (reading, waiting):
            answers = r.read_to_eof(timeout=10)
            assert [(a.id, a.error.code) for a in answers] == [(0, "UNAVAILABLE")], answers
        assert d.proc.wait(10) == 0
        assert time.monotonic() - start < 5


# ------------------------------------------------------------------------------ in-process


def test_decoder_allocates_nothing_for_a_claimed_length() -> None:
    dec = FrameDecoder(1 << 31)
    tracemalloc.start()
    try:
        dec.feed(struct.pack(">I", (1 << 31) - 1) + b"abc")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 and dec.buffered == 7 and dec.frame_size == 4 + (1 << 31) - 1
    assert dec.next_message() is None


def test_buffer_budget_is_fifo_and_cancellation_safe() -> None:
    async def main() -> None:
        budget = BufferBudget(10)
        order: list[str] = []
        await budget.acquire(8)

        async def take(name: str, n: int) -> None:
            await budget.acquire(n)
            order.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, "big", 6)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(take, "small", 1)  # fits, but waits behind "big"
            with trio.CancelScope() as gone:
                gone.cancel()
                await budget.acquire(9)  # cancelled while waiting: leaves no trace
            await trio.testing.wait_all_tasks_blocked()
            assert order == [] and budget.used == 8  # "small" would fit: it waits its turn
            budget.release(8)
        assert sorted(order) == ["big", "small"] and budget.used == 7

    trio.run(main)


def test_auth_throttle_spends_only_wrong_tokens() -> None:
    async def main() -> None:
        throttle = AuthThrottle(rate=2.0, burst=5)
        start = trio.current_time()
        for _ in range(5):
            await throttle.acquire("a")
            throttle.refund("a")  # right tokens: never a wait
        assert trio.current_time() - start < 0.01
        for _ in range(7):  # wrong ones: 5 at once, then 2 a second
            await throttle.acquire("a")
        assert 0.9 < trio.current_time() - start < 1.2
        t = trio.current_time()
        await throttle.acquire("b")  # another address is not slowed down
        assert trio.current_time() - t < 0.01

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize(("host", "key"), [
    ("203.0.113.9", "203.0.113.9"),
    ("::ffff:203.0.113.9", "203.0.113.9"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_address_key(host: str, key: str) -> None:
    assert address_key(host) == key


@pytest.mark.parametrize(("text", "message"), [
    ("[server]\nmax_unauthenticated = 0\n", "server.max_unauthenticated: must be > 0"),
    ("[server]\nmax_unauthenticated_per_address = -1\n",
     "server.max_unauthenticated_per_address: must be > 0"),
    ("[server]\nauth_failures_per_second = 0\n", "server.auth_failures_per_second: must be > 0"),
    ("[server]\nframe_timeout = '1m'\n", "server.frame_timeout: expected float, got str"),
    ("[server]\nmax_buffered_bytes = 1000\n", "server.max_buffered_bytes: must be >= server.max_frame_size"),
])
def test_new_limits_are_validated(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^cfg.toml: " + re.escape(message)):
        parse_config(text, "cfg.toml")
    cfg = parse_config("[server]\nmax_frame_size = 1000\nmax_buffered_bytes = 1000\n")
    assert cfg.server.max_buffered_bytes == 1000
