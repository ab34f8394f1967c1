"""Listening sockets: the Unix socket (stale-file replacement, mode bits) and optional TCP.

trio has no Unix-socket listener helper: the socket is bound here with the stdlib and wrapped
in ``trio.SocketListener`` (DESIGN §10).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

import trio

from vkserve.client.paths import socket_folder_problem
from vkserve.daemon.config import ConfigError

log = logging.getLogger(__name__)

__all__ = ["ListenError", "UnixSocket", "UnsafeSocketFolder", "bind_unix_socket",
           "open_tcp_listeners"]

BACKLOG = 128
#: How long a connect() probe waits before calling an existing socket file live.
PROBE_TIMEOUT = 1.0


class ListenError(OSError):
    """The daemon cannot listen where it was asked to (one line for the operator)."""


class UnsafeSocketFolder(ConfigError):
    """The socket's folder would let another user replace the socket: a configuration error
    (exit status 2), reported with the folder, its owner and mode."""


@dataclass
class UnixSocket:
    """A bound, listening Unix socket and the identity of the file it created."""

    path: Path
    sock: socket.socket
    inode: tuple[int, int]

    def listener(self) -> trio.SocketListener:
        return trio.SocketListener(trio.socket.from_stdlib_socket(self.sock))

    def unlink(self) -> None:
        """Remove the socket file if it is still ours (not replaced by another daemon)."""
        try:
            st = self.path.lstat()
            if (st.st_dev, st.st_ino) == self.inode:
                self.path.unlink()
        except FileNotFoundError:
            return


def _folder_mode(folder: Path) -> int:
    """Mode for creating the socket's folder: 0700 when its parent is writable by others."""
    try:
        parent_mode = os.stat(folder.parent).st_mode
    except OSError:
        return 0o750
    return 0o700 if parent_mode & stat.S_IWOTH else 0o750


def _socket_is_live(path: Path) -> bool:
    """True when something accepts connections on ``path``; False for a stale file."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except TimeoutError:
        return True  # a listener with a full backlog is still a listener
    except OSError as exc:
        raise ListenError(f"{path}: cannot tell whether the socket is in use: {exc}") from None
    finally:
        probe.close()
    return True


def bind_unix_socket(path: Path, mode: int = 0o660) -> UnixSocket:
    """Bind and listen on ``path``; creates its directory when missing: 0700 inside a folder
    that others can write (the default ``/tmp/vkserve-UID``), else 0750.

    The directory must pass ``socket_folder_problem`` (owned by the daemon's user or root, not
    writable by group or others, ...) or ``UnsafeSocketFolder`` is raised: another user could
    otherwise replace the socket and receive the clients' requests.
    An existing socket file that refuses connections (left by a crashed daemon) is replaced;
    one that accepts them belongs to a running daemon and is an error, as is a non-socket file.
    """
    path = Path(path)
    if len(os.fsencode(path)) > 107:
        raise ListenError(f"{path}: socket path longer than 107 bytes")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=_folder_mode(path.parent))
    except OSError as exc:
        raise ListenError(f"{path.parent}: cannot create the socket directory: {exc}") from None
    problem = socket_folder_problem(path, for_daemon=True)
    if problem is not None:
        raise UnsafeSocketFolder(f"server.socket {path}: refusing to listen: {problem}; another "
                                 f"user could replace the socket (see README, Operations)")
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ListenError(f"{path}: exists and is not a socket; not replacing it")
        if _socket_is_live(path):
            raise ListenError(f"{path}: another vkserve (or other program) is listening there")
        log.warning("replacing stale socket %s (left by a daemon that did not shut down)", path)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # bind creates the file with the umask applied; tighten it before anyone can connect:
        # connect() needs write permission, and listen() comes after the chmod.
        old_umask = os.umask(0o777 & ~mode)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, mode)
        sock.listen(BACKLOG)
        st = path.lstat()
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(f"{path}: address in use (another daemon started at the same time?)") from None
        raise ListenError(f"{path}: cannot listen: {exc}") from None
    return UnixSocket(path, sock, (st.st_dev, st.st_ino))


async def open_tcp_listeners(host: str, port: int) -> list[trio.SocketListener]:
    try:
        return await trio.open_tcp_listeners(port, host=host, backlog=BACKLOG)
    except OSError as exc:
        raise ListenError(f"tcp {host}:{port}: cannot listen: {exc}") from None


def tcp_listen_address(listener: trio.SocketListener) -> tuple[str, int]:
    host, port = listener.socket.getsockname()[:2]
    return str(host), int(port)
