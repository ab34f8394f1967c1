"""The client commands (`vkserve infer/models/status/ping`) against a live daemon subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support.daemon import (
    DIGITS,
    ROOT,
    TOKEN,
    Daemon,
    Launch,
    cpu_engine_prob,
    make_repository,
    vkserve_cmd,
)


@pytest.fixture(scope="module")
def cli_daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("cli")
    repo = make_repository(work / "repo", slow=False)
    return launch_module_daemon(work, f"""
[server]
socket = "{work}/c.sock"
tcp = "127.0.0.1:0"
token = "{TOKEN}"
[models]
repository = "{repo}"
""")


def vk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "VKSERVE_TOKEN"}
    full_env.update(env or {})
    return subprocess.run(vkserve_cmd(*args), cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=full_env)


def test_infer_prints_the_class(cli_daemon: Daemon) -> None:
    p = vk("infer", "digits", "--input", f"data={DIGITS}/samples/3.npy", "--socket", str(cli_daemon.socket))
    assert p.returncode == 0, p.stderr
    assert "prob  float32 (10,)  class 3" in p.stdout


def test_infer_json_equals_the_cpu_engine_and_vkserve_run(cli_daemon: Daemon) -> None:
    for k in (0, 4, 9):
        path = f"{DIGITS}/samples/{k}.npy"
        p = vk("infer", "digits", "--input", f"data={path}", "--json", "--priority", "2",
               "--timeout", "30", "--socket", str(cli_daemon.socket))
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)["outputs"]["prob"]
        ref = cpu_engine_prob(np.load(path))
        assert out["shape"] == [10] and out["class"] == k == int(ref.argmax())
        np.testing.assert_allclose(np.array(out["values"], np.float32), ref, atol=2e-2)
    run = vk("run", str(DIGITS), "--input", f"data={DIGITS}/samples/4.npy", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["outputs"] == [{"name": "prob", "shape": [10]}]


def test_infer_random_input_over_tcp(cli_daemon: Daemon) -> None:
    assert cli_daemon.tcp is not None
    host, port = cli_daemon.tcp
    p = vk("infer", "digits", "--random-input", "--tcp", f"{host}:{port}", "--token", TOKEN)
    assert p.returncode == 0, p.stderr
    assert "prob  float32 (10,)  class " in p.stdout
    p = vk("ping", "--tcp", f"{host}:{port}", env={"VKSERVE_TOKEN": TOKEN})
    assert p.returncode == 0 and p.stdout.startswith("pong in "), p.stderr
    p = vk("ping", "--tcp", f"{host}:{port}", "--token", "not-the-token-0123456789")
    assert p.returncode == 1 and "UNAUTHENTICATED" in p.stderr


def test_models_and_status(cli_daemon: Daemon) -> None:
    sock = str(cli_daemon.socket)
    p = vk("models", "--socket", sock)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1].split()[:2] == ["digits", "ready"]
    assert "data (1, 8, 8)" in p.stdout
    models = json.loads(vk("models", "--json", "--socket", sock).stdout)
    assert [m["name"] for m in models] == ["digits"] and models[0]["inputs"] == {"data": [1, 8, 8]}
    p = vk("status", "--socket", sock)
    assert p.returncode == 0, p.stderr
    assert "healthy" in p.stdout and "digits" in p.stdout and "clients" in p.stdout
    status = json.loads(vk("status", "--json", "--socket", sock).stdout)
    assert status["ready"] is True and status["server"]["draining"] is False
    assert status["gpu_problem"] is None and "UNUSABLE" not in p.stdout  # lavapipe is a GPU
    assert any(d["kind"] == "cpu" and d["healthy"] for d in status["devices"])


def test_client_errors_exit_nonzero(cli_daemon: Daemon, tmp_path: Path) -> None:
    sock = str(cli_daemon.socket)
    p = vk("infer", "nope", "--input", f"data={DIGITS}/samples/1.npy", "--socket", sock)
    assert p.returncode == 1 and "NOT_FOUND" in p.stderr
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((2, 8, 8), np.float32))
    p = vk("infer", "digits", "--input", f"data={bad}", "--socket", sock)
    assert p.returncode == 1 and "BAD_REQUEST" in p.stderr
    p = vk("infer", "digits", "--socket", sock)
    assert p.returncode == 2 and "--random-input" in p.stderr
    p = vk("infer", "digits", "--input", "data", "--socket", sock)
    assert p.returncode == 2
    p = vk("ping", "--socket", str(tmp_path / "nothing.sock"))
    assert p.returncode == 3 and "UNREACHABLE: cannot talk to the daemon" in p.stderr
    p = vk("models", "--json", "--socket", str(tmp_path / "nothing.sock"))
    answer = json.loads(p.stdout)
    assert p.returncode == 3 and answer["error"]["code"] == "UNREACHABLE" and answer["exit_status"] == 3
    p = vk("infer", "nope", "--random-input", "--json", "--socket", sock)
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "NOT_FOUND"


def test_a_closed_pipe_is_no_traceback(cli_daemon: Daemon) -> None:
    """`vkserve status --json | true`: the reader is gone before the command writes."""
    proc = subprocess.Popen(vkserve_cmd("status", "--json", "--socket", str(cli_daemon.socket)),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
