"""The clients against a real `vkserve serve`: the AsyncClient under asyncio and under trio gets
the answer `vkserve infer` prints, retries OVERLOADED, and every call of either client fails
with the client's own error, within its timeout, when the daemon is stopped or gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import numpy as np
import pytest

from tests.support.daemon import (
    DIGITS,
    ROOT,
    SLOW_SHAPE,
    Daemon,
    Launch,
    make_repository,
    sample,
    vkserve_cmd,
    wait_status,
)
from vkserve.client import (
    AsyncClient,
    Client,
    ConnectFailed,
    DeadlineExceeded,
    Overloaded,
    RetryPolicy,
)

#: `slow` runs on the CPU, where the daemon's test hook adds this much to every run; `digits`
#: runs on the Vulkan device (lavapipe), undelayed.
SLOW_ENV = {"VKSERVE_TEST_DEVICE_DELAY": "cpu=1.5"}
BACKENDS = ["asyncio", "trio"]


def config(work: Path, repo: Path, per_connection: int = 32) -> str:
    return f"""
[server]
socket = "{work}/d.sock"
max_requests_per_connection = {per_connection}

[models]
repository = "{repo}"
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("async-daemon")
    repo = make_repository(work / "repo")
    return launch_module_daemon(work, config(work, repo, per_connection=3), env=SLOW_ENV)


