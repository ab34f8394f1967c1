"""Requests that must cost their sender one error answer and nothing else (issue 11): tensors
whose shapes numpy refuses, the same before authentication, device names that are not ASCII
indices, duplicate ids in flight, how error codes and model paths read in messages; and the
drain: every request the daemon reads is answered before it closes the connection.

Real `vkserve serve` subprocesses (tests/support/daemon.py)."""

from __future__ import annotations

import selectors
import signal
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.daemon import (
    SLOW_ENV,
    SLOW_SHAPE,
    TOKEN,
    Daemon,
    Launch,
    Raw,
    digits_request,
    make_repository,
    req,
    slow_request,
    wait_status,
)
from vkserve.client import BadRequestError, Client, NotFound
from vkserve.client.protocol import FrameDecoder, encode_frame, encode_tensors, parse_response

BAD_SHAPES = [[0, 2**32, 2**32], [0, 2**64 - 1]]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("hostile")
    repo = make_repository(work / "repo")
    (repo / "garbage").mkdir()
    (repo / "garbage" / "model.param").write_bytes(b"\xff\xfe not a param file")
    return launch_module_daemon(work, f"""
[server]
socket = "{work}/d.sock"
tcp = "127.0.0.1:0"
token = "{TOKEN}"

[models]
repository = "{repo}"
""", env=SLOW_ENV)


def bad_tensor_request(rid: int, shape: list[int]) -> dict:
    return req(rid, "infer", model="digits",
               inputs={"data": {"dtype": "float32", "shape": shape, "data": b""}})


# ------------------------------------------------------------------------------ tensors


@pytest.mark.parametrize("shape", BAD_SHAPES)
def test_malformed_tensor_after_five_pipelined_requests(daemon: Daemon, shape: list[int]) -> None:
    with Raw(daemon.socket) as r:
        r.send(b"".join(encode_frame(digits_request(i, k=i)) for i in range(1, 6))
               + encode_frame(bad_tensor_request(6, shape)) + encode_frame(req(7, "ping")))
        answers = {}
        while len(answers) < 7:
            a = r.recv()
            assert a is not None, f"connection closed; answers so far {answers}"
            answers[a.id] = a
        assert all(answers[i].ok for i in range(1, 6)), answers
        bad = answers[6].error
        assert bad is not None and bad.code == "BAD_REQUEST"
        assert "inputs.data.shape" in bad.message
        assert answers[7].ok  # and the connection goes on


def test_malformed_tensor_before_auth_is_unauthenticated_without_a_traceback(daemon: Daemon) -> None:
    assert daemon.tcp is not None
    before = len(daemon.log_text())
    for shape in BAD_SHAPES:
        with Raw(tcp=daemon.tcp) as r:
            r.send(bad_tensor_request(9, shape))
            answers = r.read_to_eof()
            assert [(a.id, a.error.code) for a in answers if a.error] == [(9, "UNAUTHENTICATED")]
    with Raw(tcp=daemon.tcp) as r:  # after auth, the same frame is a BAD_REQUEST
        r.send(req(1, "auth", token=TOKEN))
        r.send(bad_tensor_request(2, BAD_SHAPES[0]))
        a, _ = r.until(2)
        assert a.error is not None and a.error.code == "BAD_REQUEST"
    time.sleep(0.2)
    assert "Traceback" not in daemon.log_text()[before:]


# ------------------------------------------------------------------------------ fields


def test_device_names_must_be_ascii_indices(daemon: Daemon) -> None:
    with Raw(daemon.socket) as r:
        for rid, name in enumerate(["9" * 5000, "\u0663", "3\n", "-1", ""], start=1):
            r.send(req(rid, "load_model", name="slow", devices=[name]))
            a, _ = r.until(rid)
            assert a.error is not None and a.error.code == "BAD_REQUEST", (name, a)
            assert a.error.message.startswith("field 'devices'"), a.error.message
            assert len(a.error.message) < 200
    assert "Traceback" not in daemon.log_text()


