"""systemd integration without dependencies (DESIGN §10): sd_notify and socket activation.

``notify("READY=1\\nSTATUS=...")`` sends one datagram to ``$NOTIFY_SOCKET``; without the variable
(not run by systemd) it does nothing. Errors are logged, never raised: notification is advisory.
``listen_fds()`` returns the sockets systemd passed (``$LISTEN_FDS`` from fd 3, for
``$LISTEN_PID``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

__all__ = ["listen_fds", "notify", "watchdog_interval"]

SD_LISTEN_FDS_START = 3


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (newline-separated KEY=VALUE) to systemd; False when not under systemd."""
    env = os.environ if env is None else env
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address[0] == "@":
        address = "\0" + address[1:]
    elif address[0] != "/":
        log.warning("NOTIFY_SOCKET %r: only Unix socket addresses are supported", address)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode("utf-8"))
    except OSError as exc:
        log.warning("sd_notify to %s failed: %s", env.get("NOTIFY_SOCKET"), exc)
        return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``$WATCHDOG_USEC``), if the watchdog is on
    for this process."""
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 2e6


def listen_fds(env: Mapping[str, str] | None = None) -> list[socket.socket]:
    """Sockets handed over by socket activation (none when not activated for this process).

    The variables are removed from the environment so that children do not claim the fds.
    """
    env = os.environ if env is None else env
    if env.get("LISTEN_PID", "") != str(os.getpid()):
        return []
    count = env.get("LISTEN_FDS", "0")
    if not count.isdigit():
        log.warning("ignoring LISTEN_FDS=%r: not a number", count)
        return []
    sockets = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count)):
        os.set_inheritable(fd, False)
        sockets.append(socket.socket(fileno=fd))
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(key, None)
    return sockets
