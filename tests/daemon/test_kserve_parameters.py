"""Triton's request parameters over KServe v2, end to end with Triton's own clients:
``priority`` (a level, 1 the highest) orders the scheduler's queue and ``timeout``
(microseconds) becomes the job's deadline, on HTTP and gRPC alike.

One daemon (module scope) with both front ends, the digits example and `slow` (CPU only, one job
at a time, no batching, 2 s a run through the daemon's device-delay test hook: room to queue
six requests behind a running one), so queued jobs show the order the scheduler picks them in.
``scheduler.default_priority = -2`` makes level 2 the default, as Triton's
``default_priority_level`` would.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.support.daemon import (
    SLOW_SHAPE,
    Daemon,
    Launch,
    http_get,
    sample,
    status,
    wait_for,
    write_slow_model,
)
from tests.support.kserve import kserve_config, native_answers
from vkserve.daemon.kserve.proto import inference_pb2 as pb

SLOW_CPU = {"VKSERVE_TEST_DEVICE_DELAY": "cpu=2"}
SERIAL_SLOW = 'random_weights = true\ndevices = "cpu"\nwarmup = 0\nmax_batch_size = 1\n'
#: Either of Triton's clients: both have infer(model, inputs, priority=, timeout=).
Client = triton_http.InferenceServerClient | triton_grpc.InferenceServerClient
MODULES = {"http": triton_http, "grpc": triton_grpc}


def config(work: Path) -> str:
    write_slow_model(work / "repo", config=SERIAL_SLOW)
    return kserve_config(work, "http", "127.0.0.1:0") + """
[grpc]
listen = "127.0.0.1:0"

[scheduler]
cpu_instances = 1
default_priority = -2
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("kserve-parameters")
    (work / "repo").mkdir()
    return launch_module_daemon(work, config(work), env=SLOW_CPU)


def _http_address(daemon: Daemon) -> str:
    return daemon.wait_line("KServe v2 HTTP on http://").split("http://", 1)[1].split("/", 1)[0]


def _grpc_address(daemon: Daemon) -> str:
    return daemon.wait_line("KServe v2 gRPC on ").split("gRPC on ", 1)[1].split()[0]


def _client(daemon: Daemon, front: str) -> Client:
    address = _http_address(daemon) if front == "http" else _grpc_address(daemon)
    return MODULES[front].InferenceServerClient(address)


@pytest.fixture(scope="module")
def clients(daemon: Daemon) -> Iterator[dict[str, Client]]:
    """Triton's HTTP and gRPC clients, by front end."""
    both = {front: _client(daemon, front) for front in MODULES}
    yield both
    for client in both.values():
        client.close()


def _input(front: str, x: np.ndarray) -> list[triton_http.InferInput | triton_grpc.InferInput]:
    data = MODULES[front].InferInput("data", list(x.shape), "FP32")
    data.set_data_from_numpy(x)
    return [data]


@pytest.mark.parametrize("front", ["http", "grpc"])
def test_a_timeout_that_is_met_answers(daemon: Daemon, clients: dict, front: str) -> None:
    result = clients[front].infer("digits", _input(front, sample(3)), timeout=60_000_000)
    np.testing.assert_allclose(result.as_numpy("prob"), native_answers(daemon)[3], rtol=0, atol=1e-6)


