"""The daemon end to end: real `vkserve serve` subprocesses (lavapipe + CPU), both clients,
hostile byte streams, stale/live sockets, TCP tokens, disconnects and SIGTERM drains.

One daemon (module scope) serves most tests: a repository with the `digits` example (loaded
on the Vulkan device when the engine exists, else the CPU) and `slow`, a small random-weights
model pinned to the CPU, where the daemon's test hook adds 0.3 s to every run, for work that
stays in flight.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.daemon import (
    DIGITS,
    SLOW_ENV,
    SLOW_SHAPE,
    TOKEN,
    Daemon,
    Launch,
    Raw,
    cpu_engine_prob,
    digits_request,
    make_repository,
    no_work,
    req,
    sample,
    slow_request,
    status,
    wait_status,
)
from vkserve.client import AsyncClient, BadRequestError, Client, DeadlineExceeded, NotFound, Unauthenticated
from vkserve.client.protocol import (
    Response,
    encode_frame,
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("daemon")
    repo = make_repository(work / "repo")
    return launch_module_daemon(work, f"""
[server]
socket = "{work}/d.sock"
tcp = "127.0.0.1:0"
token = "{TOKEN}"
max_requests_per_connection = 32

[models]
repository = "{repo}"

[scheduler]
queue_limit_per_model = 128
""", env=SLOW_ENV)


# ------------------------------------------------------------------------------ end to end


def test_banner_names_sockets_and_example_command(daemon: Daemon) -> None:
    assert daemon.wait_line("listening on unix ").endswith(str(daemon.socket))
    assert daemon.tcp is not None and daemon.tcp[1] > 0
    line = daemon.wait_line("send a job")
    assert "vkserve infer digits --input data=" in line and "samples/3.npy" in line
    assert f"--socket {daemon.socket}" in line
    assert oct(daemon.socket.stat().st_mode & 0o777) == oct(0o660)
    # the CPU kernels were compiled (or found in their cache) before a model loaded there
    log = daemon.log.read_text()
    assert "CPU kernels ready" in log and "each model loads those it runs" in log, log[-2000:]
    assert log.index("CPU kernels ready") < log.index("ready on device cpu")


def test_sync_client_digits_match_the_cpu_engine(daemon: Daemon) -> None:
    expected = json.loads((DIGITS / "samples" / "expected.json").read_text())
    with Client.connect(f"unix:{daemon.socket}") as c:
        for k in range(10):
            x = sample(k)
            prob = c.infer("digits", {"data": x})["prob"]
            ref = cpu_engine_prob(x)
            assert prob.shape == ref.shape == (10,)
            assert int(prob.argmax()) == int(ref.argmax()) == k == expected[str(k)]["class"]
            # the daemon may run digits on lavapipe (fp32/fp16) or the bf16 CPU engine
            np.testing.assert_allclose(prob, ref, atol=2e-2)


async def test_async_client_many_in_flight(daemon: Daemon) -> None:
    results: dict[int, int] = {}
    async with AsyncClient.connect(f"unix:{daemon.socket}") as c:

        async def one(i: int) -> None:
            out = await c.infer("digits", {"data": sample(i % 10)}, priority=i % 3)
            results[i] = int(out["prob"].argmax())

        async with trio.open_nursery() as nursery:
            for i in range(30):  # the daemon's per-connection limit is 32
                nursery.start_soon(one, i)
        models = await c.models()
        st_ = await c.status()
    assert results == {i: i % 10 for i in range(30)}
    digits = next(m for m in models if m["name"] == "digits")
    assert digits["state"] == "ready" and digits["inputs"] == {"data": [1, 8, 8]}
    assert st_["server"]["connections"] >= 1 and st_["ready"] is True


def test_errors_are_answers_and_the_connection_goes_on(daemon: Daemon) -> None:
    with Client.connect(f"unix:{daemon.socket}") as c:
        with pytest.raises(NotFound):
            c.infer("no-such-model", {"data": sample(1)})
        with pytest.raises(BadRequestError):
            c.infer("digits", {"data": np.zeros((3, 8, 8), np.float32)})
        with pytest.raises(BadRequestError):
            c.infer("digits", {"wrong": sample(1)})
        with pytest.raises(NotFound):
            c.load_model("no-such-model")
        assert int(c.infer("digits", {"data": sample(7)})["prob"].argmax()) == 7
        assert c.ping() > 0


def test_cancel_op_cancels_its_target(daemon: Daemon) -> None:
    with Raw(daemon.socket) as r:
        r.send(slow_request(1))
        r.send(slow_request(2))
        r.send(req(3, "cancel", target=2))
        answer, _ = r.until(3)
        assert answer.ok and answer.result == {"cancelled": True}
        got = {x.id: x for x in [r.recv(), r.recv()]}
        assert got[2].error is not None and got[2].error.code == "CANCELLED"
        assert got[1].ok and got[1].result["outputs"]["out"]["shape"] == [64]
        r.send(req(4, "cancel", target=99))
        assert r.until(4)[0].result == {"cancelled": False}


def test_deadline_exceeded_not_a_late_answer(daemon: Daemon) -> None:
    with Client.connect(f"unix:{daemon.socket}") as c:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            c.infer("slow", {"data": np.zeros(SLOW_SHAPE, np.float32)}, timeout=0.05)
        assert time.monotonic() - start < 1.0
        with pytest.raises(DeadlineExceeded):
            c.infer("digits", {"data": sample(1)}, deadline=time.time() - 1)


def test_disconnect_mid_flight_leaves_no_work(daemon: Daemon) -> None:
    before = status(daemon)["totals"]
    r = Raw(daemon.socket)
    for i in range(1, 25):
        r.send(slow_request(i))
    wait_status(daemon, lambda s: s["server"]["infer_in_flight"] == 24 and s["in_flight"] >= 1)
    r.sock.close()
    start = time.monotonic()
    after = wait_status(daemon, no_work, timeout=5.0)
    # 24 jobs of 0.3 s on two CPU slots would take 3.6 s; only the ones running finish
    assert time.monotonic() - start < 1.8
    dropped = after["totals"]["cancelled"] - before["cancelled"]
    completed = after["totals"]["completed"] - before["completed"]
    assert dropped >= 18, (dropped, completed)
    assert after["server"]["requests_in_flight"] == 1  # the status request itself


def test_per_connection_limit_is_overloaded_not_unbounded(daemon: Daemon) -> None:
    with Raw(daemon.socket) as r:
        for i in range(1, 37):
            r.send(slow_request(i) if i <= 32 else digits_request(i))
            if i == 32:
                wait_status(daemon, lambda s: s["server"]["infer_in_flight"] >= 32)
        codes = {}
        while len(codes) < 4:
            x = r.recv()
            assert x is not None
            if x.id > 32:
                codes[x.id] = x.error.code if x.error else "ok"
        assert set(codes.values()) == {"OVERLOADED"}
    wait_status(daemon, no_work, timeout=5.0)


# ------------------------------------------------------------------------------ TCP + token


def test_tcp_token(daemon: Daemon) -> None:
    assert daemon.tcp is not None
    host, port = daemon.tcp
    with Client.connect(f"tcp://{host}:{port}", token=TOKEN) as c:
        assert int(c.infer("digits", {"data": sample(5)})["prob"].argmax()) == 5
    with pytest.raises(Unauthenticated):
        Client.connect(f"tcp://{host}:{port}", token="wrong-token-0123456789")
    with Raw(tcp=daemon.tcp) as r:  # no auth: the first request is refused, then the close
        r.send(req(1, "ping"))
        answers = r.read_to_eof()
        assert [(a.id, a.error.code if a.error else None) for a in answers] == [(1, "UNAUTHENTICATED")]
    with Raw(tcp=daemon.tcp) as r:  # before auth, frames are limited to 64 KiB
        r.send(struct.pack(">I", 100_000) + b"\x80" * 1000)
        answers = r.read_to_eof()
        assert [(a.id, a.error.code if a.error else None) for a in answers] == [(0, "BAD_REQUEST")]
    with Raw(tcp=daemon.tcp) as r:  # auth then a large frame is fine
        r.send(req(1, "auth", token=TOKEN))
        assert r.until(1)[0].ok
        r.send(slow_request(2, timeout=30))
        assert r.until(2, timeout=30)[0].ok


# ------------------------------------------------------------------------------ sockets


def test_live_socket_is_refused(daemon: Daemon, tmp_path: Path, launch_daemon: Launch) -> None:
    d2 = launch_daemon(tmp_path, f'[server]\nsocket = "{daemon.socket}"\n', name="second", wait=False)
    rc = d2.proc.wait(60)
    assert rc == 1
    assert "listening there" in d2.log_text()
    assert status(daemon)["ready"] is True  # the first daemon is untouched


def test_bind_unix_socket_rules(tmp_path: Path) -> None:
    from vkserve.daemon.listeners import ListenError, bind_unix_socket

    path = tmp_path / "sub" / "x.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.parent.mkdir()
    stale.bind(str(path))
    stale.close()  # the file stays: a crashed daemon's socket
    bound = bind_unix_socket(path, 0o660)
    try:
        assert oct(path.stat().st_mode & 0o777) == oct(0o660)
        with pytest.raises(ListenError, match="listening there"):
            bind_unix_socket(path)
    finally:
        bound.sock.close()
        bound.unlink()
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(ListenError, match="not a socket"):
        bind_unix_socket(path)


# ------------------------------------------------------------------------------ hostile input


class Steady:
    """A well-behaved client on its own thread, running digits the whole time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ok = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        try:
            with Client.connect(f"unix:{self.path}") as c:
                while not self._stop.is_set():
                    k = self.ok % 10
                    got = int(c.infer("digits", {"data": sample(k)}, timeout=20)["prob"].argmax())
                    if got != k:
                        raise AssertionError(f"digit {k} classified as {got}")
                    self.ok += 1
                    time.sleep(0.005)
        except BaseException as exc:  # reported by the test thread
            self.errors.append(exc)

    def __enter__(self) -> Steady:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self.errors, self.errors
        assert self.ok > 0


