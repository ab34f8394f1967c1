"""Zero-copy tensors on the Unix socket against a real daemon: large inputs and outputs travel
in a memfd registered once per connection (SCM_RIGHTS), not in the frames; answers equal the
inline path's; both clients do it transparently; refusals are BAD_REQUEST naming why (an
unsealed or short memfd, no descriptor, TCP, offsets outside the region) and the connection
and the daemon go on."""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import trio

from tests.support.daemon import Daemon, Launch, http_get
from vkserve.client import AsyncClient, Client
from vkserve.client.errors import BadRequestError
from vkserve.client.framing import FrameDecoder, encode_frame
from vkserve.client.messages import ShmRegisterRequest, parse_response
from vkserve.models.weights import write_random_bin

# fully convolutional, 3 x 128 x 128 input (192 KiB): above the clients' shared-memory threshold
FCN = ("7767517\n3 3\n"
       "Input in 0 1 data 0=128 1=128 2=3\n"
       "Convolution conv 1 1 data c 0=4 1=3 4=1 5=1 6=108\n"
       "ReLU relu 1 1 c out\n")
# an upsampler: 48 KiB in (under the threshold), 3 MiB out
UP = ("7767517\n2 2\n"
      "Input in 0 1 data 0=64 1=64 2=3\n"
      "Interp up 1 1 data out 0=1 1=8.0 2=8.0\n")
TOKEN = "a-token-of-sixteen-chars"


def fcn_daemon(tmp_path_factory: pytest.TempPathFactory, launch: Launch, folder_name: str, model_config: str,
               scheduler: str) -> Daemon:
    """A daemon serving the fcn and up models (``model_config``: their config.toml)."""
    work = tmp_path_factory.mktemp(folder_name)
    for name, param in (("fcn", FCN), ("up", UP)):
        folder = work / "repo" / name
        folder.mkdir(parents=True)
        (folder / "model.param").write_text(param)
        write_random_bin(folder / "model.param", folder / "model.bin", seed=3)
        (folder / "config.toml").write_text(model_config)
    return launch(work, f"""
[server]
socket = "{work}/d.sock"
tcp = "127.0.0.1:0"
token = "{TOKEN}"

[models]
repository = "{work}/repo"
{scheduler}""")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    return fcn_daemon(tmp_path_factory, launch_module_daemon, "shm", "", "[scheduler]\nuse_vulkan = false\n")


def tcp_address(daemon: Daemon) -> str:
    assert daemon.tcp is not None
    return f"{daemon.tcp[0]}:{daemon.tcp[1]}"


def x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 128, 128)).astype(np.float32)


def test_large_tensors_go_through_shared_memory_with_the_inline_answer(daemon: Daemon) -> None:
    with Client.connect(daemon.socket) as unix, Client.connect(tcp_address(daemon), token=TOKEN) as tcp:
        for seed in range(3):
            shared = unix.infer("fcn", {"data": x(seed)})["out"]
            inline = tcp.infer("fcn", {"data": x(seed)})["out"]
            np.testing.assert_array_equal(shared, inline)
            assert shared.shape == (4, 128, 128) and shared.flags.writeable
        assert unix._shm is not None and len(unix._shm.regions) == 1  # registered once, reused
        region = unix._shm.regions[0]
        # the inputs and outputs really lay in the region: the last request's are there
        data = np.frombuffer(region.map, np.float32, 3 * 128 * 128)
        np.testing.assert_array_equal(data.reshape(3, 128, 128), x(2))
        out = np.frombuffer(region.map, np.float32, 4 * 128 * 128, offset=3 * 128 * 128 * 4)
        np.testing.assert_array_equal(out.reshape(4, 128, 128), shared)
        del data, out  # views of the mapping: the client unmaps it at close