def test_a_duplicate_id_in_flight_is_refused_before_the_original_answer(daemon: Daemon) -> None:
    with Raw(daemon.socket) as r:
        r.send(slow_request(7))
        wait_status(daemon, lambda s: s["server"]["infer_in_flight"] >= 1)
        r.send(slow_request(7, priority=5))
        r.send(req(7, "cancel", target=7))  # any op: a cancel with that id is a duplicate too
        answers = [r.recv(), r.recv(), r.recv()]
        assert all(a is not None and a.id == 7 for a in answers), answers
        for dup in answers[:2]:  # the refusals come first, and nothing was cancelled
            assert dup.error is not None and dup.error.code == "BAD_REQUEST"
            assert dup.error.message == "request id 7 is already in flight"
        assert answers[2].ok  # the original's answer
        r.send(slow_request(7))  # answered: the id is free again
        again = r.recv()
        assert again is not None and again.id == 7 and again.ok


def test_error_codes_appear_once(daemon: Daemon) -> None:
    with Client.connect(f"unix:{daemon.socket}") as c:
        with pytest.raises(BadRequestError) as bad:
            c.infer("slow", {"nope": np.zeros(SLOW_SHAPE, np.float32)})
        with pytest.raises(NotFound) as missing:
            c.infer("no-such-model", {"data": np.zeros(SLOW_SHAPE, np.float32)})
    for exc, code in ((bad.value, "BAD_REQUEST"), (missing.value, "NOT_FOUND")):
        assert exc.code == code and code not in exc.message, exc.message
        assert str(exc) == f"{code}: {exc.message}"


def test_nesting_too_deep_is_named(daemon: Daemon) -> None:
    with Raw(daemon.socket) as r:
        r.send(struct.pack(">I", 2001) + b"\x91" * 2000 + b"\xc0")
        r.send(req(1, "ping"))
        a, before = r.until(1)
        assert a.ok and [b.id for b in before] == [0]
        assert "nested deeper than 1024" in before[0].error.message


def test_a_broken_model_is_named_by_its_folder_once(daemon: Daemon) -> None:
    with Client.connect(f"unix:{daemon.socket}") as c:
        garbage = next(m for m in c.models() if m["name"] == "garbage")
    assert garbage["error"].startswith("garbage/model.param: not UTF-8"), garbage["error"]
    assert "//" not in garbage["error"] and str(daemon.socket.parent) not in garbage["error"]


async def test_a_validation_bug_costs_one_internal_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: whatever escapes request validation answers that id; reading goes on."""
    from tests.daemon.test_daemon_connection import connected, infer
    from vkserve.daemon import connection

    real = connection.parse_request

    def buggy(msg: dict, shm: object = None) -> object:
        if msg.get("model") == "bug":
            raise ValueError("a bug in validation")
        return real(msg, shm)

    monkeypatch.setattr(connection, "parse_request", buggy)
    async with connected() as (peer, _server, closed):
        await peer.send(infer(1, "bug"))
        await peer.send(infer(2, "double"))
        first, second = await peer.recv(), await peer.recv()
        assert first is not None and first.id == 1 and first.error is not None
        assert first.error.code == "INTERNAL" and "ValueError: a bug in validation" in first.error.message
        assert second is not None and second.id == 2 and second.ok and not closed()


# ------------------------------------------------------------------------------ drain


def _drain_daemon(tmp_path: Path, launch: Launch, delay: float) -> Daemon:
    repo = make_repository(tmp_path / "repo", digits=False)
    return launch(tmp_path, f"""