@pytest.fixture
def steady(daemon: Daemon) -> Iterator[Steady]:
    with Steady(daemon.socket) as s:
        yield s


HYPO = settings(max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
    st.text(max_size=12), st.binary(max_size=32),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_tensor = st.fixed_dictionaries({
    "dtype": st.sampled_from(["float32", "float16", "float64", "int8", "bool", "object", "<f4", "V8"]),
    "shape": st.lists(st.integers(-2, 9), max_size=5),
    "data": st.binary(max_size=300),
})
_message = st.fixed_dictionaries(
    {
        "v": st.one_of(st.just(1), _values),
        "id": st.one_of(st.integers(0, 2**64 - 1), _values),
        "op": st.one_of(st.sampled_from(
            ["infer", "list_models", "status", "cancel", "ping", "auth", "load_model", "nope", ""]),
            _values),
    },
    optional={
        "model": st.one_of(st.sampled_from(["digits", "slow", "nope"]), _values),
        "inputs": st.one_of(st.dictionaries(st.sampled_from(["data", "x"]), st.one_of(_tensor, _values),
                                            max_size=2), _values),
        "priority": _values, "deadline": _values, "timeout": _values, "outputs": _values,
        "name": st.sampled_from(["nope", "../..", "", "x" * 300, "/etc/passwd"]),
        "devices": _values, "target": _values, "token": _values,
    },
)
PING_ID = 2**64 - 1


def _ping_after(r: Raw, used_id: Any) -> list[Response]:
    rid = PING_ID if used_id != PING_ID else PING_ID - 1
    r.send(req(rid, "ping"))
    answer, before = r.until(rid)
    assert answer.ok and answer.result["pong"] is True
    return before


@HYPO
@given(msg=_message)
def test_hostile_messages_get_answers_and_the_connection_goes_on(daemon: Daemon, steady: Steady,
                                                                 msg: dict[str, Any]) -> None:
    payload = msgpack.packb(msg, use_bin_type=True)
    with Raw(daemon.socket) as r:
        r.send(struct.pack(">I", len(payload)) + payload)
        for answer in _ping_after(r, msg.get("id")):
            assert answer.id in (0, msg.get("id"))


@HYPO
@given(payload=st.binary(max_size=400))
def test_hostile_payloads_in_good_frames(daemon: Daemon, steady: Steady, payload: bytes) -> None:
    with Raw(daemon.socket) as r:
        r.send(struct.pack(">I", len(payload)) + payload)
        _ping_after(r, None)


@HYPO
@given(stream=st.binary(max_size=600), chunks=st.integers(1, 4))
def test_hostile_byte_streams(daemon: Daemon, steady: Steady, stream: bytes, chunks: int) -> None:
    with Raw(daemon.socket) as r:
        step = max(1, len(stream) // chunks)
        try:
            for i in range(0, len(stream), step):
                r.sock.sendall(stream[i : i + step])
            r.sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon already closed (e.g. a length above the limit)
        r.read_to_eof()  # every complete frame that comes back parses as a response


def test_oversized_truncated_and_nested_frames(daemon: Daemon, steady: Steady) -> None:
    with Raw(daemon.socket) as r:  # above the 64 MiB limit: error frame (id 0), then the close
        r.send(struct.pack(">I", 0xFFFFFFFF) + b"\x00" * 100)
        answers = r.read_to_eof()
        assert len(answers) == 1 and answers[0].id == 0 and answers[0].error.code == "BAD_REQUEST"
        assert "exceeds the limit" in answers[0].error.message
    with Raw(daemon.socket) as r:  # a frame cut short by the client's close
        frame = encode_frame(digits_request(1))
        r.sock.sendall(frame[: len(frame) // 2])
        r.sock.shutdown(socket.SHUT_WR)
        assert r.read_to_eof() == []
    with Raw(daemon.socket) as r:  # nesting bomb, non-map payload, bad version, bad id
        r.send(struct.pack(">I", 100_001) + b"\x91" * 100_000 + b"\xc0")
        r.send(struct.pack(">I", 4) + msgpack.packb([1, 2, 3]))
        r.send(req(5, "ping") | {"v": 2})
        r.send(req(0, "ping"))
        r.send(req(6, "infer", model="digits", inputs={"data": {"dtype": "object", "shape": [1],
                                                                 "data": b"\x00" * 8}}))
        before = _ping_after(r, None)
        codes = [(a.id, a.error.code) for a in before if a.error]
        assert codes == [(0, "BAD_REQUEST"), (0, "BAD_REQUEST"), (5, "BAD_REQUEST"),
                         (0, "BAD_REQUEST"), (6, "BAD_REQUEST")]
    with Raw(daemon.socket) as r:  # 1000 pipelined requests, answered by id
        r.send(b"".join(encode_frame(req(i, "ping")) for i in range(1, 1001)))
        ids = {r.recv().id for _ in range(1000)}
        assert ids == set(range(1, 1001))


# ------------------------------------------------------------------------------ shutdown


def test_sighup_rescans_sigterm_drains_and_exits_0(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = make_repository(tmp_path / "repo", digits=False)
    sock = tmp_path / "run" / "vk.sock"
    sock.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()  # a crashed daemon's socket file: replaced at start
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{sock}"
idle_timeout = 1.0
drain_timeout = 15.0
[models]
repository = "{repo}"
""", env=SLOW_ENV)
    assert "replacing stale socket" in d.log_text()
    (repo / "digits").symlink_to(DIGITS)  # SIGHUP: the new model folder loads
    d.proc.send_signal(signal.SIGHUP)
    wait_status(d, lambda s: s["models"].get("digits", {}).get("state") == "ready", timeout=30)
    with Raw(sock) as idle:  # a torn frame is not kept open forever
        idle.sock.sendall(b"\x00\x00")
        start = time.monotonic()
        answers = idle.read_to_eof()
        assert 0.8 < time.monotonic() - start < 5
        assert [(a.id, a.error.code) for a in answers] == [(0, "BAD_REQUEST")]
    r = Raw(sock)
    for i in range(1, 5):
        r.send(slow_request(i))
    wait_status(d, lambda s: s["server"]["infer_in_flight"] == 4 and s["in_flight"] >= 1)
    d.proc.send_signal(signal.SIGTERM)
    d.wait_line("stopping; draining 4 request(s)", timeout=10)
    r.send(slow_request(9))  # new work during the drain is refused
    answers = {}
    while len(answers) < 5:
        a = r.recv(timeout=15)
        assert a is not None, answers
        answers[a.id] = a
    assert all(answers[i].ok for i in range(1, 5)), answers
    assert answers[9].error.code == "UNAVAILABLE"
    bye = r.read_to_eof()  # the drained connection: a goodbye (id 0), then the close
    assert [(a.id, a.error.code) for a in bye if a.error] == [(0, "UNAVAILABLE")]
    r.sock.close()
    assert d.proc.wait(20) == 0
    assert not sock.exists()
    d.wait_line("vkserve: stopped", timeout=5)


def test_sigint_drain_timeout_cancels_what_is_left(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = make_repository(tmp_path / "repo", digits=False)
    sock = tmp_path / "vk.sock"
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{sock}"
drain_timeout = 0.3
[models]
repository = "{repo}"
""", env=SLOW_ENV)
    r = Raw(sock)
    for i in range(1, 13):  # ~2 s of work on two CPU slots
        r.send(slow_request(i))
    wait_status(d, lambda s: s["server"]["infer_in_flight"] == 12 and s["in_flight"] >= 1)
    start = time.monotonic()
    d.proc.send_signal(signal.SIGINT)
    answers = r.read_to_eof(timeout=10)
    assert d.proc.wait(10) == 0
    assert time.monotonic() - start < 3.0  # 0.3 s drain + the runs already started
    # every request is answered: the finished ones with results, the rest UNAVAILABLE;
    # then the goodbye (id 0) before the close
    assert sorted(a.id for a in answers if a.id) == list(range(1, 13))
    assert [a.error.code for a in answers if a.id == 0 and a.error] == ["UNAVAILABLE"]
    unavailable = [a for a in answers if not a.ok]
    assert unavailable and all(a.error.code == "UNAVAILABLE" for a in unavailable)
    assert "drain timeout: cancelling" in d.log_text()
    r.sock.close()
