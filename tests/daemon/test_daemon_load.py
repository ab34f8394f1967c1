"""The daemon under load: real `vkserve serve` subprocesses (lavapipe + CPU), many clients.

- load: 16 clients (each its own connection) x 200 requests over two models and two
  priorities; every request is answered exactly once (counted on the wire, per request id)
  and with the result of its own input; with the devices saturated, priority 5 waits less in
  the queue than priority 0;
- backpressure: a model whose queue holds 2 jobs, on a slowed device, answers the excess of
  a burst OVERLOADED at once (the queue stays at its limit, and the daemon's peak memory does
  not rise burst after burst) and serves normally afterwards;
- failover: a device fault injected into the Vulkan device (the daemon's test hook in the
  device worker: ``VKSERVE_TEST_DEVICE_FAULT`` fails the device's first runs, so the model
  skips its warm-up and the runs are slowed until every client has requests queued behind
  them): no request lost or duplicated, the device is unhealthy in `vkserve status --json`,
  and the work goes on on the CPU (the model loaded there on demand).

The harness (``launch_daemon``, ``Raw``, ``status``, ...) is the one of test_daemon.py.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from tests.support.daemon import (
    DIGITS,
    ROOT,
    Daemon,
    Launch,
    Raw,
    req,
    sample,
    status,
    vkserve_cmd,
    wait_status,
)
from vkserve.client import AsyncClient, Client
from vkserve.client.messages import InferReply, decode_infer_result
from vkserve.client.protocol import Response, encode_frame, encode_tensors
from vkserve.scheduler import SchedulerConfig

#: A second model whose output names its input exactly: the mean of each channel of a 3x4x4
#: input (no weights; exact in the CPU engine's bf16 for the small integers used as tags).
TAG_PARAM = """7767517
2 2
Input            data   0 1 data 0=4 1=4 2=3
Pooling          gap    1 1 data out 0=1 4=1
"""
TAG_SHAPE = (3, 4, 4)

CLIENTS = 16
REQUESTS_PER_CLIENT = 200
WINDOW = 3  # requests each client keeps in flight per model
HIGH, LOW = 5, 0


# ------------------------------------------------------------------------------ load driver


class CountingClient(AsyncClient):
    """The async client, counting every request id it sends and every response id it reads
    (the stock client drops an answer it no longer waits for, so a duplicate would be silent)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[int] = []
        self.answers: Counter[int] = Counter()

    async def _call(self, request: Any, *args: Any) -> Any:
        self.sent.append(request.id)
        return await super()._call(request, *args)

    def _dispatch(self, response: Response) -> None:
        self.answers[response.id] += 1
        super()._dispatch(response)


@dataclass
class Job:
    n: int  # unique over the whole run
    model: str
    priority: int
    inputs: dict[str, np.ndarray]
    expected: np.ndarray


