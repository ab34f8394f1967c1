"""The KServe v2 HTTP mapping without sockets: requests in, responses out (http_core), over a
scripted scheduler double."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import trio

from vkserve.daemon.kserve.http_core import HEADER_LENGTH, HttpRequest, HttpResponse, answer, authorize
from vkserve.daemon.kserve.service import KServeService
from vkserve.scheduler import InferResult, ModelInfo, ModelState
from vkserve.scheduler.errors import BadInput, Overloaded

TOKEN = "http-core-token-0123456789"


def model(name: str, state: ModelState = ModelState.READY, error: str | None = None,
          max_batch_size: int = 8) -> ModelInfo:
    return ModelInfo(name=name, state=state, inputs={"data": [1, 8, 8]}, outputs={"prob": [10]},
                     devices=[0], placements=[], queue_depth=0, in_flight=0, queue_limit=64,
                     precision="fp32", error=error, max_batch_size=max_batch_size)


class FakeBackend:
    """models() and infer() of the scheduler: infer answers prob = the input's sum, per item."""

    def __init__(self) -> None:
        self.infos = [model("digits"), model("broken", ModelState.FAILED, "no weights")]
        self.calls: list[dict[str, np.ndarray]] = []
        self.scheduling: list[tuple[int | None, float | None]] = []  # (priority, deadline) per call
        self.fail: Exception | None = None
        self.hang = False  # True: never answer (a scheduler that misses the deadline)

    def models(self) -> list[ModelInfo]:
        return list(self.infos)

    async def infer(self, name: str, inputs: dict[str, np.ndarray], *, priority: int | None = None,
                    deadline: float | None = None, outputs: list[str] | None = None) -> InferResult:
        if self.fail is not None:
            raise self.fail
        if self.hang:
            await trio.sleep_forever()
        self.calls.append(inputs)
        self.scheduling.append((priority, deadline))
        x = inputs["data"].astype(np.float32)
        if x.ndim == 4:  # a client batch
            prob = np.stack([np.full(10, item.sum(), np.float32) for item in x])
        else:
            prob = np.full(10, x.sum(), np.float32)
        return InferResult(outputs={"prob": prob}, device="fake", queue_seconds=0.0, run_seconds=0.0)


class FakeHost:
    def __init__(self) -> None:
        self.backend = FakeBackend()
        self.version = "9.9.9"
        self.draining = False
        self.requests_done = 0
        self.ready = True
        self.observed: list[tuple[str, str]] = []

    def readiness(self) -> tuple[bool, str]:
        return self.ready, "why"

    def observe_infer(self, model: str, result: InferResult | None, outcome: str, total: float) -> None:
        self.observed.append((model, outcome))


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


async def call(host: FakeHost, method: str, target: str, body: bytes | dict | None = None,
               headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    raw = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    return await answer(HttpRequest(method, target, headers, raw), KServeService(host))


def doc(response: HttpResponse) -> dict:
    return json.loads(response.body)


async def test_health_and_server_metadata(host: FakeHost) -> None:
    assert (await call(host, "GET", "/v2/health/live")).status == 200
    assert (await call(host, "GET", "/v2/health/ready")).status == 200
    host.ready = False
    assert (await call(host, "GET", "/v2/health/ready")).status == 503
    meta = doc(await call(host, "GET", "/v2"))
    assert meta == {"name": "vkserve", "version": "9.9.9", "extensions": ["binary_tensor_data"]}
    head = await call(host, "HEAD", "/v2/health/live")
    assert head.status == 200


async def test_model_metadata_shows_the_batch_dimension_when_the_model_batches(host: FakeHost) -> None:
    meta = doc(await call(host, "GET", "/v2/models/digits"))
    assert meta == {"name": "digits", "versions": ["1"], "platform": "vkserve",
                    "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 1, 8, 8]}],
                    "outputs": [{"name": "prob", "datatype": "FP32", "shape": [-1, 10]}]}
    assert doc(await call(host, "GET", "/v2/models/digits/versions/1"))["name"] == "digits"
    host.backend.infos[0] = model("digits", max_batch_size=1)
    meta = doc(await call(host, "GET", "/v2/models/digits"))
    assert meta["inputs"][0]["shape"] == [1, 8, 8] and meta["outputs"][0]["shape"] == [10]


async def test_unknown_model_version_and_path_are_404(host: FakeHost) -> None:
    r = await call(host, "GET", "/v2/models/nope")
    assert r.status == 404 and "no model 'nope' (models: digits, broken)" in doc(r)["error"]
    r = await call(host, "GET", "/v2/models/digits/versions/2")
    assert r.status == 404 and "no version '2'" in doc(r)["error"]
    assert (await call(host, "POST", "/v2/models/nope/infer", {"inputs": []})).status == 404
    r = await call(host, "GET", "/v3/whatever")
    assert r.status == 404 and "no such endpoint" in doc(r)["error"]
    r = await call(host, "POST", "/v2/models/digits")
    assert r.status == 405 and ("allow", "GET") in r.headers


async def test_model_ready_and_repository_index(host: FakeHost) -> None:
    assert (await call(host, "GET", "/v2/models/digits/ready")).status == 200
    assert (await call(host, "GET", "/v2/models/broken/ready")).status == 503
    assert doc(await call(host, "POST", "/v2/repository/index")) == [
        {"name": "digits", "version": "1", "state": "READY", "reason": ""},
        {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "no weights"}]
    ready = json.loads((await call(host, "POST", "/v2/repository/index", {"ready": True})).body)
    assert [e["name"] for e in ready] == ["digits"]


async def test_infer_json(host: FakeHost) -> None:
    x = np.arange(64, dtype=np.float32).reshape(1, 8, 8)
    r = await call(host, "POST", "/v2/models/digits/infer", {
        "id": "r1", "inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 8, 8],
                                "data": x.ravel().tolist()}]})
    assert r.status == 200 and ("content-type", "application/json") in r.headers
    out = doc(r)
    assert out["model_name"] == "digits" and out["model_version"] == "1" and out["id"] == "r1"
    assert out["outputs"] == [{"name": "prob", "datatype": "FP32", "shape": [10],
                               "data": [float(x.sum())] * 10}]
    np.testing.assert_array_equal(host.backend.calls[0]["data"], x)
    assert host.observed == [("digits", "ok")] and host.requests_done == 1


