"""Daemon config: the embedded default, strict validation (unknown keys, wrong types), tokens."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from tests.support.daemon import ROOT, vkserve_cmd
from vkserve.daemon.config import (
    DEFAULT_CONFIG,
    EXAMPLES_DIR,
    Config,
    ConfigError,
    ServerConfig,
    load_config,
    parse_config,
    resolve_token,
    scheduler_config,
)
from vkserve.daemon.server import _example_command
from vkserve.scheduler.config import SchedulerConfig
from vkserve.scheduler.reports import ModelInfo, ModelState


def test_embedded_default_is_the_dataclass_defaults() -> None:
    cfg = load_config(None)
    # the [scheduler] table spells out SchedulerConfig's defaults (checked just below)
    assert dataclasses.replace(cfg, source="x", scheduler={}) == dataclasses.replace(Config(), source="x")
    assert cfg.models.repository_path() == EXAMPLES_DIR and (EXAMPLES_DIR / "digits" / "model.param").is_file()
    assert cfg.server.tcp_address() is None and resolve_token(cfg.server) is None
    assert scheduler_config(cfg.scheduler, SchedulerConfig) == SchedulerConfig()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nsokcet = 'x'\n", "server.sokcet: unknown key"),
        ("[serve]\n", "serve: unknown key"),
        ("server = 3\n", "server: expected a table"),
        ("[server]\nmax_frame_size = '64M'\n", "server.max_frame_size: expected int, got str"),
        ("[server]\nidle_timeout = true\n", "server.idle_timeout: expected float, got bool"),
        ("[server]\nsocket = 5\n", "server.socket: expected str, got int"),
        ("[server]\nmax_connections = 0\n", "server.max_connections: must be > 0"),
        ("[server]\nmax_frame_size = 5000000000\n", "server.max_frame_size: at most"),
        ("[server]\ntcp = 'nohost'\n", "server.tcp: cannot parse"),
        ("[models]\nrepository = ['a']\n", "models.repository: expected str, got array"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^cfg.toml: .*" + message.replace("[", r"\[")):
        parse_config(text, "cfg.toml")


def test_values_and_relative_paths(tmp_path: Path) -> None:
    f = tmp_path / "vk.toml"
    f.write_text("[server]\nsocket = 'run/vk.sock'\nidle_timeout = 5\nsocket_mode = 0o600\n"
                 "tcp = '[::1]:0'\n[models]\nrepository = 'models'\n")
    cfg = load_config(f)
    assert cfg.server.socket_path() == tmp_path / "run" / "vk.sock"
    assert cfg.server.idle_timeout == 5.0 and isinstance(cfg.server.idle_timeout, float)
    assert cfg.server.socket_mode == 0o600
    assert cfg.models.repository_path() == tmp_path / "models"
    addr = cfg.server.tcp_address()
    assert addr is not None and (addr.host, addr.port) == ("::1", 0)


def test_scheduler_table_is_checked_against_scheduler_config() -> None:
    cfg = parse_config("[scheduler]\nqueue_limit_per_model = 8\ncpu_instances = 1\n")
    sc = scheduler_config(cfg.scheduler, SchedulerConfig)
    assert sc.queue_limit_per_model == 8 and sc.cpu_instances == 1
    with pytest.raises(ConfigError, match="scheduler.queue_limt: unknown key"):
        scheduler_config({"queue_limt": 3}, SchedulerConfig)
    with pytest.raises(ConfigError, match="scheduler.use_vulkan: expected bool"):
        scheduler_config({"use_vulkan": "no"}, SchedulerConfig)
    with pytest.raises(ConfigError, match="scheduler: .*instances_per_device must be >= 1"):
        scheduler_config({"instances_per_device": 0}, SchedulerConfig)


def test_tcp_token_rules(tmp_path: Path) -> None:
    tcp = ServerConfig(tcp="127.0.0.1:7000")
    with pytest.raises(ConfigError, match="no token"):
        resolve_token(tcp, env={})
    with pytest.raises(ConfigError, match="at least 16"):
        resolve_token(dataclasses.replace(tcp, token="short"), env={})
    assert resolve_token(tcp, env={"VKSERVE_TOKEN": "e" * 16}) == "e" * 16
    tf = tmp_path / "token"
    tf.write_text("f" * 20 + "\n")
    assert resolve_token(dataclasses.replace(tcp, token_file=str(tf)), env={}) == "f" * 20
    assert resolve_token(dataclasses.replace(tcp, token="t" * 16), env={"VKSERVE_TOKEN": "e" * 16}) == "t" * 16


def test_serve_reports_config_errors_and_prints_the_default(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nmax_frame_size = -1\n")
    p = subprocess.run(vkserve_cmd("serve", "--config", str(bad)), cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "server.max_frame_size: must be > 0" in p.stderr
    p = subprocess.run(vkserve_cmd("serve", "--tcp", "127.0.0.1:0", "--socket", str(tmp_path / "s")),
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and "no token" in p.stderr
    p = subprocess.run(vkserve_cmd("serve", "--print-default-config"), cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == DEFAULT_CONFIG


def test_device_test_hooks_parse() -> None:
    from vkserve.daemon.server import parse_test_hooks

    assert parse_test_hooks({}) == []
    hooks = parse_test_hooks({"VKSERVE_TEST_DEVICE_DELAY": "cpu=0.3, 0=0.05",
                              "VKSERVE_TEST_DEVICE_FAULT": "1=2, 0=3@500"})
    assert hooks == [("delay", "cpu", 0.3, 0), ("delay", "0", 0.05, 0), ("fault", "1", 2.0, 0),
                     ("fault", "0", 3.0, 500)]
    for bad in ("gpu=1", "cpu", "0=-1", "0=x", "0=1@5"):
        with pytest.raises(ConfigError, match="VKSERVE_TEST_DEVICE_DELAY"):
            parse_test_hooks({"VKSERVE_TEST_DEVICE_DELAY": bad})
    for bad in ("0=1@x", "0=1@-2"):
        with pytest.raises(ConfigError, match="NUMBER@RUNS"):
            parse_test_hooks({"VKSERVE_TEST_DEVICE_FAULT": bad})


def test_injected_fault_after_runs() -> None:
    """``inject_fault(n, after)``: `after` runs pass, the next `n` fail as a lost device, the
    rest pass."""
    from vkserve.devices.vulkan.errors import VulkanError
    from vkserve.scheduler.devices import DeviceHandle

    h = DeviceHandle.cpu()
    h.inject_fault(2, after=3)
    outcomes = []
    for _ in range(7):
        try:
            h.apply_hooks(lambda: None)
            outcomes.append("ok")
        except VulkanError as e:
            outcomes.append(e.result)
    assert outcomes == ["ok"] * 3 + ["VK_ERROR_DEVICE_LOST"] * 2 + ["ok"] * 2


@pytest.mark.parametrize("where", ["repo", "root", "elsewhere"])
def test_example_command_path_is_usable_from_where_the_daemon_started(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative to the folder the daemon was started in when the sample is under it; absolute
    otherwise and under systemd (cwd /), where a relative `var/lib/...` would mislead."""
    repo = tmp_path / "repo"
    (repo / "digits" / "samples").mkdir(parents=True)
    sample = repo / "digits" / "samples" / "3.npy"
    sample.write_bytes(b"")
    (tmp_path / "other").mkdir()
    monkeypatch.chdir({"repo": repo, "root": Path("/"), "elsewhere": tmp_path / "other"}[where])
    info = ModelInfo(name="digits", state=ModelState.READY, inputs={"data": [1, 8, 8]}, outputs={},
                     devices=[0], placements=[], queue_depth=0, in_flight=0, queue_limit=1,
                     precision="fp32", error=None)
    line = _example_command([info], repo, Path("/run/x.sock"), Path("/run/x.sock"))
    shown = "digits/samples/3.npy" if where == "repo" else str(sample)
    assert line == f"vkserve infer digits --input data={shown}"


def test_example_command_suggests_a_ready_model() -> None:
    """A model that failed to load is never suggested; with none ready, `vkserve models` says why."""
    def info(name: str, state: ModelState) -> ModelInfo:
        return ModelInfo(name=name, state=state, inputs={"x": [4]}, outputs={}, devices=[],
                         placements=[], queue_depth=0, in_flight=0, queue_limit=1,
                         precision="fp32", error="broken" if state is ModelState.FAILED else None)

    sock = Path("/run/x.sock")
    models = [info("bad", ModelState.FAILED), info("slow", ModelState.LOADING),
              info("good", ModelState.READY)]
    assert _example_command(models, None, sock, sock) == "vkserve infer good --random-input"
    assert _example_command(models[:2], None, sock, sock) == "vkserve infer slow --random-input"
    assert _example_command(models[:1], None, sock, sock) == "vkserve models"
