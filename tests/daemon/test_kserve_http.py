"""KServe v2 over HTTP end to end: a real `vkserve serve --config` with ``[http] listen``, spoken
to by Triton's own client (tritonclient.http) and by hand, serving the packaged digits example.

Two daemons (module scope): one on the loopback (no token), one on 0.0.0.0 (the token rule)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.support.daemon import TOKEN, Daemon, Launch, sample
from tests.support.kserve import kserve_config, native_answers
from vkserve.cli.main import main as cli_main


def http_port(d: Daemon) -> int:
    line = d.wait_line("KServe v2 HTTP on http://")
    return int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def config(work: Path, listen: str, extra: str = "") -> str:
    return kserve_config(work, "http", listen, extra)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("kserve-http")
    return launch_module_daemon(work, config(work, "127.0.0.1:0"))


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"127.0.0.1:{http_port(daemon)}")


@pytest.fixture(scope="module")
def native(daemon: Daemon) -> dict[int, np.ndarray]:
    return native_answers(daemon)


def test_banner_health_and_server_metadata(daemon: Daemon, client: triton.InferenceServerClient) -> None:
    assert not daemon.wait_line("KServe v2 HTTP on").endswith("(token required)")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits")
    meta = client.get_server_metadata()
    assert meta["name"] == "vkserve" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("digits")
    assert meta == {"name": "digits", "versions": ["1"], "platform": "vkserve",
                    "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 1, 8, 8]}],
                    "outputs": [{"name": "prob", "datatype": "FP32", "shape": [-1, 10]}]}
    assert client.get_model_repository_index() == [
        {"name": "digits", "version": "1", "state": "READY", "reason": ""}]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_equals_the_native_client(client: triton.InferenceServerClient,
                                        native: dict[int, np.ndarray], binary: bool) -> None:
    x = sample(3)
    data = triton.InferInput("data", list(x.shape), "FP32")
    data.set_data_from_numpy(x, binary_data=binary)
    out = triton.InferRequestedOutput("prob", binary_data=binary)
    result = client.infer("digits", [data], outputs=[out], request_id="r3")
    prob = result.as_numpy("prob")
    assert prob.shape == (10,) and prob.dtype == np.float32 and int(prob.argmax()) == 3
    np.testing.assert_allclose(prob, native[3], rtol=0, atol=1e-6)
    assert result.get_response()["id"] == "r3"
    assert ("data" in result.get_output("prob")) is not binary


def test_batch_of_two(client: triton.InferenceServerClient, native: dict[int, np.ndarray]) -> None:
    batch = np.stack([sample(3), sample(7)])
    data = triton.InferInput("data", list(batch.shape), "FP32")
    data.set_data_from_numpy(batch)
    prob = client.infer("digits", [data]).as_numpy("prob")  # binary outputs by default
    assert prob.shape == (2, 10) and list(prob.argmax(1)) == [3, 7]
    np.testing.assert_allclose(prob, np.stack([native[3], native[7]]), rtol=0, atol=1e-6)


def test_fp16_input_is_converted(client: triton.InferenceServerClient) -> None:
    x = sample(3).astype(np.float16)
    data = triton.InferInput("data", list(x.shape), "FP16")
    data.set_data_from_numpy(x)
    assert int(client.infer("digits", [data]).as_numpy("prob").argmax()) == 3


def test_unknown_model_is_404(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("nope")
    assert info.value.status() == "404" and "no model 'nope' (models: digits)" in info.value.message()
    assert not client.is_model_ready("nope")
    data = triton.InferInput("data", [1, 8, 8], "FP32")
    data.set_data_from_numpy(sample(3))
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [data])
    assert info.value.status() == "404"


@pytest.mark.parametrize(("shape", "dtype", "message"), [
    ([1, 2, 8], np.float32, "input 'data': shape [1, 2, 8] does not match"),
    ([1, 8, 8], np.int32, "input 'data': datatype 'INT32' is not supported"),
])
def test_bad_tensor_is_400_naming_it(client: triton.InferenceServerClient, shape: list[int],
                                     dtype: type, message: str) -> None:
    data = triton.InferInput("data", shape, "FP32" if dtype is np.float32 else "INT32")
    data.set_data_from_numpy(np.zeros(shape, dtype))
    with pytest.raises(InferenceServerException) as info:
        client.infer("digits", [data])
    assert info.value.status() == "400" and message in info.value.message(), info.value.message()


def test_keep_alive_and_error_shape_by_hand(daemon: Daemon) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", http_port(daemon), timeout=10)
    try:
        body = json.dumps({"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 8, 8],
                                       "data": sample(3).ravel().tolist()}]})
        for _ in range(2):  # two requests on one connection
            conn.request("POST", "/v2/models/digits/infer", body=body)
            r = conn.getresponse()
            out = json.loads(r.read())
            assert r.status == 200 and int(np.argmax(out["outputs"][0]["data"])) == 3
        conn.request("POST", "/v2/models/digits/infer", body=b"{oops")
        r = conn.getresponse()
        assert r.status == 400 and "not valid JSON" in json.loads(r.read())["error"]
        conn.request("GET", "/v2/nothing")
        r = conn.getresponse()
        assert r.status == 404 and r.reason == "Not Found" and "error" in json.loads(r.read())
        conn.request("HEAD", "/v2/models/digits")
        r = conn.getresponse()
        assert r.status == 200 and int(r.headers["content-length"]) > 0 and r.read() == b""
    finally:
        conn.close()


# ------------------------------------------------------------------------------ the token rule


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("kserve-http-token")
    return launch_module_daemon(work, config(work, "0.0.0.0:0", f'token = "{TOKEN}"'))


def test_non_loopback_needs_the_token(guarded: Daemon) -> None:
    assert guarded.wait_line("KServe v2 HTTP on").endswith("(token required)")
    url = f"127.0.0.1:{http_port(guarded)}"
    anonymous = triton.InferenceServerClient(url)
    with pytest.raises(InferenceServerException) as info:
        anonymous.get_server_metadata()
    assert info.value.status() == "401" and "Authorization: Bearer" in info.value.message()
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}
    with pytest.raises(InferenceServerException) as info:
        anonymous.get_model_metadata("digits", headers=wrong)
    assert info.value.status() == "401" and info.value.message() == "wrong token"
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert anonymous.is_server_ready(headers=good)
    data = triton.InferInput("data", [1, 8, 8], "FP32")
    data.set_data_from_numpy(sample(3))
    assert int(anonymous.infer("digits", [data], headers=good).as_numpy("prob").argmax()) == 3


@pytest.mark.parametrize(("extra", "message"), [
    ("", "http.listen 0.0.0.0 is set but no token"),
    ('token = "short"', "server token: at least 16 characters"),
])
def test_non_loopback_without_a_usable_token_does_not_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        extra: str, message: str) -> None:
    monkeypatch.delenv("VKSERVE_TOKEN", raising=False)
    cfg = tmp_path / "d.toml"
    cfg.write_text(config(tmp_path, "0.0.0.0:0", extra))
    assert cli_main(["serve", "--config", str(cfg), "--metrics-listen", "off"]) == 2
    assert message in capsys.readouterr().err