async def test_infer_nested_json_fp64_and_a_batch(host: FakeHost) -> None:
    x = np.ones((2, 1, 8, 8))
    r = await call(host, "POST", "/v2/models/digits/infer", {
        "inputs": [{"name": "data", "datatype": "FP64", "shape": [2, 1, 8, 8], "data": x.tolist()}]})
    assert r.status == 200, r.body
    assert doc(r)["outputs"][0]["shape"] == [2, 10]
    assert host.backend.calls[0]["data"].dtype == np.float64  # the scheduler converts it


async def test_infer_binary_data_both_ways(host: FakeHost) -> None:
    x = np.full((1, 8, 8), 0.5, np.float16)
    head = json.dumps({"inputs": [{"name": "data", "datatype": "FP16", "shape": [1, 8, 8],
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "prob", "parameters": {"binary_data": True}}]}).encode()
    r = await call(host, "POST", "/v2/models/digits/infer", head + x.tobytes(),
                   headers=((HEADER_LENGTH, str(len(head))),))
    assert r.status == 200, r.body
    headers = dict(r.headers)
    assert headers["content-type"] == "application/octet-stream"
    n = int(headers[HEADER_LENGTH])
    out = json.loads(r.body[:n])["outputs"][0]
    assert out["parameters"] == {"binary_data_size": 40} and "data" not in out
    np.testing.assert_array_equal(np.frombuffer(r.body[n:], np.float32), np.full(10, 32.0))
    # the request-wide binary_data_output parameter
    body = {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 8, 8], "data": [0] * 64}],
            "parameters": {"binary_data_output": True}}
    r = await call(host, "POST", "/v2/models/digits/infer", body)
    assert len(r.body) == int(dict(r.headers)[HEADER_LENGTH]) + 40


@pytest.mark.parametrize(("tensor", "message"), [
    ({"name": "data", "datatype": "INT32", "shape": [1, 8, 8], "data": [0] * 64},
     "input 'data': datatype 'INT32' is not supported"),
    ({"name": "data", "datatype": "FP32", "shape": [1, 8, 8], "data": [0] * 63},
     "input 'data': 63 values for shape [1, 8, 8] (64 expected)"),
    ({"name": "data", "datatype": "FP32", "shape": [1, -8, 8], "data": [0] * 64},
     "input 'data': shape must be a list of sizes >= 0"),
    ({"name": "data", "datatype": "FP32", "shape": [1, 8, 8], "data": ["a"] * 64},
     "input 'data': data must be a list of numbers"),
    ({"name": "data", "datatype": "FP32", "shape": [1, 8, 8]},
     "input 'data': no 'data' and no binary_data_size parameter"),
    ({"name": "data", "datatype": "FP32", "shape": [1, 8, 8], "parameters": {"binary_data_size": 256}},
     "input 'data': binary_data_size 256 does not fit the 0 bytes"),
])
async def test_bad_tensors_are_400_naming_the_tensor(host: FakeHost, tensor: dict, message: str) -> None:
    r = await call(host, "POST", "/v2/models/digits/infer", {"inputs": [tensor]})
    assert r.status == 400 and message in doc(r)["error"], doc(r)
    assert host.backend.calls == []