def test_outputs_larger_than_the_inputs_come_through_shared_memory_from_the_second_request(
        daemon: Daemon) -> None:
    """The client learns what a kind of request gets back: the first upsampler request goes
    inline both ways (its 48 KiB input is under the threshold, its outputs unknown), the next
    ones take a region with room for the 3 MiB output, which the engine writes there."""
    small = np.random.default_rng(7).standard_normal((3, 64, 64)).astype(np.float32)
    with Client.connect(daemon.socket) as unix, Client.connect(tcp_address(daemon), token=TOKEN) as tcp:
        expected = tcp.infer("up", {"data": small})["out"]
        assert expected.shape == (3, 512, 512)
        np.testing.assert_array_equal(unix.infer("up", {"data": small})["out"], expected)
        assert unix._shm is not None and unix._shm.regions == []
        for _ in range(2):
            np.testing.assert_array_equal(unix.infer("up", {"data": small})["out"], expected)
        (region,) = unix._shm.regions  # registered once, with room for the output
        out = np.frombuffer(region.map, np.float32, expected.size, offset=small.nbytes)
        np.testing.assert_array_equal(out.reshape(expected.shape), expected)
        del out  # a view of the mapping: the client unmaps it at close
        # another input shape is another kind of request: nothing known of its outputs yet
        np.testing.assert_array_equal(unix.infer("fcn", {"data": x(0)})["out"],
                                      tcp.infer("fcn", {"data": x(0)})["out"])
        assert len(unix._shm.regions) == 1  # fcn's 192 KiB input fit up's free region


def test_the_async_client_uses_shared_memory_too(daemon: Daemon) -> None:
    async def main() -> np.ndarray:
        async with AsyncClient.connect(daemon.socket) as client:
            reply = await client.infer_detailed("fcn", {"data": x(5)})
            assert client._shm is not None and len(client._shm.regions) == 1
            # the reply's timing fields: the execution's split of run_seconds
            stages = (reply.copy_in_seconds, reply.device_seconds, reply.copy_out_seconds)
            assert all(s is not None and s >= 0 for s in stages) and reply.batch_size == 1
            assert reply.run_seconds is not None and 0 < sum(stages) <= reply.run_seconds  # type: ignore[arg-type]
            return reply.outputs["out"]

    with Client.connect(tcp_address(daemon), token=TOKEN) as tcp:
        np.testing.assert_array_equal(trio.run(main), tcp.infer("fcn", {"data": x(5)})["out"])


