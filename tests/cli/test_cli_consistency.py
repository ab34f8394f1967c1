"""One command line (issue 16, items 4 and 5): every command's --json is one JSON document on
stdout, failures included; devices are named cpu / vulkan:N everywhere; one --random-input
range; help texts that hold; progress on stderr (plain lines off a terminal, a bar on one)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support.daemon import (
    DIGITS,
    ROOT,
    SLOW_ENV,
    Daemon,
    Launch,
    cpu_engine_prob,
    make_repository,
    vkserve_cmd,
    wait_for,
    write_slow_model,
)
from vkserve.cli.main import COMMANDS, build_parser
from vkserve.client import Client
from vkserve.devices.reference import random_inputs

#: `serve` runs the daemon: its output is the log (`--log-format json`), not a document.
NOT_JSON = {"serve"}


def vk(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "VKSERVE_TOKEN"}
    return subprocess.run(vkserve_cmd(*map(str, args)), cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("consistency")
    repo = make_repository(work / "repo", slow=False)
    return launch_module_daemon(work, f'[server]\nsocket = "{work}/c.sock"\n'
                                      f'[models]\nrepository = "{repo}"\n')


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory, daemon: Daemon) -> dict[str, str]:
    """What the command lines below refer to: a warm pipeline cache (and its file), an empty
    folder, the daemon's socket and one that nothing listens on."""
    work = tmp_path_factory.mktemp("places")
    cache = work / "cache"
    p = vk("cache", "warm", "--device", "vulkan:0", "--cache-dir", cache, "--json")
    assert p.returncode == 0, p.stderr
    (report,) = json.loads(p.stdout)
    (work / "empty").mkdir()
    return {"cache": str(cache), "cache_file": report["file"], "empty": str(work / "empty"),
            "socket": str(daemon.socket), "nothing": str(work / "nothing.sock")}


#: One successful command line per command (and cache action); "{name}" come from `places`.
SUCCEEDS = {
    "devices": ["devices"],
    "layers": ["layers"],
    "cache warm": ["cache", "warm", "--device", "0", "--cache-dir", "{cache}"],
    "cache inspect": ["cache", "inspect", "{cache_file}"],
    "cache clear": ["cache", "clear", "--cache-dir", "{empty}"],
    "run": ["run", DIGITS, "--random-input", "--repeat", "1"],
    "verify": ["verify", DIGITS],
    "profile": ["profile", DIGITS, "--runs", "2", "--cache-dir", "{cache}"],
    "tune": ["tune", DIGITS, "--mode", "rapid", "--runs", "1", "--profile-runs", "1", "--no-save",
             "--cache-dir", "{cache}"],
    "infer": ["infer", "digits", "--random-input", "--socket", "{socket}"],
    "models": ["models", "--socket", "{socket}"],
    "status": ["status", "--socket", "{socket}"],
    "ping": ["ping", "--count", "2", "--socket", "{socket}"],
    "bench": ["bench", "digits", "--concurrency", "1", "--window", "0.2", "--max-windows", "1",
              "--stable-windows", "1", "--socket", "{socket}"],
}

#: One failing command line per command, with its exit status and error code.
FAILS = {
    "devices": (["devices", "--bogus"], 2, "USAGE"),
    "layers": (["layers", "--bogus"], 2, "USAGE"),
    "cache warm": (["cache", "warm", "--device", "vulkan:9", "--cache-dir", "{empty}"], 2, "USAGE"),
    "cache inspect": (["cache", "inspect", "{empty}/none.cache"], 2, "USAGE"),
    "run": (["run", DIGITS, "--device", "7", "--random-input"], 2, "USAGE"),
    "verify": (["verify", "{empty}"], 2, "USAGE"),
    "profile": (["profile", DIGITS, "--device", "7"], 2, "USAGE"),
    "tune": (["tune", DIGITS, "--device", "gpu"], 2, "USAGE"),
    "infer": (["infer", "nosuch", "--random-input", "--socket", "{socket}"], 1, "NOT_FOUND"),
    "models": (["models", "--socket", "{nothing}"], 3, "UNREACHABLE"),
    "status": (["status", "--socket", "{nothing}"], 3, "UNREACHABLE"),
    "ping": (["ping", "--socket", "{nothing}"], 3, "UNREACHABLE"),
    "bench": (["bench", "nosuch", "--socket", "{socket}"], 1, "NOT_FOUND"),
}


def command_line(args: list[str | Path], places: dict[str, str]) -> list[str]:
    return [str(a).format(**places) for a in args]