def tag_input(n: int) -> tuple[np.ndarray, np.ndarray]:
    """An input whose three channels hold the base-16 digits of ``n``, and its output."""
    tag = np.array([n // 256, (n // 16) % 16, n % 16], np.float32)
    return np.broadcast_to(tag[:, None, None], TAG_SHAPE).copy(), tag


class DigitsReference:
    """The digits model run in-process on the CPU engine (what `vkserve run` computes)."""

    def __init__(self, folder: Path = DIGITS) -> None:
        from vkserve.devices.cpu.executor import Plan
        from vkserve.models.graph import load_model

        self.plan = Plan(load_model(folder / "model.param", folder / "model.bin"))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.array(self.plan.run({"data": x})["prob"], copy=True)


def make_jobs(clients: int, per_client: int, *, models: tuple[str, ...], high_share: float,
              seed: int = 0) -> list[list[Job]]:
    """Per client, its jobs: a distinct input each (a mix-up between requests changes the
    answer), the model and priority drawn at random."""
    rng = np.random.default_rng(seed)
    reference = DigitsReference()
    plans = []
    for c in range(clients):
        jobs = []
        for j in range(per_client):
            n = c * per_client + j
            model = str(rng.choice(models))
            priority = HIGH if rng.random() < high_share else LOW
            if model == "tag":
                x, expected = tag_input(n)
            else:  # a sample of digit n % 10, perturbed so that no two inputs are equal
                x = (sample(n % 10) + rng.uniform(-0.5, 0.5, (1, 8, 8))).astype(np.float32)
                expected = reference(x)
            jobs.append(Job(n, model, priority, {"data": x}, expected))
        plans.append(jobs)
    return plans


@dataclass
class LoadResult:
    replies: dict[int, InferReply]
    clients: list[CountingClient]
    seconds: float


async def drive(d: Daemon, plans: list[list[Job]], window: int = WINDOW) -> LoadResult:
    """One connection per plan, ``window`` requests per model in flight on each, until every
    job ran; the connection sends its requests in the plan's order within each model."""
    replies: dict[int, InferReply] = {}
    clients: list[CountingClient] = []

    async def client(jobs: list[Job]) -> None:
        async with CountingClient.connect(f"unix:{d.socket}") as c:
            clients.append(c)

            async def worker(todo: Iterator[Job]) -> None:
                for job in todo:  # shared by the workers of the connection and model
                    reply = await c.infer_detailed(job.model, job.inputs,
                                                   priority=job.priority, timeout=60)
                    assert job.n not in replies, f"job {job.n} answered twice"
                    replies[job.n] = reply

            async with trio.open_nursery() as nursery:
                # ``window`` requests in flight per model, so that every model's device stays
                # saturated whatever their speeds (one shared window would pile up on the
                # slowest device and leave the others idle)
                for model in sorted({job.model for job in jobs}):
                    todo = iter([job for job in jobs if job.model == model])
                    for _ in range(window):
                        nursery.start_soon(worker, todo)

    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        for jobs in plans:
            nursery.start_soon(client, jobs)
    return LoadResult(replies, clients, time.monotonic() - start)


def check_exactly_once_and_correct(plans: list[list[Job]], result: LoadResult) -> None:
    jobs = [job for jobs in plans for job in jobs]
    assert sorted(result.replies) == sorted(job.n for job in jobs)
    for c in result.clients:
        # every request id sent on the connection answered once, and nothing else came back
        assert c.answers == Counter(c.sent), {i: n for i, n in c.answers.items() if n != 1}
    assert sum(len(c.sent) for c in result.clients) == len(jobs)
    for job in jobs:
        reply = result.replies[job.n]
        got = reply.outputs["prob" if job.model == "digits" else "out"]
        if job.model == "tag":
            np.testing.assert_array_equal(got, job.expected, err_msg=f"job {job.n}")
        else:  # lavapipe (fp32/fp16) or the bf16 CPU engine against the in-process CPU engine
            np.testing.assert_allclose(got, job.expected, atol=2e-2, err_msg=f"job {job.n}")
            assert int(got.argmax()) == int(job.expected.argmax()), f"job {job.n}"
        assert reply.queue_seconds is not None and reply.queue_seconds >= 0


def model_folder(path: Path, param: str, config: str, bin_from: Path | None = None) -> None:
    path.mkdir(parents=True)
    (path / "model.param").write_text(param)
    if bin_from is not None:
        (path / "model.bin").symlink_to(bin_from)
    (path / "config.toml").write_text(config)


def vulkan_device(s: dict[str, Any]) -> dict[str, Any]:
    gpus = [dev for dev in s["devices"] if dev["kind"] != "cpu"]
    assert gpus, f"the daemon found no Vulkan device (lavapipe): {s['devices']}"
    return gpus[0]


def cpu_device(s: dict[str, Any]) -> dict[str, Any]:
    return next(dev for dev in s["devices"] if dev["kind"] == "cpu")


# ------------------------------------------------------------------------------ load


#: Every run takes this much longer (the daemon's device test hook), digits on lavapipe and
#: tag on the CPU: the devices, not the event loop, are the bottleneck, so jobs pile up in the
#: queues of both models.
LOAD_DELAY_S = {"digits": 0.004, "tag": 0.004}


@pytest.fixture(scope="module")
def load_daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("load")
    repo = work / "repo"
    repo.mkdir()
    # one job a run (no dynamic batching), so the load saturates both devices whatever the
    # daemon's own speed: priorities then decide who waits
    shutil.copytree(DIGITS, repo / "digits")  # devices = auto: the Vulkan device (lavapipe)
    config = repo / "digits" / "config.toml"
    config.write_text(config.read_text().replace("warmup = 2", "warmup = 2\nmax_batch_size = 1"))
    model_folder(repo / "tag", TAG_PARAM,
                 'random_weights = true\ndevices = "cpu"\nmax_batch_size = 1\n')
    return launch_module_daemon(work, f"""
[server]
socket = "{work}/load.sock"

[models]
repository = "{repo}"

[scheduler]
queue_limit_per_model = 1024
""", env={"VKSERVE_TEST_DEVICE_DELAY": f"0={LOAD_DELAY_S['digits']},cpu={LOAD_DELAY_S['tag']}"})


async def test_load_16_clients_two_models_two_priorities(load_daemon: Daemon) -> None:
    d = load_daemon
    s = status(d)
    gpu, cpu = vulkan_device(s), cpu_device(s)
    assert gpu["models"] == ["digits"] and cpu["models"] == ["tag"], s["devices"]
    before = s["totals"]
    plans = make_jobs(CLIENTS, REQUESTS_PER_CLIENT, models=("digits", "tag"), high_share=0.25)
    result = await drive(d, plans)
    check_exactly_once_and_correct(plans, result)

    after = status(d)
    total = CLIENTS * REQUESTS_PER_CLIENT
    delta = {k: after["totals"][k] - before[k] for k in before}
    assert delta["submitted"] == delta["completed"] == total, delta
    assert delta["failed"] == delta["overloaded"] == delta["retried"] == 0, delta
    assert after["queue_depth"] == 0 and after["in_flight"] == 0

    jobs = {job.n: job for jobs in plans for job in jobs}
    by_device = Counter(r.device for r in result.replies.values())
    assert set(by_device) == {gpu["device"], cpu["device"]} == {"vulkan:0", "cpu"}, by_device
    # Under saturation, priority 5 jumps the queue: per model (each has its own device
    # here), its queue time is well below that of priority 0.
    report = {}
    for model in ("digits", "tag"):
        q = {p: [r.queue_seconds for n, r in result.replies.items()
                 if jobs[n].model == model and jobs[n].priority == p] for p in (HIGH, LOW)}
        assert all(len(v) > 100 for v in q.values()), {p: len(v) for p, v in q.items()}
        mean = {p: statistics.fmean(v) for p, v in q.items()}
        median = {p: statistics.median(v) for p, v in q.items()}
        report[model] = (mean, median)
        # saturated: priority-0 jobs wait for several runs of the device
        assert median[LOW] > 3 * LOAD_DELAY_S[model], report
        assert mean[HIGH] < 0.5 * mean[LOW] and median[HIGH] < 0.5 * median[LOW], report
    print(f"load: {total} requests in {result.seconds:.1f} s; queue seconds (mean, median) "
          f"per model and priority: {report}")


# ------------------------------------------------------------------------------ backpressure


BURST_PARAM = """7767517
2 2
Input            data   0 1 data 0=32 1=32 2=32
Pooling          gap    1 1 data out 0=1 4=1
"""
BURST_SHAPE = (32, 32, 32)  # 128 KiB of float32 a request
BURST_DELAY_S = 1.0  # every CPU run: no slot frees while the burst is being answered
BURST_CONNECTIONS = 4
BURST_PER_CONNECTION = 100
QUEUE_LIMIT = 2
CPU_SLOTS = 2


def rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


def reset_rss_peak(pid: int) -> bool:
    """Reset the process's peak RSS (Linux >= 4.0: ``echo 5 > /proc/PID/clear_refs``)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _frames(msgs: list[dict[str, Any]]) -> list[bytes]:
    return [encode_frame(m) for m in msgs]


def _models(d: Daemon) -> list[dict[str, Any]]:
    with Client.connect(f"unix:{d.socket}") as c:
        return c.models()


def burst_request(rid: int, value: float) -> dict[str, Any]:
    x = np.full(BURST_SHAPE, value, np.float32)
    return req(rid, "infer", model="burst", inputs=encode_tensors({"data": x}))


def run_burst(d: Daemon) -> tuple[float, float, float]:
    """Send BURST_CONNECTIONS x BURST_PER_CONNECTION requests for ``burst`` at once and check
    the answers: the device's slots and the queue take CPU_SLOTS + QUEUE_LIMIT of them (run
    to completion with the right results), every other one is OVERLOADED before a slot could
    free. Returns the seconds to the last rejection, and the daemon's peak RSS during the burst
    (MiB) and its growth over the RSS before it (0 where the peak cannot be reset)."""
    # request c*1000+i carries a constant input of value i % 7: its output, 32 times that
    value = {c * 1000 + i: float(i % 7) for c in range(BURST_CONNECTIONS)
             for i in range(1, BURST_PER_CONNECTION + 1)}
    ids = [[c * 1000 + i for i in range(1, BURST_PER_CONNECTION + 1)]
           for c in range(BURST_CONNECTIONS)]
    frames = [b"".join(_frames([burst_request(rid, value[rid]) for rid in conn_ids]))
              for conn_ids in ids]
    total = BURST_CONNECTIONS * BURST_PER_CONNECTION
    before = status(d)["totals"]
    peak_reset = reset_rss_peak(d.proc.pid)
    rss_before = rss_peak_kib(d.proc.pid)

    conns = [Raw(d.socket) for _ in range(BURST_CONNECTIONS)]
    answers: list[tuple[float, Response]] = []  # (seconds after the burst, answer)
    errors: list[BaseException] = []
    rejected_all = threading.Event()
    expected_rejections = total - CPU_SLOTS - QUEUE_LIMIT
    lock = threading.Lock()
    start = time.monotonic()

    def read(r: Raw, pending: set[int]) -> None:
        try:
            while pending:
                a = r.recv(timeout=3 * BURST_DELAY_S + 10)
                assert a is not None, "the daemon closed a connection"
                assert a.id in pending, f"answer to {a.id} twice (or never asked)"
                pending.discard(a.id)
                with lock:
                    answers.append((time.monotonic() - start, a))
                    if sum(1 for _, x in answers if not x.ok) == expected_rejections:
                        rejected_all.set()
        except BaseException as exc:  # noqa: BLE001 (reported by the test thread)
            errors.append(exc)

    readers = [threading.Thread(target=read, args=(r, set(conn_ids)), daemon=True)
               for conn_ids, r in zip(ids, conns)]
    try:
        start = time.monotonic()
        for t in readers:
            t.start()
        for frame, r in zip(frames, conns):
            r.send(frame)
        assert rejected_all.wait(BURST_DELAY_S), (len(answers), errors)
        # the burst is answered and no slot freed yet: the queue holds exactly its limit
        s = status(d)
        assert s["models"]["burst"]["queue_depth"] == QUEUE_LIMIT, s["models"]
        assert s["models"]["burst"]["in_flight"] == CPU_SLOTS, s["models"]
        for t in readers:
            t.join(3 * BURST_DELAY_S + 10)
        assert not errors, errors
    finally:
        for r in conns:
            r.sock.close()
    peak_mib = rss_peak_kib(d.proc.pid) / 1024
    peak_growth_mib = peak_mib - rss_before / 1024 if peak_reset else 0.0

    assert len(answers) == total
    ok = [(t, a) for t, a in answers if a.ok]
    rejected = [(t, a) for t, a in answers if not a.ok]
    assert len(ok) == CPU_SLOTS + QUEUE_LIMIT, [a for _, a in ok]
    assert {a.error.code for _, a in rejected} == {"OVERLOADED"}
    assert all("queue full" in a.error.message for _, a in rejected), rejected[0][1]
    # at once: the last rejection came before the first admitted job could finish
    last_rejection = max(t for t, _ in rejected)
    assert last_rejection < BURST_DELAY_S < min(t for t, _ in ok), (
        last_rejection, min(t for t, _ in ok))
    for _, a in ok:
        out = decode_infer_result(a.result)["out"]
        np.testing.assert_array_equal(out, np.full(BURST_SHAPE[0], value[a.id], np.float32))
    after = wait_status(d, lambda s: s["queue_depth"] == 0 and s["in_flight"] == 0)["totals"]
    assert after["overloaded"] - before["overloaded"] == len(rejected)
    assert after["completed"] - before["completed"] == len(ok)
    return last_rejection, peak_mib, peak_growth_mib


def test_tiny_queue_limit_answers_overloaded_at_once(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = tmp_path / "repo"
    model_folder(repo / "burst", BURST_PARAM,
                 f'random_weights = true\ndevices = "cpu"\nwarmup = 0\nqueue_limit = {QUEUE_LIMIT}\n')
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/bp.sock"
[models]
repository = "{repo}"
[scheduler]
use_vulkan = false
cpu_instances = {CPU_SLOTS}
""", env={"VKSERVE_TEST_DEVICE_DELAY": f"cpu={BURST_DELAY_S}"})
    assert {m["name"]: m for m in _models(d)}["burst"]["queue_limit"] == QUEUE_LIMIT
    held_mib = BURST_CONNECTIONS * BURST_PER_CONNECTION * np.prod(BURST_SHAPE) * 4 / 2**20
    with Client.connect(f"unix:{d.socket}") as c:  # warmup = 0: the first job loads the CPU kernels
        c.infer("burst", {"data": np.full(BURST_SHAPE, 1.0, np.float32)})
    first = run_burst(d)
    # the daemon keeps serving, and the same burst again is answered the same way: the
    # rejected requests were dropped, so its peak memory does not rise burst after burst
    # (the first burst grows the allocator's heap by a part of a burst; a daemon that
    # kept the requests would grow by ``held_mib`` each time)
    second = run_burst(d)
    assert first[2] < held_mib, (first, held_mib)
    assert second[1] - first[1] < held_mib / 4, (first, second, held_mib)
    with Client.connect(f"unix:{d.socket}") as c:
        out = c.infer("burst", {"data": np.full(BURST_SHAPE, 2.0, np.float32)})["out"]
        np.testing.assert_array_equal(out, 2.0)
    print(f"backpressure: {BURST_CONNECTIONS * BURST_PER_CONNECTION - CPU_SLOTS - QUEUE_LIMIT}"
          f" OVERLOADED within {first[0] * 1e3:.0f} / {second[0] * 1e3:.0f} ms; daemon peak "
          f"RSS +{first[2]:.1f} MiB, then {second[1] - first[1]:+.1f} MiB (a burst: {held_mib:.0f} MiB)")
    assert d.stop() == 0, d.log_text()[-3000:]
    assert "Traceback" not in d.log_text()


