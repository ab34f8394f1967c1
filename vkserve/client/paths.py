"""Where the daemon listens, and parsing of client address strings.

Shared by the daemon (``default_socket_path``) and the clients (``resolve_address``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SOCKET_NAME",
    "Address",
    "TcpAddress",
    "UnixAddress",
    "client_socket_candidates",
    "default_socket_path",
    "parse_address",
    "resolve_address",
]

SOCKET_NAME = "vkserve.sock"
SYSTEM_SOCKET_PATH = Path("/run/vkserve") / SOCKET_NAME
#: Where deploy/vkserve.socket has systemd listen (socket activation).
ACTIVATION_SOCKET_PATH = Path("/run/vkserve.sock")


@dataclass(frozen=True, slots=True)
class UnixAddress:
    path: str


@dataclass(frozen=True, slots=True)
class TcpAddress:
    host: str
    port: int


Address = UnixAddress | TcpAddress


def default_socket_path(env: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """The Unix socket path the daemon binds by default.

    In order: systemd's ``$RUNTIME_DIRECTORY`` (first entry; ``RuntimeDirectory=vkserve`` gives
    ``/run/vkserve``), ``$XDG_RUNTIME_DIR/vkserve/``, ``/run/vkserve/`` for root, else
    ``/tmp/vkserve-<uid>/``. The caller creates the directory (mode 0700 or 0750).
    """
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    runtime_dir = env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if runtime_dir:
        return Path(runtime_dir) / SOCKET_NAME
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "vkserve" / SOCKET_NAME
    if euid == 0:
        return SYSTEM_SOCKET_PATH
    return Path(f"/tmp/vkserve-{euid}") / SOCKET_NAME


def client_socket_candidates(env: Mapping[str, str] | None = None, euid: int | None = None) -> list[Path]:
    """Paths a client tries, in order: ``$VKSERVE_SOCKET``, this user's default, the system one,
    the socket-activation one."""
    env = os.environ if env is None else env
    out: list[Path] = []
    if env.get("VKSERVE_SOCKET"):
        out.append(Path(env["VKSERVE_SOCKET"]))
    for path in (default_socket_path(env, euid), SYSTEM_SOCKET_PATH, ACTIVATION_SOCKET_PATH):
        if path not in out:
            out.append(path)
    return out


_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.%\w]+)\]|(?P<host>[^:\[\]/]+)):(?P<port>\d{1,5})$")


def parse_address(spec: str | os.PathLike[str]) -> Address:
    """Parse ``/path/to.sock``, ``unix:PATH``, ``unix://PATH``, ``host:port``, ``[v6]:port`` or
    ``tcp://host:port``. A string with a ``/`` or without a ``:`` is a socket path."""
    if isinstance(spec, os.PathLike):
        return UnixAddress(os.fspath(spec))
    if spec.startswith("unix:"):
        path = spec.removeprefix("unix:")
        path = path.removeprefix("//")
        if not path:
            raise ValueError(f"empty socket path in {spec!r}")
        return UnixAddress(path)
    tcp = spec.startswith("tcp://")
    rest = spec.removeprefix("tcp://")
    if not tcp and ("/" in rest or ":" not in rest):
        if not rest:
            raise ValueError("empty address")
        return UnixAddress(rest)
    m = _HOST_PORT.match(rest)
    if m is None:
        raise ValueError(f"cannot parse address {spec!r}; expected PATH, HOST:PORT or tcp://HOST:PORT")
    port = int(m["port"])
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {spec!r}")
    return TcpAddress(m["v6"] or m["host"], port)


def resolve_address(spec: str | os.PathLike[str] | Address | None = None) -> Address:
    """``spec`` parsed, or with ``None`` the first existing client candidate socket (else the
    user's default path, so the connection error names a sensible place)."""
    if isinstance(spec, (UnixAddress, TcpAddress)):
        return spec
    if spec is not None:
        return parse_address(spec)
    candidates = client_socket_candidates()
    for path in candidates:
        if path.exists():
            return UnixAddress(str(path))
    return UnixAddress(str(candidates[0]))