def cli_infer(daemon: Daemon, k: int) -> dict:
    """What `vkserve infer digits --input data=samples/K.npy --json` prints."""
    p = subprocess.run(
        vkserve_cmd("infer", "digits", "--input", f"data={DIGITS / 'samples' / f'{k}.npy'}",
                    "--socket", str(daemon.socket), "--json"),
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["outputs"]["prob"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_client_gets_the_answer_vkserve_infer_prints(daemon: Daemon, backend: str) -> None:
    got: dict[int, np.ndarray] = {}

    async def main() -> None:
        async with AsyncClient.connect(daemon.socket) as client:
            for k in (3, 7):
                got[k] = (await client.infer("digits", {"data": sample(k)}))["prob"]

    anyio.run(main, backend=backend)
    for k, prob in got.items():
        cli = cli_infer(daemon, k)
        assert cli["class"] == int(prob.argmax()) == k
        assert cli["shape"] == list(prob.shape) == [10]
        # one device (the Vulkan one) runs digits here: the same numbers, to JSON's rounding
        np.testing.assert_allclose(prob, np.array(cli["values"], np.float32), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_client_retries_overloaded_until_served(daemon: Daemon, backend: str) -> None:
    """The connection's three request slots are taken by `slow` jobs (1.5 s each on the
    CPU): an infer on it is refused OVERLOADED until one finishes, and the retrying client
    gets its answer then; without retries the same call raises Overloaded."""

    async def main() -> tuple[int, int]:
        retry = RetryPolicy(attempts=200, backoff=0.02, max_backoff=0.1)
        async with AsyncClient.connect(daemon.socket, retry=retry) as client:
            async with anyio.create_task_group() as tasks:
                for _ in range(3):
                    tasks.start_soon(client.infer, "slow", {"data": np.zeros(SLOW_SHAPE, np.float32)})
                await anyio.to_thread.run_sync(
                    lambda: wait_status(daemon, lambda s: s["server"]["infer_in_flight"] >= 3))
                client.retry = None
                with pytest.raises(Overloaded, match="requests in flight on this connection"):
                    await client.infer("digits", {"data": sample(4)})
                client.retry = retry
                reply = await client.infer_detailed("digits", {"data": sample(4)})
        return int(reply.outputs["prob"].argmax()), reply.attempts

    digit, attempts = anyio.run(main, backend=backend)
    assert digit == 4 and attempts >= 2


def readme_client_example() -> str:
    """The asyncio example of the README's "Client" section (its indented code block)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Client\n"):]
    start = section.index("    import asyncio\n")
    block = section[start:section.index("\n\n", section.index("asyncio.run(main())", start))]
    return "\n".join(line.removeprefix("    ") for line in block.splitlines())


def test_the_readme_client_example_runs(daemon: Daemon) -> None:
    code = readme_client_example()
    assert "AsyncClient.connect(" in code and "asyncio.run(main())" in code
    env = {k: v for k, v in os.environ.items() if k != "VKSERVE_TOKEN"}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, check=False, env={**env, "VKSERVE_SOCKET": str(daemon.socket)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "3"  # what the example's comment says it prints


# ------------------------------------------------------------------------------ no daemon


def every_sync_call(c: Client) -> list[tuple[str, Callable[[], object]]]:
    return [("infer", lambda: c.infer("digits", {"data": sample(1)})),
            ("infer_detailed", lambda: c.infer_detailed("digits", {"data": sample(1)})),
            ("models", c.models), ("status", c.status), ("ping", c.ping),
            ("load_model", lambda: c.load_model("digits")),
            ("unload_model", lambda: c.unload_model("digits"))]


def every_async_call(c: AsyncClient) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    return [("infer", lambda: c.infer("digits", {"data": sample(1)})),
            ("infer_detailed", lambda: c.infer_detailed("digits", {"data": sample(1)})),
            ("models", c.models), ("status", c.status), ("ping", c.ping),
            ("load_model", lambda: c.load_model("digits")),
            ("unload_model", lambda: c.unload_model("digits"))]


#: The clients' timeout in these tests; the outer guard only catches a call that hangs.
TIMEOUT = 0.5
GUARD = 60.0


def test_a_stopped_daemon_fails_every_call_within_its_timeout(tmp_path: Path, launch_daemon: Launch,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import vkserve.client.connection

    monkeypatch.setattr(vkserve.client.connection, "DEADLINE_GRACE", 0.1)
    repo = make_repository(tmp_path / "repo", slow=False)
    d = launch_daemon(tmp_path, config(tmp_path, repo))
    d.proc.send_signal(signal.SIGSTOP)  # alive, listening, answering nothing
    try:
        with Client.connect(d.socket, timeout=TIMEOUT) as c:
            for _, call in every_sync_call(c):
                with pytest.raises(DeadlineExceeded, match=r"no answer from the server within"):
                    call()

        async def main() -> None:
            with anyio.fail_after(GUARD):
                async with AsyncClient.connect(d.socket, timeout=TIMEOUT) as c:
                    for _, call in every_async_call(c):
                        with pytest.raises(DeadlineExceeded, match="no answer from the server within"):
                            await call()

        for backend in BACKENDS:
            anyio.run(main, backend=backend)
    finally:
        d.proc.send_signal(signal.SIGCONT)
    assert d.stop() == 0


def test_a_gone_daemon_is_connect_failed(tmp_path: Path, launch_daemon: Launch) -> None:
    repo = make_repository(tmp_path / "repo", slow=False)
    d = launch_daemon(tmp_path, config(tmp_path, repo))
    with Client.connect(d.socket) as c:
        assert c.ping() > 0
    d.proc.send_signal(signal.SIGKILL)  # no clean-up: the socket file stays, nobody listens
    d.proc.wait()
    assert d.socket.exists()
    with pytest.raises(ConnectFailed, match="Connection refused") as err:
        Client.connect(d.socket, timeout=TIMEOUT)
    assert str(d.socket) in str(err.value)

    async def main() -> None:
        with pytest.raises(ConnectFailed, match="Connection refused"):
            async with AsyncClient.connect(d.socket, timeout=TIMEOUT):
                pass

    for backend in BACKENDS:
        anyio.run(main, backend=backend)
    d.socket.unlink()  # what a clean stop leaves: no socket at all
    with pytest.raises(ConnectFailed, match="No such file"):
        Client.connect(d.socket)
