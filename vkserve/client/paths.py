"""Where the daemon listens, parsing of client address strings, and the safety rule for the
socket's folder.

Shared by the daemon (``default_socket_path``, ``socket_folder_problem``) and the clients
(``resolve_address``, ``check_socket_folder``).
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ClientError

__all__ = [
    "SOCKET_NAME",
    "Address",
    "TcpAddress",
    "UnixAddress",
    "UnsafeSocketFolder",
    "check_socket_folder",
    "client_socket_candidates",
    "default_socket_path",
    "parse_address",
    "resolve_address",
    "socket_folder_problem",
]

SOCKET_NAME = "vkserve.sock"
#: The service's socket (RuntimeDirectory=vkserve), where deploy/vkserve.socket listens too.
SYSTEM_SOCKET_PATH = Path("/run/vkserve") / SOCKET_NAME


@dataclass(frozen=True, slots=True)
class UnixAddress:
    path: str

    def __str__(self) -> str:
        return f"unix:{self.path}"


@dataclass(frozen=True, slots=True)
class TcpAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"tcp://[{self.host}]:{self.port}" if ":" in self.host else f"tcp://{self.host}:{self.port}"


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
    """Paths a client tries, in order: ``$VKSERVE_SOCKET``, this user's default, the system one
    (also the socket-activation one)."""
    env = os.environ if env is None else env
    out: list[Path] = []
    if env.get("VKSERVE_SOCKET"):
        out.append(Path(env["VKSERVE_SOCKET"]))
    for path in (default_socket_path(env, euid), SYSTEM_SOCKET_PATH):
        if path not in out:
            out.append(path)
    return out


class UnsafeSocketFolder(ClientError):
    """The socket's folder lets another user replace the socket (so a request could reach
    an impostor): the client refuses to connect there."""


_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _describe(path: str, st: os.stat_result) -> str:
    return f"{path} (owner {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})"


def socket_folder_problem(socket_path: str | os.PathLike[str], *, for_daemon: bool,
                          euid: int | None = None) -> str | None:
    """Why the folder of ``socket_path`` would let another user replace the socket, or None.

    The rule (README, Operations): the socket's folder is not writable by group or others,
    and the folders above it are not either unless sticky (``/tmp``); a symbolic link on the
    way that sits in a folder others can write must belong to this user or root. The folder's
    owner: for the daemon (``for_daemon``), the daemon's user or root; for a client, this user,
    root, or any user when the folder's parent is not writable by group or others (so only
    that parent's owner could have put it there: ``/run/vkserve`` owned by the daemon's user
    passes, ``/tmp/vkserve-UID`` made by someone else does not). The folders above the socket's
    belong to root, this user or the folder's owner.

    A missing folder, or one this process cannot look into, is not judged here (None): the
    bind or connect that follows fails with its own error. Abstract sockets have no folder.
    """
    raw = os.fsdecode(socket_path)
    if not raw or raw.startswith("\0"):
        return None
    euid = os.geteuid() if euid is None else euid
    trusted = {0, euid}
    folder = os.path.dirname(os.path.join(os.getcwd(), raw))
    try:
        # 1. Symbolic links on the (lexical) way: one in a folder that others can write must
        # be ours or root's, or its owner could point it elsewhere at any time.
        cur = "/"
        for part in folder.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                cur = os.path.dirname(cur)
                continue
            nxt = os.path.join(cur, part)
            lst = os.lstat(nxt)
            if stat.S_ISLNK(lst.st_mode):
                here = os.stat(cur)
                if here.st_mode & _GROUP_OTHER_WRITE and lst.st_uid not in trusted:
                    return (f"{nxt} is a symbolic link owned by {_user(lst.st_uid)} in "
                            f"{_describe(cur, here)}, which others can write")
                nxt = os.path.realpath(nxt)
            cur = nxt
        # 2. The real folder and every folder above it.
        real = os.path.realpath(folder)
        st = os.stat(real)
        chain = [real]
        while chain[-1] != "/":
            chain.append(os.path.dirname(chain[-1]))
        above = [(p, os.stat(p)) for p in chain[1:]]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    where = _describe(real, st)
    if not stat.S_ISDIR(st.st_mode):
        return None  # bind/connect says "not a directory"
    if st.st_mode & _GROUP_OTHER_WRITE:
        return f"the socket's folder {where} is writable by group or others"
    if st.st_uid not in trusted:
        if for_daemon:
            return (f"the socket's folder {where} does not belong to the daemon's user "
                    f"({_user(euid)}) or root")
        parent, pst = above[0] if above else (real, st)
        if pst.st_mode & _GROUP_OTHER_WRITE:
            return (f"the socket's folder {where} belongs to another user, inside "
                    f"{_describe(parent, pst)}, where anyone can create folders")
    owners = trusted | {st.st_uid}
    for path, ast in above:
        if ast.st_mode & _GROUP_OTHER_WRITE and not ast.st_mode & stat.S_ISVTX:
            return (f"{_describe(path, ast)}, a folder above the socket's folder {real}, is "
                    f"writable by group or others and not sticky")
        if ast.st_uid not in owners:
            return (f"{_describe(path, ast)}, a folder above the socket's folder {real}, "
                    f"belongs to another user")
    return None


def check_socket_folder(socket_path: str | os.PathLike[str]) -> None:
    """Clients, before connecting: raise UnsafeSocketFolder (naming the path and why) when the
    socket's folder fails ``socket_folder_problem``; nothing is sent there then."""
    problem = socket_folder_problem(socket_path, for_daemon=False)
    if problem is not None:
        raise UnsafeSocketFolder(f"{os.fsdecode(socket_path)}: refusing to connect: {problem}; "
                                 f"another user could have replaced the socket")


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
