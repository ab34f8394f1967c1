"""docs/PROTOCOL.md's worked session, replayed byte for byte against a live daemon.

Every ``<!-- bytes: tcp|unix request|reply -->`` listing of the document is parsed (the bytes
left of ``#``); each request is sent as it stands on its connection (the shared-memory one with
a sealed memfd as SCM_RIGHTS, as the document says), and the daemon's answer must be the reply
listing that follows it: byte for byte, where ``??`` is any one byte and ``..`` any rest. Then
the facts the document states about the answers are checked on their decoded fields.
"""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support.daemon import Daemon, Launch, make_repository, sample
from tests.support.paths import REPO
from vkserve.client.protocol import FrameDecoder, parse_response, unpack_payload

DOC = REPO / "docs" / "PROTOCOL.md"
TOKEN = "example-token-0123456789"  # the token of the document's daemon
LISTING = re.compile(r"<!-- bytes: (tcp|unix) (request|reply)(, with the memfd)? -->\n```\n(.*?)\n```", re.S)
ANY, REST = "??", ".."


@dataclass(frozen=True)
class Listing:
    transport: str  # "tcp" or "unix"
    kind: str  # "request" or "reply"
    memfd: bool  # the request carries the memfd (SCM_RIGHTS)
    tokens: tuple[str, ...]  # two hex digits, ANY or (last) REST
    line: int  # where in the document, for messages

    def exact(self) -> bytes:
        assert all(t not in (ANY, REST) for t in self.tokens), f"line {self.line}: a request has wildcards"
        return bytes(int(t, 16) for t in self.tokens)

    def check(self, got: bytes) -> None:
        """``got`` is what this reply listing states."""
        for i, token in enumerate(self.tokens):
            if token == REST:
                return
            assert i < len(got), f"PROTOCOL.md line {self.line}: the reply ended after {len(got)} bytes"
            if token != ANY:
                assert got[i] == int(token, 16), (
                    f"PROTOCOL.md line {self.line}: byte {i} is {got[i]:02x}, the document says "
                    f"{token}; the reply: {got.hex(' ')}")
        assert len(got) == len(self.tokens), f"PROTOCOL.md line {self.line}: the reply has {len(got)} bytes"


def listings(text: str) -> list[Listing]:
    out = []
    for m in LISTING.finditer(text):
        line = text.count("\n", 0, m.start(4)) + 1
        tokens: list[str] = []
        for n, raw in enumerate(m.group(4).splitlines()):
            for token in raw.split("#", 1)[0].split():
                assert re.fullmatch(r"[0-9a-f]{2}|\?\?|\.\.", token), \
                    f"PROTOCOL.md line {line + n}: {token!r} is not a byte, ?? or .."
                assert REST not in tokens, f"PROTOCOL.md line {line + n}: bytes after '..'"
                tokens.append(token)
        out.append(Listing(m.group(1), m.group(2), m.group(3) is not None, tuple(tokens), line))
    return out


def test_the_document_lists_a_whole_session() -> None:
    """The listings themselves: requests exact and well-formed frames, each with its reply."""
    found = listings(DOC.read_text())
    assert [x.kind for x in found] == ["request", "reply"] * (len(found) // 2) and len(found) >= 14
    ops = []
    for request in found[::2]:
        frame = request.exact()
        (length,) = struct.unpack(">I", frame[:4])
        assert length == len(frame) - 4, f"PROTOCOL.md line {request.line}: length field {length}"
        ops.append(unpack_payload(frame[4:])["op"])
    assert ops == ["auth", "ping", "infer", "infer", "shm_register", "infer", "shm_unregister"]
    assert [x.memfd for x in found[::2]] == [op == "shm_register" for op in ops]
    # step 3 sends sample 3.npy of the example model, as the text says
    infer = unpack_payload(found[4].exact()[4:])
    assert infer["inputs"]["data"]["data"] == sample(3).astype("<f4").tobytes()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    """The document's daemon: only `digits`, TCP on with the example token."""
    work = tmp_path_factory.mktemp("protocol-doc")
    repo = make_repository(work / "repo", slow=False)
    return launch_module_daemon(work, f"""
[server]
socket = "{work}/d.sock"
tcp = "127.0.0.1:0"
token = "{TOKEN}"

[models]
repository = "{repo}"
""")


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, f"the daemon closed the connection after {len(data)} of {n} bytes"
            data += chunk
        return data

    header = exactly(4)
    return header + exactly(struct.unpack(">I", header)[0])


def sealed_region(data: bytes, size: int = 4096) -> tuple[int, mmap.mmap]:
    """What the document's client made: a sealed memfd of ``size`` bytes, ``data`` at 0."""
    fd = os.memfd_create("vkserve-r1", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    mem = mmap.mmap(fd, size)
    mem[:len(data)] = data
    return fd, mem


def prob_of(reply: dict, mem: mmap.mmap) -> np.ndarray:
    tensor = reply["result"]["outputs"]["prob"]
    assert tensor["dtype"] == "float32" and tensor["shape"] == [10]
    if "shm" in tensor:
        assert tensor["shm"] == {"region": "r1", "offset": 256}
        return np.frombuffer(mem, "<f4", 10, offset=256).copy()
    return np.frombuffer(tensor["data"], "<f4")


def test_the_worked_session_replays_against_a_live_daemon(daemon: Daemon) -> None:
    found = listings(DOC.read_text())
    assert daemon.tcp is not None
    fd, mem = sealed_region(sample(3).astype("<f4").tobytes())
    conns = {"tcp": socket.create_connection(daemon.tcp, timeout=60),
             "unix": socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)}
    conns["unix"].settimeout(60)
    conns["unix"].connect(str(daemon.socket))
    probs = []
    try:
        for request, expected in zip(found[::2], found[1::2], strict=True):
            assert expected.transport == request.transport
            sock = conns[request.transport]
            frame = request.exact()
            if request.memfd:
                sent = sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
                sock.sendall(frame[sent:])
            else:
                sock.sendall(frame)
            got = read_frame(sock)
            expected.check(got)
            decoder = FrameDecoder()
            decoder.feed(got)
            reply = decoder.next_message()
            assert reply is not None and decoder.buffered == 0
            sent_map = unpack_payload(frame[4:])
            assert parse_response(reply).id == sent_map["id"]
            if sent_map["op"] == "ping":
                assert reply["result"]["pong"] is True and isinstance(reply["result"]["time"], float)
                assert isinstance(reply["result"]["version"], str)
            if sent_map["op"] == "infer" and reply["ok"]:
                probs.append(prob_of(reply, mem))
    finally:
        for sock in conns.values():
            sock.close()
        mem.close()
        os.close(fd)
    # steps 3 and 5: class 3, the same floats inline and through shared memory
    assert len(probs) == 2 and int(probs[0].argmax()) == 3
    np.testing.assert_array_equal(probs[0], probs[1])


def test_the_doc_is_linked_from_the_readme() -> None:
    assert "docs/PROTOCOL.md" in Path(REPO / "README.md").read_text()