[server]
socket = "{tmp_path}/d.sock"
drain_timeout = 30
[models]
repository = "{repo}"
[scheduler]
queue_limit_per_model = 4096
""", env={"VKSERVE_TEST_DEVICE_DELAY": f"cpu={delay}"})


_SMALL = encode_tensors({"data": np.zeros(SLOW_SHAPE, np.float32)})


class _Client:
    """A raw client that sends until the daemon's goodbye (id-0 UNAVAILABLE), then closes
    its sending side and reads to EOF, as the protocol asks."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.sock.settimeout(30)
        self.decoder = FrameDecoder(2**31)
        self.next_id = 1
        self.pending: set[int] = set()
        self.sent = 0
        self.codes: list[str] = []
        self.goodbye = self.write_closed = self.eof = False

    def send(self) -> None:
        if self.goodbye or self.write_closed or self.eof:
            return
        rid, self.next_id = self.next_id, self.next_id + 1
        try:
            self.sock.sendall(encode_frame(req(rid, "infer", model="slow", inputs=_SMALL)))
        except OSError:
            self.write_closed = True
            return
        self.pending.add(rid)
        self.sent += 1

    def read(self) -> int:
        """Answers read now (not counting the goodbye)."""
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return 0
        self.decoder.feed(data)
        n = 0
        while (msg := self.decoder.next_message()) is not None:
            r = parse_response(msg)
            if r.id == 0:
                assert r.error is not None and r.error.code == "UNAVAILABLE", r
                self.goodbye = True
                if not self.write_closed:
                    self.write_closed = True
                    self.sock.shutdown(socket.SHUT_WR)
                continue
            assert r.id in self.pending, f"answer to {r.id}, which is not in flight"
            self.pending.discard(r.id)
            self.codes.append("ok" if r.ok else str(r.error.code))
            n += 1
        return n


def _run_until_eof(clients: list[_Client], *, tick: float | None, replace: bool,
                   sigterm: tuple[Daemon, float] | None = None, limit: float = 60) -> None:
    """Until EOF on every client: ``tick``: the first client sends every ``tick`` s;
    ``replace``: every answer is replaced by a new request; ``sigterm``: (daemon, after s)."""
    sel = selectors.DefaultSelector()
    for c in clients:
        sel.register(c.sock, selectors.EVENT_READ, c)
    open_ = set(clients)
    start = time.monotonic()
    end = start + limit
    next_tick = start
    while open_:
        now = time.monotonic()
        assert now < end, [(c.sent, len(c.pending), c.goodbye) for c in clients]
        if sigterm is not None and now >= start + sigterm[1]:
            sigterm[0].proc.send_signal(signal.SIGTERM)
            sigterm = None
        if tick is not None and now >= next_tick:
            clients[0].send()
            next_tick = now + tick
        for key, _ in sel.select(max(0.0, next_tick - now) if tick is not None else 0.05):
            c = key.data
            for _ in range(c.read()):
                if replace:
                    c.send()
            if c.eof:
                sel.unregister(c.sock)
                open_.discard(c)
    for c in clients:
        c.sock.close()


def test_drain_answers_a_request_stream_to_the_end(tmp_path: Path, launch_daemon: Launch) -> None:
    d = _drain_daemon(tmp_path, launch_daemon, delay=0.5)
    c = _Client(d.socket)
    c.send()  # the long one, in flight at SIGTERM
    wait_status(d, lambda s: s["server"]["infer_in_flight"] >= 1)
    d.proc.send_signal(signal.SIGTERM)
    _run_until_eof([c], tick=0.002, replace=False)
    assert d.proc.wait(20) == 0
    assert c.pending == set(), f"{len(c.pending)} of {c.sent} requests never answered"
    assert c.goodbye and c.eof  # told to stop before the close: nothing sent after it is lost
    assert "ok" in c.codes and c.codes.count("UNAVAILABLE") >= 20, c.codes[:5]
    assert set(c.codes) <= {"ok", "UNAVAILABLE"}


def test_drain_answers_16_clients_with_4_in_flight_each(tmp_path: Path, launch_daemon: Launch) -> None:
    d = _drain_daemon(tmp_path, launch_daemon, delay=0.02)
    clients = [_Client(d.socket) for _ in range(16)]
    for c in clients:
        for _ in range(4):
            c.send()
    # every answer is replaced until the goodbye: 4 in flight on each at SIGTERM and after
    _run_until_eof(clients, tick=None, replace=True, sigterm=(d, 0.5))
    assert d.proc.wait(20) == 0
    unanswered = sum(len(c.pending) for c in clients)
    assert unanswered == 0, f"{unanswered} requests unanswered at EOF"
    assert all(c.goodbye for c in clients)
    codes = [code for c in clients for code in c.codes]
    assert codes.count("ok") >= 64 and set(codes) <= {"ok", "UNAVAILABLE"}
