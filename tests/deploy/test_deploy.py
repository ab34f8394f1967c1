"""The systemd unit is checked with systemd's own tools (installed by the test command)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

DEPLOY = REPO / "deploy"


@pytest.fixture
def unit(tmp_path) -> Path:
    """The unit with ExecStart pointing at this checkout's vkserve, so `verify` can stat it."""
    exe = Path(sys.executable).parent / "vkserve"
    text = (DEPLOY / "vkserve.service").read_text()
    text = text.replace("/opt/vkserve/venv/bin/vkserve", str(exe))
    path = tmp_path / "vkserve.service"
    path.write_text(text)
    return path


def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze missing: deploy/dev.sh installs Debian's systemd package"
    return exe


def test_unit_verifies_without_warnings(unit):
    out = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "" and out.stderr.strip() == "", out.stderr


def test_unit_hardening_score(unit):
    """Exposure at most 2.0 (of 10) without MemoryDenyWriteExecute=, which the GPU path lacks
    (--threshold is on a 0-100 scale: 20 = an exposure of 2.0)."""
    out = subprocess.run([systemd_analyze(), "security", "--offline=yes", "--threshold=20",
                          str(unit)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout[-2000:]
    score = re.search(r"Overall exposure level for \S+: (\d+\.\d)", out.stdout)
    assert score, out.stdout[-2000:]
    assert float(score.group(1)) <= 2.0, out.stdout[-4000:]


def test_unit_has_the_required_settings():
    text = (DEPLOY / "vkserve.service").read_text()
    for line in ["Type=notify", "CacheDirectory=vkserve", "RuntimeDirectory=vkserve",
                 "StateDirectory=vkserve", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "ProtectHome=yes", "PrivateTmp=yes", "DevicePolicy=closed",
                 "DeviceAllow=char-drm rw", "SupplementaryGroups=render video",
                 "WatchdogSec=", "SystemCallFilter=@system-service",
                 "SystemCallErrorNumber=EPERM"]:
        assert line in text, line
    assert "PrivateDevices=yes" not in text  # it would hide /dev/dri
    # W^X breaks the GPU path (cffi callbacks of the `vulkan` binding, Mesa's and NVIDIA's JITs):
    # tests/deploy/test_systemd_real.py shows the daemon on the CPU only under it.
    settings = [line for line in text.splitlines() if not line.startswith("#")]
    assert not [line for line in settings if line.startswith("MemoryDenyWriteExecute=")], settings


def test_install_script_parses():
    subprocess.run(["bash", "-n", str(DEPLOY / "install.sh")], check=True)


def test_socket_unit_listens_where_the_service_binds():
    """Socket activation and a plain start serve the same path: the service's default socket,
    $RUNTIME_DIRECTORY/vkserve.sock, which the clients try."""
    from vkserve.client.paths import SOCKET_NAME, client_socket_candidates, default_socket_path

    service = (DEPLOY / "vkserve.service").read_text().splitlines()
    runtime = next(line.split("=", 1)[1] for line in service if line.startswith("RuntimeDirectory="))
    assert "RuntimeDirectoryPreserve=yes" in service  # else stopping it removes the socket's folder
    listen = [line.split("=", 1)[1] for line in (DEPLOY / "vkserve.socket").read_text().splitlines()
              if line.startswith("ListenStream=/")]
    bound = default_socket_path({"RUNTIME_DIRECTORY": f"/run/{runtime}"}, euid=999)
    assert listen == [str(bound)] == [f"/run/{runtime}/{SOCKET_NAME}"]
    assert bound in client_socket_candidates({}, euid=0)