async def test_malformed_bodies_are_400(host: FakeHost) -> None:
    url = "/v2/models/digits/infer"
    r = await call(host, "POST", url, b"{not json")
    assert r.status == 400 and "not valid JSON" in doc(r)["error"]
    r = await call(host, "POST", url, {"inputs": []})
    assert r.status == 400 and "'inputs' must be a non-empty list" in doc(r)["error"]
    body = json.dumps({"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 8, 8],
                                   "data": [0] * 64}]}).encode()
    r = await call(host, "POST", url, body + b"xx", headers=((HEADER_LENGTH, str(len(body))),))
    assert r.status == 400 and "2 bytes of binary data that no input" in doc(r)["error"]
    r = await call(host, "POST", url, body, headers=((HEADER_LENGTH, "99999"),))
    assert r.status == 400 and "Inference-Header-Content-Length" in doc(r)["error"]
    r = await call(host, "POST", url, body, headers=(("content-encoding", "gzip"),))
    assert r.status == 400 and "Content-Encoding 'gzip'" in doc(r)["error"]


async def test_scheduler_errors_keep_their_code(host: FakeHost) -> None:
    body = {"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 2, 8], "data": [0] * 16}]}
    host.backend.fail = BadInput("input 'data': shape [1, 2, 8] does not match the model's [1, 8, 8]")
    r = await call(host, "POST", "/v2/models/digits/infer", body)
    assert r.status == 400 and "input 'data': shape [1, 2, 8]" in doc(r)["error"]
    host.backend.fail = Overloaded("model 'digits': queue full")
    r = await call(host, "POST", "/v2/models/digits/infer", body)
    assert r.status == 503 and "queue full" in doc(r)["error"]
    assert host.observed == [("digits", "bad_request"), ("digits", "overloaded")]
    host.draining = True
    r = await call(host, "POST", "/v2/models/digits/infer", body)
    assert r.status == 503 and "shutting down" in doc(r)["error"]


async def test_triton_priority_and_timeout_become_the_scheduler_priority_and_deadline(host: FakeHost) -> None:
    tensor = {"name": "data", "datatype": "FP32", "shape": [1, 8, 8], "data": [0] * 64}
    url = "/v2/models/digits/infer"
    assert (await call(host, "POST", url, {"inputs": [tensor]})).status == 200
    assert (await call(host, "POST", url, {"inputs": [tensor], "parameters": {"priority": 0, "timeout": 0}})
            ).status == 200
    before = time.time()
    r = await call(host, "POST", url, {"inputs": [tensor], "parameters": {"priority": 3, "timeout": 250_000}})
    after = time.time()
    assert r.status == 200
    assert host.backend.scheduling[:2] == [(None, None), (None, None)]  # none given: the defaults
    priority, deadline = host.backend.scheduling[2]
    assert priority == -3  # level 3 below level 1 and 2: the scheduler runs higher first
    assert deadline is not None and before + 0.25 <= deadline <= after + 0.25


async def test_a_missed_timeout_is_504_even_when_the_scheduler_does_not_answer(host: FakeHost) -> None:
    host.backend.hang = True
    tensor = {"name": "data", "datatype": "FP32", "shape": [1, 8, 8], "data": [0] * 64}
    r = await call(host, "POST", "/v2/models/digits/infer", {"inputs": [tensor], "parameters": {"timeout": 1000}})
    assert r.status == 504 and "no result within the request's timeout (1000 us)" in doc(r)["error"]
    assert host.observed == [("digits", "deadline_exceeded")]


@pytest.mark.parametrize("parameters, message", [
    ({"priority": -1}, "parameter 'priority' must be an integer of 0 or more, got -1"),
    ({"priority": 2**64}, "parameter 'priority' must be an integer of 0 or more"),
    ({"timeout": 0.5}, "parameter 'timeout' (microseconds) must be an integer of 0 or more, got 0.5"),
    ({"timeout": None}, "parameter 'timeout' (microseconds) must be an integer of 0 or more, got None"),
])
async def test_bad_priority_or_timeout_is_400_naming_it(host: FakeHost, parameters: dict, message: str) -> None:
    tensor = {"name": "data", "datatype": "FP32", "shape": [1, 8, 8], "data": [0] * 64}
    r = await call(host, "POST", "/v2/models/digits/infer", {"inputs": [tensor], "parameters": parameters})
    assert r.status == 400 and message in doc(r)["error"], doc(r)
    assert host.backend.calls == []


def test_authorize() -> None:
    assert authorize((), None) is None
    missing = authorize((), TOKEN)
    assert missing is not None and missing.status == 401 and ("www-authenticate", "Bearer") in missing.headers
    assert "Authorization: Bearer <token>" in doc(missing)["error"]
    wrong = authorize((("authorization", "Bearer nope"),), TOKEN)
    assert wrong is not None and doc(wrong)["error"] == "wrong token"
    assert authorize((("authorization", f"Bearer {TOKEN}"),), TOKEN) is None
    assert authorize((("authorization", f"bearer {TOKEN}"),), TOKEN) is None