class RawUnix:
    """Frames and descriptors by hand on the Unix socket."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.decoder = FrameDecoder()

    def call(self, message: dict, fds: tuple[int, ...] = ()) -> dict:
        frame = encode_frame(message)
        sent = self.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                                 if fds else [])
        self.sock.sendall(frame[sent:])
        while (msg := self.decoder.next_message()) is None:
            self.decoder.feed(self.sock.recv(1 << 20))
        return msg


def memfd(size: int, seal: bool) -> int:
    fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def register(raw: RawUnix, rid: int, name: str, size: int, fd: int | None) -> dict:
    msg = raw.call(ShmRegisterRequest(rid, name, size).to_message(), () if fd is None else (fd,))
    if fd is not None:
        os.close(fd)
    return msg


def test_refusals_name_why_and_the_connection_goes_on(daemon: Daemon) -> None:
    raw = RawUnix(daemon.socket)
    unsealed = register(raw, 1, "a", 4096, memfd(4096, seal=False))
    assert unsealed["ok"] is False and "sealed against shrinking" in unsealed["error"]["message"]
    short = register(raw, 2, "b", 8192, memfd(4096, seal=True))
    assert "8192 bytes, but the memfd holds 4096" in short["error"]["message"]
    none = register(raw, 3, "c", 4096, None)
    assert "no file descriptor came with the request" in none["error"]["message"]
    ok = register(raw, 4, "d", 1 << 20, memfd(1 << 20, seal=True))
    assert ok["ok"] is True, ok
    again = register(raw, 5, "d", 4096, memfd(4096, seal=True))
    assert "already registered" in again["error"]["message"]
    tensor = {"dtype": "float32", "shape": [3, 128, 128], "shm": {"region": "d", "offset": (1 << 20) - 4096}}
    past_end = raw.call({"v": 1, "id": 6, "op": "infer", "model": "fcn", "inputs": {"data": tensor}})
    assert past_end["error"]["code"] == "BAD_REQUEST"
    assert "field 'inputs.data.shm.offset'" in past_end["error"]["message"]
    unknown = raw.call({"v": 1, "id": 7, "op": "infer", "model": "fcn",
                        "inputs": {"data": {**tensor, "shm": {"region": "zz", "offset": 0}}}})
    assert "no region 'zz' registered on this connection" in unknown["error"]["message"]
    # the registered region works on the same connection, outputs written into its rest
    data = x(9)
    fd = memfd(1 << 20, seal=True)
    view = mmap.mmap(fd, 1 << 20)
    view[:data.nbytes] = data.tobytes()
    assert register(raw, 8, "e", 1 << 20, fd)["ok"]
    answer = raw.call({"v": 1, "id": 9, "op": "infer", "model": "fcn",
                       "inputs": {"data": {**tensor, "shm": {"region": "e", "offset": 0}}},
                       "outputs_shm": {"region": "e", "offset": data.nbytes, "size": (1 << 20) - data.nbytes}})
    assert answer["ok"], answer
    ref = answer["result"]["outputs"]["out"]
    assert "data" not in ref and ref["shm"] == {"region": "e", "offset": data.nbytes}
    out = np.frombuffer(view, np.float32, 4 * 128 * 128, offset=data.nbytes).reshape(4, 128, 128)
    with Client.connect(daemon.socket) as client:
        np.testing.assert_array_equal(out, client.infer("fcn", {"data": data})["out"])
    assert parse_response(raw.call({"v": 1, "id": 10, "op": "ping"})).ok
    del out
    view.close()


def test_tcp_refuses_shared_memory(daemon: Daemon) -> None:
    with Client.connect(tcp_address(daemon), token=TOKEN) as tcp:
        assert tcp._shm is None
        with pytest.raises(BadRequestError, match="needs a Unix-socket connection"):
            tcp._call(ShmRegisterRequest(tcp._conn.next_id(), "r", 4096))


@pytest.fixture(scope="module")
def gpu_daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    """The same model on the Vulkan device only (lavapipe, which imports host memory), fp16."""
    return fcn_daemon(tmp_path_factory, launch_module_daemon, "shm-gpu", 'devices = "gpu"\nprecision = "fp16"\n', "")


def shared_inputs(daemon: Daemon) -> dict[str, float]:
    assert daemon.metrics_port is not None
    code, body = http_get(daemon.metrics_port, "/metrics")
    assert code == 200
    return {path: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
            for path in ("in_place", "copied")
            if line.startswith(f'vkserve_device_shared_inputs_total{{device="vulkan:0",path="{path}"}}')}


def test_the_gpu_reads_shared_inputs_where_the_client_wrote_them(gpu_daemon: Daemon) -> None:
    """The input the client wrote into its region is what the GPU reads (the import of the
    client's pages, counted as in_place), with the inline path's answer; then, after the client
    unregistered the region with the connection's end, the next connection's region works too."""
    with Client.connect(tcp_address(gpu_daemon), token=TOKEN) as tcp:
        inline = [tcp.infer("fcn", {"data": x(seed)})["out"] for seed in range(4)]
    before = shared_inputs(gpu_daemon)
    for connection in range(2):
        with Client.connect(gpu_daemon.socket) as unix:
            for seed in range(connection * 2, connection * 2 + 2):
                np.testing.assert_array_equal(unix.infer("fcn", {"data": x(seed)})["out"], inline[seed])
    after = shared_inputs(gpu_daemon)
    assert after["in_place"] - before.get("in_place", 0) == 4, (before, after)
    assert after["copied"] == before.get("copied", 0), (before, after)
