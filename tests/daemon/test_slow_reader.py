"""A client that sends but never reads its answers: once the daemon's socket buffer is full,
the answer waiting to be written gives up after ``server.send_timeout`` and the daemon drops
that connection, while every other client goes on being served (issue 14: answers are written
at once when the socket takes them, and through trio's send_all under the timeout when not).

A real `vkserve serve` subprocess (tests/support/daemon.py)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np

from tests.support.daemon import Launch, Raw, make_repository, req, sample, wait_for
from vkserve.client import Client
from vkserve.client.protocol import decode_tensors, encode_frame, encode_tensors
from vkserve.devices.cpu.bf16 import round_bf16


def test_a_client_that_never_reads_is_dropped_after_send_timeout(tmp_path: Path,
                                                                launch_daemon: Launch) -> None:
    repo = make_repository(tmp_path / "repo", slow=False)
    daemon = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/d.sock"
send_timeout = 1

[models]
repository = "{repo}"
""")
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    flood.connect(str(daemon.socket))
    pings = b"".join(encode_frame(req(i, "ping")) for i in range(1, 2001))
    ended: list[BaseException | None] = []

    def send_forever() -> None:  # pings, never a read: the daemon's answers pile up
        try:
            for _ in range(200):
                flood.sendall(pings)
            ended.append(None)
        except OSError as exc:  # the daemon closed the connection under the sender
            ended.append(exc)

    sender = threading.Thread(target=send_forever, daemon=True)
    started = time.monotonic()
    sender.start()
    try:
        wait_for(lambda: "did not read for 1" in daemon.log_text(), timeout=30,
                 what="the daemon to give up on the client that does not read")
        sender.join(timeout=30)
        assert ended and isinstance(ended[0], OSError), ended  # closed by the daemon
        assert time.monotonic() - started > 1.0  # not before send_timeout
        with Client.connect(f"unix:{daemon.socket}") as other:  # everyone else is served
            answer = other.infer("digits", {"data": sample(3)})
            assert answer["prob"].shape[-1] == 10
            assert other.ping()
    finally:
        flood.close()


def test_an_answer_larger_than_the_socket_takes_at_once_arrives_whole(tmp_path: Path,
                                                                       launch_daemon: Launch) -> None:
    """A sequential client's answer is written at once (no writer round); what the socket does
    not take then follows through the writer, in order, and the connection goes on."""
    repo = make_repository(tmp_path / "repo", digits=False, slow=False)
    (repo / "big").mkdir()
    (repo / "big" / "model.param").write_text(
        "7767517\n2 2\nInput data 0 1 data 0=128 1=128 2=16\nReLU relu 1 1 data out\n")
    (repo / "big" / "model.bin").write_bytes(b"")  # ReLU has no weights
    (repo / "big" / "config.toml").write_text('devices = "cpu"\nwarmup = 0\n')
    daemon = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/d.sock"

[models]
repository = "{repo}"
""")
    with Raw(daemon.socket) as raw:
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for rid in (1, 2):
            x = np.random.default_rng(rid).standard_normal((16, 128, 128)).astype(np.float32)
            raw.send(req(rid, "infer", model="big", inputs=encode_tensors({"data": x})))
            time.sleep(0.3)  # not read yet: 1 MiB of answer waits in the daemon's socket
            answer, before = raw.until(rid, timeout=30)
            assert before == [] and answer.ok, answer.error
            np.testing.assert_array_equal(decode_tensors(answer.result["outputs"])["out"],
                                          np.maximum(round_bf16(x), 0))  # the CPU's bf16 storage