# ------------------------------------------------------------------------------ failover


FAILOVER_CLIENTS = 16
FAILOVER_PER_CLIENT = 50
#: Runs on the Vulkan device take this long and then the first FAULTS of them fail as a lost
#: device (VK_ERROR_DEVICE_LOST, raised by the daemon's test hook in the device worker):
#: the fault comes while every client has requests queued behind the failing runs.
FAILOVER_DELAY_S = 0.2
FAULTS = SchedulerConfig().instances_per_device  # = the Vulkan device's slots: every job running there when it fails


def vkserve_json(d: Daemon, command: str) -> Any:
    out = subprocess.run(vkserve_cmd(command, "--json", "--socket", str(d.socket)), cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def test_device_fault_under_load_fails_over_to_the_cpu(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = tmp_path / "repo"
    # digits on the Vulkan device only (devices = auto), the CPU allowed as a fallback; no
    # warm-up, so the injected faults hit the first jobs rather than the load
    model_folder(repo / "digits", (DIGITS / "model.param").read_text(),
                 'devices = "auto"\ncpu_fallback = true\nwarmup = 0\n[inputs]\ndata = [1, 8, 8]\n',
                 bin_from=DIGITS / "model.bin")
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/fo.sock"
[models]
repository = "{repo}"
""", env={"VKSERVE_TEST_DEVICE_FAULT": f"0={FAULTS}",
          "VKSERVE_TEST_DEVICE_DELAY": f"0={FAILOVER_DELAY_S}"})
    s = status(d)
    gpu, cpu = vulkan_device(s), cpu_device(s)
    assert gpu["index"] == 0 and gpu["healthy"] and gpu["models"] == ["digits"], s["devices"]
    assert gpu["slots"] == FAULTS and cpu["models"] == [], s["devices"]

    plans = make_jobs(FAILOVER_CLIENTS, FAILOVER_PER_CLIENT, models=("digits",),
                      high_share=0.25, seed=1)
    result = await drive(d, plans)
    check_exactly_once_and_correct(plans, result)

    # the device shows unhealthy, in the CLI's JSON status as in the status op
    cli = vkserve_json(d, "status")
    bad = next(dev for dev in cli["devices"] if dev["index"] == gpu["index"])
    assert bad["healthy"] is False and "VK_ERROR_DEVICE_LOST" in bad["fault"], bad
    assert bad["faults"] >= 1, bad
    good = cpu_device(cli)
    assert good["healthy"] is True and good["models"] == ["digits"], good
    totals = cli["totals"]
    total = FAILOVER_CLIENTS * FAILOVER_PER_CLIENT
    assert totals["device_faults"] == 1, totals
    assert 1 <= totals["retried"] <= FAULTS, totals
    assert totals["completed"] == totals["submitted"] == total, totals
    assert totals["failed"] == totals["cancelled"] == totals["deadline_exceeded"] == 0
    assert status(d)["devices"][gpu["index"]]["healthy"] is False
    digits = next(m for m in vkserve_json(d, "models") if m["name"] == "digits")
    assert digits["state"] == "ready" and digits["devices"] == [cpu["index"]], digits

    # the jobs ran on the CPU (at most the runs that had started there before the fault
    # completed on the Vulkan device), and new work keeps going there
    on = Counter(r.device for r in result.replies.values())
    assert on[cpu["device"]] >= total - FAULTS and on[gpu["device"]] <= FAULTS - totals["retried"], on
    # the fault came under load: the clients' requests were queued behind the failing runs
    waited = sum(1 for r in result.replies.values() if r.queue_seconds > FAILOVER_DELAY_S / 2)
    assert waited >= FAILOVER_CLIENTS, waited
    print(f"failover: {total} requests in {result.seconds:.1f} s, {totals['retried']} retried, "
          f"{waited} queued across the fault; devices {dict(on)}")
    more = make_jobs(4, 10, models=("digits",), high_share=0.5, seed=2)
    after = await drive(d, more, window=2)
    check_exactly_once_and_correct(more, after)
    assert {r.device for r in after.replies.values()} == {cpu["device"]}
    assert "is unhealthy" in d.log_text() and "loading on" in d.log_text()
    assert d.stop() == 0, d.log_text()[-3000:]
