"""KServe v2 over gRPC end to end: a real `vkserve serve --config` with ``[grpc] listen``,
spoken to by Triton's own client (tritonclient.grpc), serving the packaged digits example.

Two daemons (module scope): one on the loopback (no token), one on 0.0.0.0 (the token rule)."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.support.daemon import (
    SLOW_ENV,
    SLOW_SHAPE,
    TOKEN,
    Daemon,
    Launch,
    sample,
    wait_for,
    write_slow_model,
)
from tests.support.kserve import kserve_config, native_answers
from vkserve.cli.main import main as cli_main
from vkserve.client import Client


def grpc_address(d: Daemon) -> str:
    return d.wait_line("KServe v2 gRPC on ").split("gRPC on ", 1)[1].split()[0]


def config(work: Path, listen: str, extra: str = "") -> str:
    return kserve_config(work, "grpc", listen, extra)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("kserve-grpc")
    return launch_module_daemon(work, config(work, "127.0.0.1:0"))


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(grpc_address(daemon))
    yield c
    c.close()


@pytest.fixture(scope="module")
def native(daemon: Daemon) -> dict[int, np.ndarray]:
    return native_answers(daemon)


def test_health_and_server_metadata(daemon: Daemon, client: triton.InferenceServerClient) -> None:
    assert not daemon.wait_line("KServe v2 gRPC on").endswith("(token required)")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "vkserve" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("digits", as_json=True)
    assert meta["name"] == "digits" and meta["versions"] == ["1"] and meta["platform"] == "vkserve"
    # (as_json writes int64 as strings, as protobuf's JSON mapping does)
    assert meta["inputs"] == [{"name": "data", "datatype": "FP32", "shape": ["-1", "1", "8", "8"]}]
    assert meta["outputs"] == [{"name": "prob", "datatype": "FP32", "shape": ["-1", "10"]}]


def test_infer_equals_the_native_client(client: triton.InferenceServerClient,
                                        native: dict[int, np.ndarray]) -> None:
    x = sample(3)
    data = triton.InferInput("data", list(x.shape), "FP32")
    data.set_data_from_numpy(x)
    result = client.infer("digits", [data], request_id="g3",
                          outputs=[triton.InferRequestedOutput("prob")])
    prob = result.as_numpy("prob")
    assert prob.shape == (10,) and prob.dtype == np.float32 and int(prob.argmax()) == 3
    np.testing.assert_allclose(prob, native[3], rtol=0, atol=1e-6)
    assert result.get_response().id == "g3"


def test_batch_of_two_and_fp64(client: triton.InferenceServerClient, native: dict[int, np.ndarray]) -> None:
    batch = np.stack([sample(3), sample(7)])
    data = triton.InferInput("data", list(batch.shape), "FP32")
    data.set_data_from_numpy(batch)
    prob = client.infer("digits", [data]).as_numpy("prob")
    assert prob.shape == (2, 10) and list(prob.argmax(1)) == [3, 7]
    np.testing.assert_allclose(prob, np.stack([native[3], native[7]]), rtol=0, atol=1e-6)
    wide = triton.InferInput("data", list(batch.shape), "FP64")
    wide.set_data_from_numpy(batch.astype(np.float64))
    assert list(client.infer("digits", [wide]).as_numpy("prob").argmax(1)) == [3, 7]


def test_unknown_model_is_not_found(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("nope")
    assert info.value.status() == str(grpc.StatusCode.NOT_FOUND)
    assert "no model 'nope' (models: digits)" in info.value.message()
    data = triton.InferInput("data", [1, 8, 8], "FP32")
    data.set_data_from_numpy(sample(3))
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [data])
    assert info.value.status() == str(grpc.StatusCode.NOT_FOUND)


@pytest.mark.parametrize(("shape", "datatype", "dtype", "message"), [
    ([1, 2, 8], "FP32", np.float32, "input 'data': shape [1, 2, 8] does not match"),
    ([1, 8, 8], "INT32", np.int32, "input 'data': datatype 'INT32' is not supported"),
])
def test_bad_tensor_is_invalid_argument_naming_it(client: triton.InferenceServerClient, shape: list[int],
                                                  datatype: str, dtype: type, message: str) -> None:
    data = triton.InferInput("data", shape, datatype)
    data.set_data_from_numpy(np.zeros(shape, dtype))
    with pytest.raises(InferenceServerException) as info:
        client.infer("digits", [data])
    assert info.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert message in info.value.message(), info.value.message()


# ------------------------------------------------------------------------------ the token rule


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("kserve-grpc-token")
    return launch_module_daemon(work, config(work, "0.0.0.0:0", f'token = "{TOKEN}"'))


def test_non_loopback_needs_the_token(guarded: Daemon) -> None:
    assert guarded.wait_line("KServe v2 gRPC on").endswith("(token required)")
    port = grpc_address(guarded).rsplit(":", 1)[1]
    c = triton.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        with pytest.raises(InferenceServerException) as info:
            c.get_server_metadata()
        assert info.value.status() == str(grpc.StatusCode.UNAUTHENTICATED)
        assert "authorization: Bearer <token>" in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            c.is_server_live(headers={"authorization": "Bearer wrong-token-0123456789"})
        assert info.value.status() == str(grpc.StatusCode.UNAUTHENTICATED)
        good = {"authorization": f"Bearer {TOKEN}"}
        assert c.is_server_ready(headers=good)
        data = triton.InferInput("data", [1, 8, 8], "FP32")
        data.set_data_from_numpy(sample(3))
        assert int(c.infer("digits", [data], headers=good).as_numpy("prob").argmax()) == 3
    finally:
        c.close()


def test_non_loopback_without_a_token_does_not_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VKSERVE_TOKEN", raising=False)
    cfg = tmp_path / "d.toml"
    cfg.write_text(config(tmp_path, "0.0.0.0:0"))
    assert cli_main(["serve", "--config", str(cfg), "--metrics-listen", "off"]) == 2
    assert "grpc.listen 0.0.0.0 is set but no token" in capsys.readouterr().err


# ------------------------------------------------------------------------------ drain


def test_sigterm_drains_calls_in_flight_on_both_front_ends(tmp_path: Path, launch_daemon: Launch) -> None:
    """Calls in flight over gRPC and HTTP when SIGTERM arrives are answered; then the daemon
    exits 0 (`slow` takes 0.3 s a run)."""
    text = config(tmp_path, "127.0.0.1:0") + '\n[http]\nlisten = "127.0.0.1:0"\n'
    write_slow_model(tmp_path / "repo")
    d = launch_daemon(tmp_path, text, env=SLOW_ENV)
    g = triton.InferenceServerClient(grpc_address(d))
    h_line = d.wait_line("KServe v2 HTTP on http://")
    h = triton_http.InferenceServerClient(h_line.split("http://", 1)[1].split("/", 1)[0])
    x = np.zeros((4, *SLOW_SHAPE), np.float32)  # a batch of 4: more than one run
    answers: dict[str, object] = {}

    def via_grpc() -> None:
        data = triton.InferInput("data", list(x.shape), "FP32")
        data.set_data_from_numpy(x)
        answers["grpc"] = g.infer("slow", [data]).as_numpy("out").shape

    def via_http() -> None:
        data = triton_http.InferInput("data", list(x.shape), "FP32")
        data.set_data_from_numpy(x)
        answers["http"] = h.infer("slow", [data]).as_numpy("out").shape

    threads = [threading.Thread(target=via_grpc), threading.Thread(target=via_http)]
    for t in threads:
        t.start()
    wait_for(lambda: _in_flight(d) >= 3, what="both calls in flight")  # (and the status request)
    d.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    assert answers == {"grpc": (4, 64), "http": (4, 64)}
    assert d.proc.wait(30) == 0
    assert any("draining 2 request(s)" in line for line in d.lines), d.lines
    g.close()


def _in_flight(d: Daemon) -> int:
    with Client.connect(f"unix:{d.socket}") as c:
        return int(c.status()["server"]["requests_in_flight"])


@pytest.mark.parametrize("flag", ["--http", "--grpc"])
def test_a_taken_port_stops_the_start(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tmp_path / "d.toml"
        cfg.write_text(config(tmp_path, ""))
        assert cli_main(["serve", "--config", str(cfg), "--metrics-listen", "off",
                         flag, f"127.0.0.1:{port}"]) == 1
    assert f"{flag[2:]}.listen 127.0.0.1:{port}: cannot listen" in capsys.readouterr().err
