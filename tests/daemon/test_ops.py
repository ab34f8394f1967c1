"""Operations end to end (issue 7): real `vkserve serve` subprocesses (lavapipe + CPU) through the
daemon harness of test_daemon.py: Prometheus metrics after traffic, /healthz and /readyz,
SIGTERM during load (answers, pipeline cache saved), SIGHUP with models added and removed under
load, sd_notify on a real datagram socket, socket activation, config errors, `vkserve bench`.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import (
    DIGITS,
    ROOT,
    SLOW_SHAPE,
    TOKEN,
    Daemon,
    Launch,
    Raw,
    digits_request,
    http_get,
    make_repository,
    slow_request,
    vkserve_cmd,
    wait_for,
    wait_status,
    write_slow_model,
)
from vkserve.cache.cache_file import inspect_cache_file
from vkserve.cli.main import main as cli_main
from vkserve.client import Client
from vkserve.client.errors import ServerError as VkserveError
from vkserve.daemon.config import DEFAULT_CONFIG, Config, ConfigError, ServerConfig, parse_config
from vkserve.scheduler.config import SchedulerConfig


def scrape(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    assert d.metrics_port is not None
    status, text = http_get(d.metrics_port, "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


# ------------------------------------------------------------------------------ metrics


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> tuple[Daemon, Path]:
    """digits on the Vulkan device (lavapipe), `tiny` on the CPU; a fresh pipeline cache."""
    work = tmp_path_factory.mktemp("ops")
    repo = make_repository(work / "repo", slow=False)
    write_slow_model(repo, "tiny")
    d = launch_module_daemon(work, f"""