def test_every_command_has_json_and_a_case_here() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    commands = sub.choices  # type: ignore[attr-defined]
    assert len(commands) == len(COMMANDS)
    for name, command in commands.items():
        if name in NOT_JSON:
            continue
        help_text = command.format_help()
        if name == "cache":
            assert "ACTION" in help_text
            continue
        assert "--json" in help_text, name
    # `import` has its own tests (tests/cli/test_import.py: it needs pnnx)
    assert {c.split()[0] for c in SUCCEEDS} | NOT_JSON | {"import"} == set(commands)
    cache = commands["cache"]
    (actions,) = [a for a in cache._actions if a.dest == "cache_command"]
    for action, p in actions.choices.items():
        assert "--json" in p.format_help(), action


@pytest.mark.parametrize("case", sorted(SUCCEEDS))
def test_json_output_is_one_document_on_stdout(case: str, places: dict[str, str]) -> None:
    p = vk(*command_line(SUCCEEDS[case], places), "--json")
    assert p.returncode == 0, p.stderr
    json.loads(p.stdout)  # the whole of stdout, nothing before or after
    progress = [line for line in p.stderr.splitlines() if line.startswith(f"vkserve {case}")]
    assert not progress, progress  # --json is quiet on stderr too


@pytest.mark.parametrize("case", sorted(FAILS))
def test_json_failures_are_json_too(case: str, places: dict[str, str]) -> None:
    args, status, code = FAILS[case]
    p = vk(*command_line(args, places), "--json")
    assert p.returncode == status, (p.stdout, p.stderr)
    answer = json.loads(p.stdout)
    assert answer["exit_status"] == status and answer["error"]["code"] == code, answer
    assert answer["error"]["message"] and answer["error"]["message"] in p.stderr


# ------------------------------------------------------------------------------ device names


def test_devices_are_named_cpu_and_vulkan_n_everywhere(daemon: Daemon, places: dict[str, str]) -> None:
    listed = json.loads(vk("devices", "--json").stdout)
    assert [d["device"] for d in listed] == ["vulkan:0", "cpu"]
    for flag in ("0", "vulkan:0"):  # a plain integer is a Vulkan index
        p = vk("run", DIGITS, "--device", flag, "--random-input", "--repeat", "1", "--json",
               "--cache-dir", places["cache"])
        assert p.returncode == 0 and json.loads(p.stdout)["device"] == "vulkan:0", p.stderr
    p = vk("verify", DIGITS, "--device", "0", "--json", "--cache-dir", places["cache"])
    assert p.returncode == 0 and json.loads(p.stdout)["device"] == "vulkan:0", p.stderr
    # the CPU is `cpu`, never the number after the GPUs'
    p = vk("run", DIGITS, "--device", "1", "--random-input")
    assert p.returncode == 2
    assert "no Vulkan device 1 (Vulkan devices: vulkan:0)" in p.stderr
    # the daemon: status, replies, metrics labels, `vkserve status`
    status = json.loads(vk("status", "--json", "--socket", daemon.socket).stdout)
    assert sorted(d["device"] for d in status["devices"]) == ["cpu", "vulkan:0"]
    with Client.connect(f"unix:{daemon.socket}") as client:
        reply = client.infer_detailed("digits", {"data": np.load(DIGITS / "samples" / "3.npy")})
    assert reply.device in ("cpu", "vulkan:0")
    table = vk("status", "--socket", daemon.socket).stdout
    assert "vulkan:0" in table and "\n  cpu " in table, table
    models = vk("models", "--socket", daemon.socket).stdout
    assert "vulkan:0" in models.splitlines()[1], models
    # models --json names them too, beside the scheduler's indices
    (digits,) = [m for m in json.loads(vk("models", "--json", "--socket", daemon.socket).stdout)
                 if m["name"] == "digits"]
    by_index = {d["index"]: d["device"] for d in status["devices"]}
    assert digits["device_names"] == [by_index[i] for i in digits["devices"]] and digits["device_names"]
    assert all(p["name"] == by_index[p["device"]] for p in digits["placements"]), digits


def test_random_input_is_one_range(daemon: Daemon) -> None:
    """`infer --random-input` sends what `run --random-input` runs: seeded uniform [-1, 1)."""
    p = vk("infer", "digits", "--random-input", "--seed", "5", "--json", "--socket", daemon.socket)
    assert p.returncode == 0, p.stderr
    sent = random_inputs({"data": (1, 8, 8)}, seed=5)["data"]
    assert sent.min() < 0  # not [0, 1)
    got = np.array(json.loads(p.stdout)["outputs"]["prob"]["values"], np.float32)
    np.testing.assert_allclose(got, cpu_engine_prob(sent), atol=2e-2)


