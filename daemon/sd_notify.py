"""systemd's readiness protocol and socket activation, written directly (no library).

`Notifier` sends sd_notify datagrams (READY=1, STATUS=..., WATCHDOG=1, STOPPING=1) to
`$NOTIFY_SOCKET`; it is a no-op outside systemd. `watchdog_interval()` reads
`$WATCHDOG_USEC`/`$WATCHDOG_PID`; the daemon pings at half that interval *from the trio
loop*, so a stuck loop stops the pings and systemd restarts the service. `listen_fds()`
returns sockets passed by socket activation (`$LISTEN_FDS`, fds from 3, for `$LISTEN_PID`).
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        self._sock: socket.socket | None = None
        self._address: str | bytes = ""
        if not address:
            return
        if address.startswith("@"):  # abstract namespace
            self._address = "\0" + address[1:]
        elif address.startswith("/"):
            self._address = address
        else:
            log.warning("ignoring NOTIFY_SOCKET=%r: not a path or abstract socket", address)
            return
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, **fields: str | int) -> bool:
        """Send `KEY=value` lines (keys upper-cased); False when not under systemd."""
        if self._sock is None:
            return False
        message = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            self._sock.sendto(message, self._address)
        except OSError as exc:  # systemd gone or socket full: never fatal for the daemon
            log.warning("sd_notify %s failed: %s", message[:40], exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(ready=1, status=status)

    def status(self, status: str) -> bool:
        return self.notify(status=status)

    def watchdog(self) -> bool:
        return self.notify(watchdog=1)

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify(stopping=1, status=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of WATCHDOG_USEC), or None when not asked."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


def listen_fds(env: dict[str, str] | None = None) -> list[socket.socket]:
    """Sockets handed over by systemd socket activation (none when not activated)."""
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
        os.environ.pop(key, None)  # children must not think the sockets are theirs
    return sockets