[server]
socket = "{work}/ops.sock"
[models]
repository = "{repo}"
[scheduler]
cache_dir = "{work}/cache"
""")
    return d, work


def test_metrics_after_traffic(ops: tuple[Daemon, Path]) -> None:
    d, _ = ops
    status, body = http_get(d.metrics_port, "/healthz")  # type: ignore[arg-type]
    assert (status, body) == (200, "ok\n")
    status, body = http_get(d.metrics_port, "/readyz")  # type: ignore[arg-type]
    assert status == 200 and "digits" in body and "tiny" in body
    n = 7
    with Client.connect(f"unix:{d.socket}") as c:
        x = np.load(DIGITS / "samples" / "3.npy")
        for _ in range(n):
            assert int(c.infer("digits", {"data": x})["prob"].argmax()) == 3
        with pytest.raises(VkserveError):  # wrong shape: an answer, outcome bad_request
            c.infer("digits", {"data": np.zeros((2, 8, 8), np.float32)})
        with pytest.raises(VkserveError):  # unknown model: outcome not_found
            c.infer("nope", {"data": x})
    with Raw(d.socket) as r:  # not a msgpack map: refused before the scheduler
        r.send(b"\x00\x00\x00\x01\xc1")
        assert r.recv().error.code == "BAD_REQUEST"
    s = scrape(d)
    vk = "vulkan:0"
    assert sample(s, "vkserve_requests_total", model="digits", device=vk, outcome="ok") == n
    assert sample(s, "vkserve_requests_total", model="digits", device="none",
                  outcome="bad_request") == 1
    # a model name the daemon does not have is one bounded series, whatever the name
    assert sample(s, "vkserve_requests_total", model="_unknown", device="none",
                  outcome="not_found") == 1
    assert not any(dict(labels).get("model") == "nope" for _, labels in s)
    assert not any(name.endswith("_created") for name, _ in s)
    assert sample(s, "vkserve_model_ready", model="digits") == 1
    assert sample(s, "vkserve_queue_duration_seconds_count", model="digits") == n
    assert sample(s, "vkserve_execution_duration_seconds_count", model="digits") == n
    assert sample(s, "vkserve_request_duration_seconds_count", model="digits") == n + 1
    assert sample(s, "vkserve_request_duration_seconds_bucket", model="digits", le="+Inf") == n + 1
    # millisecond buckets: the smallest is a quarter millisecond
    assert ("vkserve_request_duration_seconds_bucket", (("le", "0.00025"), ("model", "digits"))) in s
    assert sample(s, "vkserve_rejected_requests_total", reason="bad_request") >= 1
    assert sample(s, "vkserve_queued_requests", model="digits") == 0
    assert sample(s, "vkserve_in_flight_requests", device=vk) == 0
    assert sample(s, "vkserve_device_healthy", device=vk) == 1
    assert sample(s, "vkserve_device_healthy", device="cpu") == 1
    assert sample(s, "vkserve_device_memory_in_use_bytes", device=vk) > 0
    assert sample(s, "vkserve_device_memory_budget_bytes", device=vk) > 0
    assert ("vkserve_device_memory_pooled_bytes", (("device", vk),)) in s
    assert sample(s, "vkserve_pipeline_cache_misses_total", device=vk, tier="pipeline") > 0
    assert sample(s, "vkserve_pipeline_cache_misses_total", device=vk, tier="spirv") > 0
    assert sample(s, "vkserve_pipeline_compile_seconds_total", device=vk) > 0
    # a fresh cache dir: digits compiled GLSL (cold); the CPU compiles nothing (warm)
    assert sample(s, "vkserve_model_load_duration_seconds_count", model="digits", device=vk,
                  cache="cold") == 1
    assert sample(s, "vkserve_model_load_duration_seconds_count", model="tiny", device="cpu",
                  cache="warm") == 1
    assert scrape(d)[("vkserve_requests_total", (("device", vk), ("model", "digits"),
                                                 ("outcome", "ok")))] == n  # scrapes are reads


def test_bench_against_a_live_daemon(ops: tuple[Daemon, Path]) -> None:
    d, work = ops
    out = work / "bench"
    p = subprocess.run(
        vkserve_cmd("bench", "tiny", "--socket", str(d.socket), "--concurrency", "1,2",
                    "--window", "0.25", "--max-windows", "2", "--stable-windows", "2",
                    "--csv", f"{out}.csv", "--plot", f"{out}.png"),
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    table = p.stdout.strip().splitlines()
    assert table[0].split()[:2] == ["load", "req/s"] and len(table) == 3
    assert "concurrency 1" in table[1] and "concurrency 2" in table[2]
    rows = list(csv.DictReader(Path(f"{out}.csv").read_text().splitlines()))
    assert [float(r["level"]) for r in rows] == [1.0, 2.0] and float(rows[0]["p99_ms"]) > 0
    assert all(int(r["requests"]) > 0 and float(r["throughput"]) > 0 and float(r["server_run_ms"]) > 0
               for r in rows)
    assert Path(f"{out}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # client batches of 3, tensors inline: 3 inferences per request, run as one batch; --json
    # prints the results on stdout, nothing else
    p = subprocess.run(
        vkserve_cmd("bench", "tiny", "--socket", str(d.socket), "--concurrency", "2", "--batch", "3",
                    "--inline", "--window", "0.25", "--max-windows", "2", "--stable-windows", "2",
                    "--json"),
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    results = json.loads(p.stdout)
    assert results["model"] == "tiny" and "window" not in p.stderr
    (level,) = results["results"]
    assert level["items_per_s"] == pytest.approx(3 * level["throughput"], rel=1e-3)
    assert level["server_batch"] >= 3 and not level["errors"]


# ------------------------------------------------------------------------------ readiness


def test_readyz_flips_with_loading_and_the_only_device(tmp_path: Path, launch_daemon: Launch) -> None:
    """`slowpoke` loads slowly on the Vulkan device (a test delay on its warm-up runs);
    `solo` may run only on the CPU (no fallback), where the test hook makes its first run fail
    as a lost device."""
    repo = tmp_path / "repo"
    slowpoke = repo / "slowpoke"
    slowpoke.mkdir(parents=True)
    for f in ("model.param", "model.bin"):
        (slowpoke / f).symlink_to(DIGITS / f)
    (slowpoke / "config.toml").write_text("devices = [0]\nwarmup = 1\n")
    write_slow_model(repo, "solo", 'random_weights = true\ndevices = ["cpu"]\ncpu_fallback = false\n'
                             "warmup = 0\n")
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/r.sock"
[models]
repository = "{repo}"
[scheduler]
cache_dir = ""
""", wait=False, env={"VKSERVE_TEST_DEVICE_DELAY": "0=1.0", "VKSERVE_TEST_DEVICE_FAULT": "cpu=1"})
    line = d.wait_line("metrics on http://")
    port = int(line.split()[3].rsplit(":", 1)[1].split("/")[0])
    d.metrics_port = port
    status, body = http_get(port, "/readyz")
    assert status == 503 and "not ready" in body, body
    wait_for(lambda: "slowpoke (loading)" in http_get(port, "/readyz")[1], 10, "loading")
    assert http_get(port, "/healthz")[0] == 200  # live while not ready
    wait_for(lambda: http_get(port, "/readyz")[0] == 200, 30, "ready")
    assert http_get(port, "/readyz")[1] == "ready: slowpoke, solo\n"
    with Client.connect(f"unix:{tmp_path}/r.sock") as c:
        with pytest.raises(VkserveError) as err:  # the injected device loss
            c.infer("solo", {"data": np.zeros(SLOW_SHAPE, np.float32)})
        assert err.value.code == "DEVICE_ERROR"
    status, body = http_get(port, "/readyz")
    assert status == 503 and "solo (failed" in body and "slowpoke" not in body, body
    s = scrape(d)
    assert sample(s, "vkserve_device_healthy", device="cpu") == 0
    assert sample(s, "vkserve_device_healthy", device="vulkan:0") == 1
    assert "vkserve_device_memory_budget_bytes" not in {k[0] for k in s
                                                        if ("device", "cpu") in k[1]}
    assert d.stop() == 0


