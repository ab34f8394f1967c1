"""The one way tests start a daemon: `vkserve serve` as a subprocess (`start_daemon`), owned by
`running_daemon` (which the `launch_daemon` / `launch_module_daemon` fixtures of tests/conftest.py
use), and the helpers that talk to it (raw frames, status polling, the example and `slow` models)."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.paths import DIGITS, REPO
from vkserve.client import Client
from vkserve.client.protocol import FrameDecoder, Response, encode_frame, encode_tensors, parse_response

ROOT = REPO
TOKEN = "test-token-0123456789abcdef"
SLOW_PARAM = """7767517
3 3
Input            data   0 1 data 0=32 1=32 2=8
Convolution      conv1  1 1 data conv1 0=64 1=3 4=1 5=1 6=4608
Pooling          gap    1 1 conv1 out 0=1 4=1
"""
SLOW_CONFIG = 'random_weights = true\ndevices = "cpu"\nwarmup = 0\n'
SLOW_SHAPE = (8, 32, 32)
#: `slow` runs on the CPU, which the daemon's device test hook slows down by this much a run
#: (a sleep in the device worker: deterministic, and it leaves the cores to the other tests).
SLOW_ENV = {"VKSERVE_TEST_DEVICE_DELAY": "cpu=0.3"}
STARTUP_TIMEOUT = 90.0


# ------------------------------------------------------------------------------ daemon process


@dataclass
class Daemon:
    proc: subprocess.Popen[str]
    socket: Path
    log: Path
    lines: list[str] = field(default_factory=list)
    tcp: tuple[str, int] | None = None
    metrics_port: int | None = None
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def wait_line(self, needle: str, timeout: float = STARTUP_TIMEOUT) -> str:
        end = time.monotonic() + timeout
        for line in self.lines:
            if needle in line:
                return line
        while time.monotonic() < end:
            try:
                line = self._queue.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if needle in line:
                return line
        raise AssertionError(f"daemon never printed {needle!r}; stdout {self.lines}, "
                             f"log tail:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        try:
            return self.log.read_text()
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


#: What the `launch_daemon` / `launch_module_daemon` fixtures give: ``launch(workdir, config,
#: **start_daemon_kwargs) -> Daemon``.
Launch = Callable[..., Daemon]


def vkserve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vkserve", *args]


def start_daemon(workdir: Path, config: str, *, name: str = "daemon", wait: bool = True,
                 env: dict[str, str] | None = None, metrics_listen: str = "127.0.0.1:0",
                 wrapper: list[str] | None = None, pass_fds: tuple[int, ...] = ()) -> Daemon:
    """`vkserve serve --config` with ``config`` (a ``socket = "..."`` line is required);
    metrics on any free port unless ``metrics_listen`` says otherwise (``Daemon.metrics_port``);
    ``wrapper`` runs before the command (it ends by exec'ing it), ``pass_fds`` are inherited."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / f"{name}.toml"
    cfg.write_text(config)
    log = workdir / f"{name}.log"
    full_env = {k: v for k, v in os.environ.items() if k != "VKSERVE_TOKEN"}
    full_env.update({"PYTHONUNBUFFERED": "1", **(env or {})})
    proc = subprocess.Popen(
        [*(wrapper or []), *vkserve_cmd("serve", "--config", str(cfg),
                                        "--metrics-listen", metrics_listen)],
        cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
        pass_fds=pass_fds,
    )
    sock_line = next(ln for ln in config.splitlines() if ln.startswith("socket"))
    daemon = Daemon(proc, Path(sock_line.split("=", 1)[1].strip().strip('"')), log)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            daemon.lines.append(line.rstrip("\n"))
            daemon._queue.put(line.rstrip("\n"))
        daemon._queue.put(None)

    threading.Thread(target=pump, daemon=True).start()
    if wait:
        try:
            daemon.wait_line("send a job")
        except BaseException:  # never ready: no process left behind
            proc.kill()
            proc.wait()
            raise
        for line in daemon.lines:
            if line.startswith("vkserve: listening on tcp "):
                host, _, port = line.split()[4].rpartition(":")
                daemon.tcp = (host.strip("[]"), int(port))
            if line.startswith("vkserve: metrics on http://"):
                daemon.metrics_port = int(line.split()[3].rsplit(":", 1)[1].split("/")[0])
    return daemon


@contextmanager
def running_daemon(workdir: Path, config: str, **kwargs: Any) -> Iterator[Daemon]:
    """A daemon (``start_daemon(workdir, config, **kwargs)``) for the extent of the block.

    At the end of the block a daemon whose exit the test has not collected (``stop()``,
    ``proc.wait()``) is stopped with SIGTERM and must exit 0 (the assertion carries the log
    tail); one that does not stop in time is killed. A block left by an exception kills it."""
    d = start_daemon(workdir, config, **kwargs)
    try:
        yield d
        if d.proc.returncode is None:  # still running, or died unnoticed: a clean stop is due
            try:
                rc = d.stop()
            except subprocess.TimeoutExpired:
                raise AssertionError(f"daemon {d.log.stem} did not stop on SIGTERM (killed); "
                                     f"log tail:\n{d.log_text()[-3000:]}") from None
            assert rc == 0, f"daemon {d.log.stem} exited {rc}; log tail:\n{d.log_text()[-3000:]}"
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def make_repository(path: Path, *, digits: bool = True, slow: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if digits:
        (path / "digits").symlink_to(DIGITS)
    if slow:
        write_slow_model(path)
    return path


def write_slow_model(repo: Path, name: str = "slow", config: str = SLOW_CONFIG) -> Path:
    """Add a small random-weights model (input ``data`` of shape :data:`SLOW_SHAPE`; ``config``
    pins it to the CPU by default, where ``SLOW_ENV`` slows every run) to ``repo``."""
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.param").write_text(SLOW_PARAM)
    (folder / "config.toml").write_text(config)
    return folder


def http_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of a GET on the daemon's metrics port; HTTP errors are answers too."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(k: int) -> np.ndarray:
    return np.load(DIGITS / "samples" / f"{k}.npy")


def cpu_engine_prob(x: np.ndarray) -> np.ndarray:
    """What `vkserve run examples/digits` computes: the CPU engine on the same weights."""
    from vkserve.devices.cpu.executor import Plan
    from vkserve.models.graph import load_model

    plan = Plan(load_model(DIGITS / "model.param", DIGITS / "model.bin"))
    return plan.run({"data": x})["prob"]


# ------------------------------------------------------------------------------ raw connections


class Raw:
    """A byte-level connection for speaking (or breaking) the protocol by hand."""

    def __init__(self, path: Path | None = None, tcp: tuple[str, int] | None = None,
                 source: str | None = None) -> None:
        if tcp is not None:  # from the local address ``source`` when given (e.g. 127.0.0.2)
            self.sock = socket.create_connection(
                tcp, timeout=10, source_address=(source, 0) if source else None)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(str(path))
        self.decoder = FrameDecoder(2**31)
        self.eof = False

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, msg: dict[str, Any] | bytes) -> None:
        self.sock.sendall(msg if isinstance(msg, bytes) else encode_frame(msg))

    def recv(self, timeout: float = 10.0) -> Response | None:
        """Next response, or None at EOF (a torn final frame counts as EOF)."""
        end = time.monotonic() + timeout
        while True:
            msg = self.decoder.next_message()
            if msg is not None:
                return parse_response(msg)
            if self.eof:
                return None
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                raise AssertionError("no response from the daemon in time") from None
            if not data:
                self.eof = True
            else:
                self.decoder.feed(data)

    def until(self, rid: int, timeout: float = 10.0) -> tuple[Response, list[Response]]:
        """Read up to the response for ``rid``; also returns the ones before it."""
        seen = []
        while True:
            r = self.recv(timeout)
            assert r is not None, f"connection closed before the answer to {rid}; got {seen}"
            if r.id == rid:
                return r, seen
            seen.append(r)

    def read_to_eof(self, timeout: float = 10.0) -> list[Response]:
        out = []
        while (r := self.recv(timeout)) is not None:
            out.append(r)
        return out


def req(rid: int, op: str, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "id": rid, "op": op, **fields}


def slow_request(rid: int, **fields: Any) -> dict[str, Any]:
    x = np.zeros(SLOW_SHAPE, np.float32)
    return req(rid, "infer", model="slow", inputs=encode_tensors({"data": x}), **fields)


def digits_request(rid: int, k: int = 3) -> dict[str, Any]:
    return req(rid, "infer", model="digits", inputs=encode_tensors({"data": sample(k)}))


def status(d: Daemon) -> dict[str, Any]:
    with Client.connect(f"unix:{d.socket}") as c:
        return c.status()


def wait_status(d: Daemon, pred: Any, timeout: float = 10.0) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        s = status(d)
        if pred(s):
            return s
        if time.monotonic() > end:
            raise AssertionError(f"status never matched: {json.dumps(s, default=str)[:2000]}")
        time.sleep(0.02)


def no_work(s: dict[str, Any]) -> bool:
    return s["in_flight"] == 0 and s["queue_depth"] == 0 and s["server"]["infer_in_flight"] == 0


def wait_for(pred: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    """Poll ``pred`` every 50 ms until it is true; fail naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or pred}")