@pytest.mark.parametrize("front, status_text", [("http", "504"), ("grpc", "StatusCode.DEADLINE_EXCEEDED")])
def test_a_too_short_timeout_is_deadline_exceeded(daemon: Daemon, clients: dict, front: str,
                                                  status_text: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        clients[front].infer("digits", _input(front, sample(3)), timeout=1)
    assert info.value.status() == status_text
    assert "deadline" in info.value.message()
    # the daemon counts it under its outcome and serves on
    assert int(clients[front].infer("digits", _input(front, sample(7))).as_numpy("prob").argmax()) == 7
    assert daemon.metrics_port is not None
    _, text = http_get(daemon.metrics_port, "/metrics")
    counts = {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
              if f.name == "vkserve_requests" for s in f.samples}
    assert any(dict(k).get("outcome") == "deadline_exceeded" and dict(k)["model"] == "digits" and v >= 1
               for k, v in counts.items()), counts


BAD_PARAMETERS = [
    ({"priority": -1}, "parameter 'priority' must be an integer of 0 or more, got -1"),
    ({"timeout": 1.5}, "parameter 'timeout' (microseconds) must be an integer of 0 or more, got 1.5"),
    ({"timeout": "100"}, "parameter 'timeout' (microseconds) must be an integer of 0 or more, got '100'"),
    ({"priority": True}, "parameter 'priority' must be an integer of 0 or more, got True"),
]


@pytest.mark.parametrize("parameter, message", BAD_PARAMETERS)
def test_bad_parameters_over_http_are_400_naming_them(daemon: Daemon, parameter: dict, message: str) -> None:
    """By hand: tritonclient itself refuses to send a priority that is not an unsigned integer."""
    x = sample(3)
    body = json.dumps({"inputs": [{"name": "data", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.ravel().tolist()}], "parameters": parameter})
    conn = http.client.HTTPConnection(_http_address(daemon), timeout=30)
    try:
        conn.request("POST", "/v2/models/digits/infer", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 400
        assert message in json.loads(response.read())["error"]
    finally:
        conn.close()


@pytest.mark.parametrize("value, message", [
    (pb.InferParameter(int64_param=-5), "parameter 'timeout' (microseconds) must be an integer of 0 or more, got -5"),
    (pb.InferParameter(string_param="soon"),
     "parameter 'timeout' must be an int64_param or uint64_param, got string_param"),
    (pb.InferParameter(double_param=2.5), "got double_param"),
])
def test_bad_parameters_over_grpc_are_invalid_argument_naming_them(daemon: Daemon, value: pb.InferParameter,
                                                                   message: str) -> None:
    x = sample(3)
    request = pb.ModelInferRequest(model_name="digits", raw_input_contents=[x.tobytes()],
                                   inputs=[pb.ModelInferRequest.InferInputTensor(
                                       name="data", datatype="FP32", shape=list(x.shape))])
    request.parameters["timeout"].CopyFrom(value)
    with grpc.insecure_channel(_grpc_address(daemon)) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as info:
            infer(request, timeout=30)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def _queued(daemon: Daemon) -> int:
    return int(status(daemon)["models"]["slow"]["queue_depth"])


def test_priority_levels_order_the_queue_on_both_front_ends(daemon: Daemon) -> None:
    finished: list[str] = []
    errors: list[InferenceServerException] = []
    lock = threading.Lock()

    def send(tag: str, front: str, priority: int) -> Callable[[], None]:
        def run() -> None:
            client = _client(daemon, front)  # one each: the HTTP client is not for several threads
            try:
                client.infer("slow", _input(front, np.zeros((1, *SLOW_SHAPE), np.float32)), priority=priority)
            except InferenceServerException as exc:  # reported by the assertion below
                errors.append(exc)
            finally:
                client.close()
            with lock:
                finished.append(tag)
        return run

    threads: list[threading.Thread] = []

    def start(tag: str, front: str, priority: int, until: Callable[[], bool], what: str) -> None:
        threads.append(threading.Thread(target=send(tag, front, priority)))
        threads[-1].start()
        wait_for(until, what=what)

    start("blocker", "grpc", 0, lambda: status(daemon)["models"]["slow"]["in_flight"] == 1, "the blocker runs")
    order = [("low-http", "http", 3), ("low-grpc", "grpc", 3), ("default-grpc", "grpc", 0),
             ("default-http", "http", 0), ("high-http", "http", 1), ("high-grpc", "grpc", 1)]
    for n, (tag, front, priority) in enumerate(order, start=1):
        start(tag, front, priority, lambda n=n: _queued(daemon) == n, f"{tag} queued")
    for t in threads:
        t.join(60)
    assert errors == []
    # level 1 first, then the default (level 2 here), then level 3; first come first within one
    assert finished == ["blocker", "high-http", "high-grpc", "default-grpc", "default-http",
                        "low-http", "low-grpc"]