def test_gpu_nodes_without_a_vulkan_gpu_are_reported_everywhere(tmp_path: Path, launch_daemon: Launch) -> None:
    """A GPU device node exists (a fake ``renderD128``, through $VKSERVE_TEST_GPU_NODES) but
    Vulkan finds no driver (an empty ICD folder): an ERROR line at start naming the node and
    the reason, ``gpu_problem`` in the status (and in `vkserve status`), a warning on /readyz
    (still 200: the CPU serves) and ``vkserve_gpu_unusable``."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "renderD128").touch()
    (dev / "card0").touch()  # not a render node
    node = str(dev / "renderD128")
    icd = tmp_path / "no-icd"
    icd.mkdir()
    repo = tmp_path / "repo"
    write_slow_model(repo, "tiny")
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/g.sock"
[models]
repository = "{repo}"
[scheduler]
cache_dir = ""
""", env={"VK_ICD_FILENAMES": str(icd), "VK_DRIVER_FILES": str(icd),
          "VKSERVE_TEST_GPU_NODES": f"{dev}/renderD*"})
    errors = [ln for ln in d.log_text().splitlines() if " ERROR " in ln]
    assert len(errors) == 1, d.log_text()
    assert f"GPU device node(s) {node} exist (no_driver)" in errors[0], errors[0]
    assert "VK_ERROR_INCOMPATIBLE_DRIVER" in errors[0] and "CPU only" in errors[0]
    with Client.connect(f"unix:{tmp_path}/g.sock") as c:
        s = c.status()
        assert "out" in c.infer("tiny", {"data": np.zeros(SLOW_SHAPE, np.float32)})  # on the CPU
    assert s["gpu_problem"]["nodes"] == [node] and s["gpu_problem"]["reason"] == "no_driver"
    assert "VK_ERROR_INCOMPATIBLE_DRIVER" in s["gpu_problem"]["detail"]
    assert [dev_["kind"] for dev_ in s["devices"]] == ["cpu"]
    text = subprocess.run(vkserve_cmd("status", "--socket", f"{tmp_path}/g.sock"), cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"UNUSABLE: device node(s) {node}, but no Vulkan GPU (no_driver)" in text, text
    status, body = http_get(d.metrics_port, "/readyz")  # type: ignore[arg-type]
    assert status == 200, body
    ready, warning = body.splitlines()
    assert ready == "ready: tiny" and warning.startswith("warning: no Vulkan GPU although "
                                                         f"GPU device node(s) {node} exist")
    assert sample(scrape(d), "vkserve_gpu_unusable", node=node, reason="no_driver") == 1
    assert d.stop() == 0


# ------------------------------------------------------------------------------ lifecycle


def test_sigterm_during_load_answers_everything_and_saves_the_cache(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = make_repository(tmp_path / "repo")  # digits (Vulkan) and slow (CPU, +0.3 s a run)
    cache = tmp_path / "cache"
    config = f"""
[server]
socket = "{tmp_path}/t.sock"
drain_timeout = 0.5
[models]
repository = "{repo}"
[scheduler]
cache_dir = "{cache}"
"""
    d = launch_daemon(tmp_path, config, env={"VKSERVE_TEST_DEVICE_DELAY": "cpu=0.3"})
    r = Raw(d.socket)
    for i in range(1, 9):  # ~1.2 s of work on the two CPU slots: more than the drain
        r.send(slow_request(i))
    for i in range(9, 13):
        r.send(digits_request(i))
    wait_status(d, lambda s: s["server"]["infer_in_flight"] >= 8 and s["in_flight"] >= 1)
    d.proc.send_signal(signal.SIGTERM)
    answers = r.read_to_eof(timeout=15)
    r.sock.close()
    assert d.proc.wait(20) == 0
    assert sorted(a.id for a in answers if a.id) == list(range(1, 13))  # every one answered (and the goodbye, id 0)
    codes = {a.error.code for a in answers if not a.ok}
    assert codes <= {"UNAVAILABLE"} and codes, [(a.id, a.error) for a in answers]
    assert any(a.ok for a in answers)
    files = list(cache.glob("vkserve-*.cache"))
    assert len(files) == 1, list(cache.iterdir())
    info = inspect_cache_file(files[0].read_bytes())
    assert info["valid"], info["reason"]
    assert len(info["entries"]) > 0
    # the next start finds every SPIR-V module there: a warm load
    d = launch_daemon(tmp_path, config, name="again")
    s = scrape(d)
    assert sample(s, "vkserve_model_load_duration_seconds_count", model="digits", device="vulkan:0",
                  cache="warm") == 1
    assert sample(s, "vkserve_pipeline_cache_misses_total", device="vulkan:0",
                  tier="spirv") == 0
    assert d.stop(signal.SIGINT) == 0


def test_sighup_adds_and_removes_models_under_load(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = tmp_path / "repo"
    write_slow_model(repo, "keep")
    write_slow_model(repo, "gone")
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/h.sock"
[models]
repository = "{repo}"
[scheduler]
use_vulkan = false
""")
    failures: list[str] = []
    done = threading.Event()
    counts = [0, 0]

    def client(k: int) -> None:
        x = np.ones(SLOW_SHAPE, np.float32)
        with Client.connect(f"unix:{d.socket}") as c:
            while not done.is_set():
                try:
                    c.infer("keep", {"data": x})
                    counts[k] += 1
                except VkserveError as exc:
                    failures.append(f"{exc.code}: {exc}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: min(counts) > 5, 10, "traffic")
        write_slow_model(repo, "added")
        (repo / "gone" / "model.param").unlink()
        (repo / "gone" / "config.toml").unlink()
        (repo / "gone").rmdir()
        d.proc.send_signal(signal.SIGHUP)

        def models() -> dict[str, str]:
            with Client.connect(f"unix:{d.socket}") as c:
                return {m["name"]: m["state"] for m in c.models()}

        wait_for(lambda: models() == {"added": "ready", "keep": "ready"}, 20, "rescan")
        before = list(counts)
        wait_for(lambda: all(a > b + 5 for a, b in zip(counts, before)), 10, "more traffic")
        done.set()
        for t in threads:
            t.join(10)
        assert failures == []
        with Client.connect(f"unix:{d.socket}") as c:
            assert c.infer("added", {"data": np.ones(SLOW_SHAPE, np.float32)})
            with pytest.raises(VkserveError) as err:
                c.infer("gone", {"data": np.ones(SLOW_SHAPE, np.float32)})
            assert err.value.code == "NOT_FOUND"
        assert "removed ['gone']" in d.log_text()
        assert d.stop() == 0
    finally:
        done.set()


# ------------------------------------------------------------------------------ systemd


def test_sd_notify_ready_status_watchdog_stopping(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = tmp_path / "repo"
    write_slow_model(repo, "tiny")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(0.5)
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/n.sock"
[models]
repository = "{repo}"
[scheduler]
use_vulkan = false
""", env={"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "400000"})
    messages: list[str] = []
    try:
        end = time.monotonic() + 10
        def pings_after_ready() -> int:  # (the watchdog pings start while the backend builds)
            return sum(m == "WATCHDOG=1" for m in messages[messages.index("READY=1"):]) if "READY=1" in messages else 0

        while pings_after_ready() < 3 and time.monotonic() < end:
            try:
                messages += notify.recv(4096).decode().splitlines()
            except TimeoutError:
                continue
        assert d.stop() == 0
        while True:
            try:
                messages += notify.recv(4096).decode().splitlines()
            except TimeoutError:
                break
    finally:
        notify.close()
    ready = messages.index("READY=1")
    status = next(i for i, m in enumerate(messages) if i > ready and m.startswith("STATUS="))
    watchdog = next(i for i, m in enumerate(messages) if i > status and m == "WATCHDOG=1")
    stopping = messages.index("STOPPING=1")
    assert ready < status < watchdog < stopping, messages
    assert "tiny (ready)" in messages[status] and "devices: cpu" in messages[status], messages[status]
    assert "STATUS=loading models" in messages[:ready]
    # until READY the pings push systemd's start timeout ahead (a first start compiles kernels)
    extends = [i for i, m in enumerate(messages) if m.startswith("EXTEND_TIMEOUT_USEC=")]
    assert extends and max(extends) < ready, messages
    assert messages[extends[0]] == "EXTEND_TIMEOUT_USEC=30000000"


async def test_the_start_timeout_is_extended_while_the_backend_builds(tmp_path: Path, monkeypatch) -> None:
    """A first start compiles every CPU kernel before the backend exists (90-110 s on a 2-core
    box, past systemd's default 90 s start timeout): the pings run meanwhile, and a failed build
    still comes out as its own error."""
    import trio  # noqa: PLC0415

    from vkserve.daemon.server import serve  # noqa: PLC0415

    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    seen: list[str] = []

    async def slow_build():
        with trio.fail_after(10):
            while len(seen) < 2:  # until two rounds of pings arrived while "compiling"
                try:
                    seen.append(notify.recv(4096).decode())
                except BlockingIOError:
                    await trio.sleep(0.05)
        raise ConfigError("models.repository: the build stops here")

    config = parse_config(f"""
[server]
socket = "{tmp_path}/s.sock"
[models]
repository = "{tmp_path}"
[scheduler]
use_vulkan = false
""")
    monkeypatch.setattr("vkserve.daemon.server.STATUS_INTERVAL", 0.1)
    try:
        with pytest.raises(ConfigError, match="the build stops here"):
            await serve(config, backend_factory=slow_build, announce=lambda line: None)
    finally:
        notify.close()
    assert seen == ["EXTEND_TIMEOUT_USEC=30000000"] * 2


def test_socket_activation_uses_the_inherited_sockets(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = tmp_path / "repo"
    write_slow_model(repo, "tiny")
    path = tmp_path / "activated.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(path))
    unix.listen(16)
    tcp = socket.create_server(("127.0.0.1", 0))
    tcp_port = tcp.getsockname()[1]
    # what systemd does: the sockets as fds 3 and 4, LISTEN_PID = the service's own pid
    script = ("import os, sys\n"
              "for target, fd in enumerate(map(int, sys.argv[1].split(',')), start=3):\n"
              "    os.dup2(fd, target)\n"
              "os.environ.update(LISTEN_FDS='2', LISTEN_PID=str(os.getpid()))\n"
              "os.execv(sys.argv[2], sys.argv[2:])\n")
    wrapper = [sys.executable, "-c", script, f"{unix.fileno()},{tcp.fileno()}"]
    own = tmp_path / "own.sock"
    d = launch_daemon(tmp_path, f"""
[server]
socket = "{own}"
token = "{TOKEN}"
[models]
repository = "{repo}"
[scheduler]
use_vulkan = false
""", wrapper=wrapper, pass_fds=(unix.fileno(), tcp.fileno()))
    unix.close()
    tcp.close()
    assert not own.exists()  # the configured socket is not bound
    assert f"vkserve: listening on unix {path}" in d.lines
    assert f"vkserve: listening on tcp 127.0.0.1:{tcp_port} (token required)" in d.lines
    x = np.ones(SLOW_SHAPE, np.float32)
    with Client.connect(f"unix:{path}") as c:
        assert c.infer("tiny", {"data": x})["out"].shape == (64,)
    with Client.connect(f"tcp://127.0.0.1:{tcp_port}", token=TOKEN) as c:
        assert c.ping()
    assert d.stop() == 0
    assert path.exists()  # the socket file belongs to systemd, not to the daemon


# ------------------------------------------------------------------------------ config


def test_default_config_is_the_deploy_file_and_documents_every_key() -> None:
    deploy = ROOT / "deploy" / "vkserve.toml"
    assert deploy.read_text() == DEFAULT_CONFIG
    p = subprocess.run(vkserve_cmd("serve", "--print-default-config"), cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == deploy.read_text()
    cfg = parse_config(DEFAULT_CONFIG, "deploy/vkserve.toml")
    assert cfg.metrics.listen == "127.0.0.1:9464"
    data = tomllib.loads(DEFAULT_CONFIG)
    defaults = SchedulerConfig()
    for key, value in data["scheduler"].items():
        assert getattr(defaults, key) == value, key
    text = DEFAULT_CONFIG
    for key in [*ServerConfig.__dataclass_fields__, *SchedulerConfig.__dataclass_fields__,
                "repository", "listen"]:
        assert f"\n{key} = " in text or f"\n# {key} = " in text, f"{key} is not documented"


@pytest.mark.parametrize(("text", "args", "message"), [
    ("[metrics]\nlisten = 9464\n", [], "metrics.listen: expected str, got int"),
    ("[metrics]\nlisten = 'nohost'\n", [], "metrics.listen: metrics listen address"),
    ("[metrics]\nport = 1\n", [], "metrics.port: unknown key"),
    ("[metric]\n", [], "metric: unknown key"),
    ("[scheduler]\nqueue_limit = 3\n", [], "scheduler.queue_limit: unknown key"),
    ("[scheduler]\nuse_vulkan = 'no'\n", [], "scheduler.use_vulkan: expected bool"),
    ("[server]\ndrain_timeout = '5s'\n", [], "server.drain_timeout: expected float"),
    ("", ["--metrics-listen", "9464"], "expected HOST:PORT or 'off'"),
])
def test_config_errors_name_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    text: str, args: list[str], message: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f"[models]\nrepository = '{tmp_path}'\n{text}")
    sock = tmp_path / "x.sock"
    assert cli_main(["serve", "--config", str(cfg), "--socket", str(sock), *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not sock.exists()


def test_flags_override_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vkserve.daemon.server

    cfg = tmp_path / "vk.toml"
    cfg.write_text("[metrics]\nlisten = '127.0.0.1:1'\n[server]\nsocket = '/nonexistent/s'\n"
                   "tcp = '127.0.0.1:1'\n[models]\nrepository = 'models'\n")
    seen: list[Config] = []
    monkeypatch.setattr(vkserve.daemon.server, "run_daemon", lambda config: seen.append(config) or 0)
    assert cli_main(["serve", "--config", str(cfg), "--metrics-listen", "off", "--socket",
                     str(tmp_path / "s"), "--tcp", "[::1]:0", "--models", "/srv/m"]) == 0
    (config,) = seen
    assert config.metrics.listen_address() is None
    assert config.server.socket_path() == tmp_path / "s"
    assert config.server.tcp == "[::1]:0" and config.models.repository == "/srv/m"
    seen.clear()
    assert cli_main(["serve", "--config", str(cfg)]) == 0
    assert seen[0].metrics.listen_address() == ("127.0.0.1", 1)
    assert seen[0].models.repository_path() == tmp_path / "models"


def test_metrics_port_in_use_is_a_start_error(tmp_path: Path) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        p = subprocess.run(
            vkserve_cmd("serve", "--socket", str(tmp_path / "s.sock"), "--models", str(tmp_path),
                        "--metrics-listen", f"127.0.0.1:{port}"),
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        taken.close()
    assert p.returncode == 1 and f"metrics.listen 127.0.0.1:{port}: cannot listen" in p.stderr
    assert not (tmp_path / "s.sock").exists()


def test_socket_unit_verifies(tmp_path: Path) -> None:
    import shutil

    exe = shutil.which("systemd-analyze")
    assert exe is not None, "systemd-analyze missing (deploy/dev.sh installs systemd)"
    service = (ROOT / "deploy" / "vkserve.service").read_text()
    (tmp_path / "vkserve.service").write_text(
        service.replace("/opt/vkserve/venv/bin/vkserve", str(Path(sys.executable).parent / "vkserve")))
    shutil.copy(ROOT / "deploy" / "vkserve.socket", tmp_path / "vkserve.socket")
    out = subprocess.run([exe, "verify", str(tmp_path / "vkserve.socket")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
