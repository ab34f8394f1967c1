"""SIGTERM while a model is still loading: the daemon stops at the load's next pipeline or
warm-up run instead of finishing it (systemd's stop timeout must not be what ends it), frees
what was built and exits 0; the pipeline cache it saves stays valid.

The load is made long with the device test hook (every run on the CPU, warm-up included,
waits 120 s): a daemon that waited for it would take two minutes to stop. A real
`vkserve serve` subprocess (tests/support/daemon.py)."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

from tests.support.daemon import Launch, wait_for
from tests.support.paths import DIGITS


def test_sigterm_during_a_load_stops_it_and_exits_cleanly(tmp_path: Path,
                                                          launch_daemon: Launch) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(DIGITS, repo / "digits")  # a copy: its config.toml changes here
    config = repo / "digits" / "config.toml"
    config.write_text(config.read_text().replace("warmup = 2", 'warmup = 1\ndevices = "cpu"'))
    daemon = launch_daemon(tmp_path, f"""
[server]
socket = "{tmp_path}/d.sock"

[models]
repository = "{repo}"
""", wait=False, env={"VKSERVE_TEST_DEVICE_DELAY": "cpu=120"})
    wait_for(lambda: "model digits on cpu: building Plans" in daemon.log_text(), timeout=120,
             what="the digits load to start")
    time.sleep(0.5)  # into the warm-up run
    started = time.monotonic()
    assert daemon.stop(signal.SIGTERM, timeout=60) == 0, daemon.log_text()[-3000:]
    stopped_in = time.monotonic() - started
    log = daemon.log_text()
    assert stopped_in < 60, f"the daemon waited for the load ({stopped_in:.1f} s)"
    assert "model digits ready" not in log  # the load did not finish ...
    assert "Traceback" not in log  # ... and its cancellation is no error