def test_help_texts_hold() -> None:
    top = vk("--help").stdout
    assert "daemon.commands" not in top and "module" not in top
    assert "vulkan:0" in top and "Exit status" in top.replace("\n", " ")
    for command in ("profile", "tune"):
        text = " ".join(vk(command, "--help").stdout.split())
        assert "cpu (default)" not in text and "default vulkan:0" in text, text
    for command in ("run", "infer", "bench"):
        text = " ".join(vk(command, "--help").stdout.split())
        if command == "bench":
            assert "--random-input" not in text
        else:
            assert "uniform [-1, 1)" in text, (command, text)


# ------------------------------------------------------------------------------ progress


def test_progress_lines_on_stderr_when_not_a_terminal(places: dict[str, str], tmp_path: Path) -> None:
    p = vk("verify", DIGITS)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("vkserve verify: ")]
    # a stage that takes long (numba compiling the CPU kernels) adds "still working" lines
    stages = [ln for ln in lines if ": still working after " not in ln]
    assert stages[:3] == ["vkserve verify: running the CPU engine",
                          "vkserve verify: running the ncnn fp32 reference",
                          "vkserve verify: running ncnn's own bf16 path for the bars"], p.stderr
    assert len(stages) == 4 and stages[-1].startswith("vkserve verify: compared ")
    assert stages[-1].endswith(" output(s): ok")
    assert p.stdout.splitlines()[-1] == "OK"  # the report itself stays on stdout
    p = vk("cache", "warm", "--device", "0", "--cache-dir", tmp_path)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("vkserve cache warm: ")]
    assert lines[0].startswith("vkserve cache warm: building ") and " pipelines on vulkan:0 " in lines[0]
    total = int(lines[0].split()[4])
    assert f": {total}/{total} (100%) after " in lines[-2], lines
    assert lines[-1] == "vkserve cache warm: 1 device(s) warm"
    assert "\r" not in p.stderr


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """stderr on a pseudo-terminal: one line redrawn with carriage returns, a bar, then the
    closing line."""
    leader, follower = pty.openpty()
    try:
        p = subprocess.run(vkserve_cmd("cache", "warm", "--device", "0", "--cache-dir", str(tmp_path)),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=follower, timeout=300)
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert p.returncode == 0
    err = b"".join(chunks).decode()
    assert "\rvkserve cache warm: building " in err, err  # the stage, then its bar
    total = err.split("vkserve cache warm: building ", 1)[1].split()[0]
    assert f"\rvkserve cache warm: [{'#' * 24}] {total}/{total} building " in err, err
    assert err.rstrip().endswith("vkserve cache warm: 1 device(s) warm"), err[-500:]


def test_models_shows_what_a_loading_model_builds(tmp_path: Path, launch_daemon: Launch) -> None:
    """A model whose load is slow (warm-up runs on a CPU the test hook slows) shows the shape
    being built in `vkserve models` and in the daemon's log."""
    repo = make_repository(tmp_path / "repo", digits=False, slow=False)
    write_slow_model(repo, config='random_weights = true\ndevices = "cpu"\nwarmup = 40\n')
    d = launch_daemon(tmp_path, f'[server]\nsocket = "{tmp_path}/s.sock"\n'
                                f'[models]\nrepository = "{repo}"\n', env=SLOW_ENV, wait=False)
    d.wait_line("listening on unix")  # it answers while the start-up loads go on
    building = "building Plans for data=8x32x32 (1 of 1)"

    def progress() -> list[str | None]:
        with Client.connect(f"unix:{d.socket}") as client:
            (model,) = client.models()
        assert model["state"] == "loading", model  # 40 warm-up runs of 0.3 s
        return [p.get("progress") for p in model["placements"]]

    wait_for(lambda: progress() == [building], what="the slow model's progress")
    table = vk("models", "--socket", d.socket).stdout
    assert f"loading ({building})" in table, table
    assert f"model slow on cpu: {building}" in d.log_text()
    d.wait_line("send a job")  # loaded: the banner (and the fixture's clean stop)
    with Client.connect(f"unix:{d.socket}") as client:
        (model,) = client.models()
    assert model["state"] == "ready" and [p.get("progress") for p in model["placements"]] == [None]
