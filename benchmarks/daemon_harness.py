"""Start `vkserve serve` on a temporary socket with a prepared model repository (benchmarks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vkserve.client import Client  # noqa: E402
from vkserve.client.errors import ClientError  # noqa: E402


def start_daemon(tmp: Path, repo: Path, timeout: float = 300, *, env: dict[str, str] | None = None,
                 server: str = "", scheduler: str = "", tables: str = "") -> tuple[subprocess.Popen, Path]:
    """Run the daemon on `repo`; return once every model is ready on every device it is placed
    on, no placement still loading (or fail with its log): a model is ready as soon as one
    device serves it, but a measurement wants the steady state, and a failover run needs the
    device to fail over to ready before the fault.

    ``env`` is added to the daemon's environment (e.g. the test hooks); ``server`` and
    ``scheduler`` are extra TOML lines for those tables (``"drain_timeout = 5"``), ``tables``
    whole tables more (``[http]`` ...). The log is ``tmp/daemon.log``."""
    sock = tmp / "vkserve.sock"
    config = tmp / "vkserve.toml"
    config.write_text(f'[server]\nsocket = "{sock}"\n{server}\n[models]\nrepository = "{repo}"\n'
                      f'[scheduler]\n{scheduler}\n[metrics]\nlisten = "off"\n{tables}\n')
    log = tmp / "daemon.log"
    proc = subprocess.Popen([sys.executable, "-m", "vkserve", "serve", "--config",
                             str(config)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), env={**os.environ, **(env or {})})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if sock.exists():
            try:
                with Client.connect(f"unix:{sock}", timeout=5) as c:
                    models = c.models()
                    if models and all(m.get("state") == "ready" and not any(
                            p.get("state") == "loading" for p in m.get("placements", []))
                            for m in models):
                        return proc, sock
            except (OSError, ClientError):  # not listening yet, or busy starting: ask again
                pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"daemon did not become ready; log:\n{log.read_text()[-4000:]}")
