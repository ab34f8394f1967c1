"""The connection's reads from the socket itself (``Connection._receive_from_socket``: wait for
the socket once it was drained, then one read), in process over real TCP and Unix sockets with
the scripted backend of test_daemon_connection: requests one at a time and pipelined are all
answered; a peer that resets the connection (an answer left unread on a Unix socket, SO_LINGER
0 on TCP) ends it as a lost connection, not an internal error, and the server goes on."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio

from tests.daemon.test_daemon_connection import Peer, ScriptedBackend, infer
from vkserve.client.protocol import encode_frame
from vkserve.client.tensors import decode_tensor
from vkserve.daemon.config import Config, ServerConfig
from vkserve.daemon.server import Server

TOKEN = "secret-token"


@asynccontextmanager
async def listening(kind: str, tmp_path: Path) -> AsyncIterator[tuple[Server, Callable[[], Awaitable[Peer]]]]:
    """A server on a real socket of `kind`; yields it and a connect function (a TCP peer has
    authenticated when it gets it)."""
    server = Server(Config(server=ServerConfig()), ScriptedBackend(), token=TOKEN)
    if kind == "tcp":
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        handler = server.handle_tcp
    else:
        path = str(tmp_path / "s.sock")
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(path)
        sock.listen()
        listeners = [trio.SocketListener(sock)]
        handler = server.handle_unix

    async def connect() -> Peer:
        if kind == "unix":
            return Peer(await trio.open_unix_socket(path))
        peer = Peer(await trio.open_tcp_stream("127.0.0.1", port))
        await peer.send({"v": 1, "id": 1_000_000, "op": "auth", "token": TOKEN})
        r = await peer.recv()
        assert r is not None and r.ok, r
        return peer

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.serve_listeners, handler, listeners))
        yield server, connect
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_requests_one_at_a_time_and_pipelined(kind: str, tmp_path: Path) -> None:
    async with listening(kind, tmp_path) as (_, connect):
        peer = await connect()
        for i in range(1, 201):
            await peer.send(infer(i, "double", (i, -i)))
            r = await peer.recv()
            assert r is not None and r.id == i and r.ok
            np.testing.assert_array_equal(decode_tensor(r.result["outputs"]["y"]), np.float32([2 * i, -2 * i]))
        await peer.stream.send_all(b"".join(encode_frame(infer(i, "double", (i, 0))) for i in range(1000, 1050)))
        got = {}
        for _ in range(50):
            r = await peer.recv()
            assert r is not None and r.ok
            got[r.id] = float(decode_tensor(r.result["outputs"]["y"])[0])
        assert got == {i: 2.0 * i for i in range(1000, 1050)}
        await peer.stream.aclose()


@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_a_reset_peer_is_a_lost_connection(kind: str, tmp_path: Path, caplog) -> None:
    async with listening(kind, tmp_path) as (_, connect):
        with caplog.at_level(logging.DEBUG, logger="vkserve.daemon"):
            peer = await connect()
            await peer.send(infer(1, "double"))
            with trio.fail_after(5):  # the answer has arrived, unread
                assert await peer.stream.socket.recv(1, socket.MSG_PEEK)  # type: ignore[attr-defined]
            if kind == "tcp":
                peer.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.stream.socket.close()  # a reset: unread data on Unix, SO_LINGER 0 on TCP
            with trio.fail_after(5):  # the connection's end, logged
                while "connection lost" not in caplog.text:
                    await trio.sleep(0.01)
            other = await connect()
            await other.send(infer(2, "double"))
            r = await other.recv()
            assert r is not None and r.ok
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text
        assert "connection lost" in caplog.text and "socket error" in caplog.text
        await other.stream.aclose()
