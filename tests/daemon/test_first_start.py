"""A first start (numba's cache empty: the CPU kernels take minutes to compile on a small box)
does not hold the sockets up: they answer, a model placed on the GPU and the CPU serves from the
GPU while `models` shows the CPU placement waiting for its kernels (the start-up is announced,
READY=1 under systemd, once every placement has loaded), and SIGTERM stops the daemon at once,
the compilation abandoned. The kernels compile in a child process (numba's compiler would hold
the daemon's GIL against its event loop), which goes when the daemon goes, killed or not."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from tests.support.daemon import running_daemon
from tests.support.paths import DIGITS
from vkserve.client import Client


def test_the_daemon_serves_from_the_gpu_while_the_cpu_kernels_compile(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    folder = repo / "digits"
    shutil.copytree(DIGITS, folder)
    (folder / "config.toml").write_text('devices = "all"\nwarmup = 1\n[inputs]\ndata = [1, 8, 8]\n')
    numba_cache = tmp_path / "numba"  # empty: every kernel must be compiled
    sample = np.load(DIGITS / "samples" / "3.npy").astype(np.float32)
    with running_daemon(tmp_path, f'[server]\nsocket = "{tmp_path}/d.sock"\n'
                        f'[models]\nrepository = "{repo}"\n',
                        env={"NUMBA_CACHE_DIR": str(numba_cache)}, wait=False) as daemon:
        daemon.wait_line("listening on unix")
        with Client.connect(f"unix:{daemon.socket}", timeout=30) as client:
            end = time.monotonic() + 60
            while True:  # the GPU's load: seconds on lavapipe
                [info] = client.models()
                by_name = {p["name"]: p for p in info["placements"]}
                if by_name["vulkan:0"]["state"] == "ready" or time.monotonic() > end:
                    break
                time.sleep(0.1)
            assert by_name["vulkan:0"]["state"] == "ready" and info["state"] == "ready", info
            assert by_name["cpu"]["state"] == "loading", info
            assert by_name["cpu"]["progress"] == ("waiting for cpu's kernels to be compiled for "
                                                  "this machine (a first start: minutes)"), info
            reply = client.infer("digits", {"data": sample})
            assert int(np.argmax(reply["prob"])) == 3
        assert "CPU kernels ready in" not in daemon.log_text()
        assert not any("send a job" in line for line in daemon.lines)  # not announced yet
        [compiler] = compilers(daemon.proc.pid)
        start = time.monotonic()
        assert daemon.stop(timeout=30) == 0, daemon.log_text()[-3000:]
        assert time.monotonic() - start < 20, "SIGTERM waited for the compilation"
        assert not running(compiler), "the compiler outlived the daemon"
    assert ("CPU kernels: not in numba's cache for this machine: compiling them in a child "
            "process") in daemon.log_text()


def test_a_killed_daemon_leaves_no_compiler_running(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(DIGITS, repo / "digits")
    with running_daemon(tmp_path, f'[server]\nsocket = "{tmp_path}/d.sock"\n'
                        f'[models]\nrepository = "{repo}"\n',
                        env={"NUMBA_CACHE_DIR": str(tmp_path / "numba")}, wait=False) as daemon:
        end = time.monotonic() + 60
        while not compilers(daemon.proc.pid) and time.monotonic() < end:
            time.sleep(0.05)
        [compiler] = compilers(daemon.proc.pid)
        daemon.proc.kill()
        daemon.proc.wait()
        end = time.monotonic() + 10
        while running(compiler) and time.monotonic() < end:
            time.sleep(0.1)
        assert not running(compiler), "the compiler outlived the killed daemon"


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (an orphan's exit may stay a zombie where
    nothing reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def compilers(daemon: int) -> list[int]:
    """The daemon's children compiling the CPU kernels."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == daemon and b"compile_child" in cmdline:
                found.append(int(entry.name))
    return found
