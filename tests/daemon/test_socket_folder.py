"""Issue 11, item 6: the socket's folder must not let another user replace the socket.

Real `vkserve serve` subprocesses refuse (exit status 2, the folder, its owner and mode in the
message) a socket folder that another user made or that others can write, including the
default ``/tmp/vkserve-UID`` of a user without ``$XDG_RUNTIME_DIR`` (the daemon runs as `nobody`
there, through ``setpriv`` with the capabilities to read this root-owned checkout). Clients
refuse to send to a socket in such a folder: an impostor listening there never sees a byte.
The tests run as root; "another user" is `nobody` or the unassigned uid ``ATTACKER``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.support.daemon import ROOT, Launch, make_repository, vkserve_cmd
from vkserve.client import AsyncClient, Client, UnsafeSocketFolder
from vkserve.client.paths import socket_folder_problem

NOBODY = pwd.getpwnam("nobody").pw_uid
ATTACKER = 4242  # no passwd entry needed: "another user" is just another uid
NOBODY_DEFAULT = Path(f"/tmp/vkserve-{NOBODY}")



@pytest.fixture(autouse=True)
def as_root() -> None:
    """The test command runs as root (it installs Debian packages); chown and setpriv need it."""
    assert os.geteuid() == 0, "these tests need root (chown, setpriv), as the test command runs"


def as_nobody() -> list[str]:
    """A command prefix running the rest as `nobody`, able to read root's files (the venv's
    interpreter lives under /root): capabilities change access checks, not the owner checks
    of the socket folder."""
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is not installed"
    caps = "+dac_read_search,+dac_override"
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            f"--inh-caps={caps}", f"--ambient-caps={caps}"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the variables that pick a socket path or a token."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "RUNTIME_DIRECTORY", "VKSERVE_SOCKET", "VKSERVE_TOKEN",
                        "LISTEN_FDS", "LISTEN_PID")}
    env.update(extra)
    return env


def serve(*args: str, user: list[str] | None = None, timeout: float = 60
          ) -> subprocess.CompletedProcess[str]:
    """`vkserve serve` expected to stop at start: its exit status and output."""
    return subprocess.run([*(user or []), *vkserve_cmd("serve", "--metrics-listen", "off",
                                                       *args)],
                          check=False, cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def sticky_folder(tmp_path: Path) -> Path:
    """A sticky, world-writable folder like /tmp."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def planted(folder: Path, uid: int, mode: int) -> Path:
    folder.mkdir()
    os.chown(folder, uid, uid)
    folder.chmod(mode)
    return folder


class Impostor:
    """Another user's listener at ``path``: records every connection and byte it gets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        path.chmod(0o666)
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self.connections = 0
        self.received = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(1.0)
                try:
                    while data := conn.recv(65536):
                        self.received += data
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def impostor() -> Iterator[type[Impostor]]:
    made: list[Impostor] = []

    def make(path: Path) -> Impostor:
        made.append(Impostor(path))
        return made[-1]

    yield make  # type: ignore[misc]
    for imp in made:
        imp.close()


@pytest.fixture
def nobody_default() -> Iterator[Path]:
    """``/tmp/vkserve-<nobody's uid>``: absent at the start (it is not ours to touch: the test
    fails rather than remove it), removed at the end."""
    assert not os.path.lexists(NOBODY_DEFAULT), f"{NOBODY_DEFAULT} exists already: remove it to run this test"
    yield NOBODY_DEFAULT
    if os.path.islink(NOBODY_DEFAULT) or NOBODY_DEFAULT.is_file():
        NOBODY_DEFAULT.unlink()
    elif NOBODY_DEFAULT.exists():
        shutil.rmtree(NOBODY_DEFAULT)


# ------------------------------------------------------------------------------ the daemon


@pytest.mark.parametrize(("owner", "mode", "why"), [
    (NOBODY, 0o777, "writable by group or others"),  # the case
    (NOBODY, 0o700, "does not belong to the daemon's user"),
    (0, 0o777, "writable by group or others"),
    (0, 0o770, "writable by group or others"),
])
def test_the_daemon_refuses_an_unsafe_socket_folder(tmp_path: Path, owner: int, mode: int,
                                                    why: str) -> None:
    folder = planted(sticky_folder(tmp_path) / "vk", owner, mode)
    repo = make_repository(tmp_path / "repo", digits=False)
    p = serve("--socket", str(folder / "vkserve.sock"), "--models", str(repo))
    assert p.returncode == 2, p.stderr
    user = "uid 65534 (nobody)" if owner == NOBODY else "uid 0 (root)"
    assert f"{folder} (owner {user}, mode {mode:04o})" in p.stderr, p.stderr
    assert why in p.stderr and "refusing to listen" in p.stderr, p.stderr
    assert list(folder.iterdir()) == []  # nothing bound there


def test_the_daemon_refuses_a_socket_in_a_world_writable_folder_itself(tmp_path: Path) -> None:
    shared = sticky_folder(tmp_path)  # like `--socket /tmp/vk.sock`: anyone can bind there first
    p = serve("--socket", str(shared / "vk.sock"),
              "--models", str(make_repository(tmp_path / "repo", digits=False)))
    assert p.returncode == 2 and f"{shared} (owner uid 0 (root), mode 1777)" in p.stderr, p.stderr


@pytest.mark.parametrize("plant", ["another user's folder", "a 0777 folder",
                                   "another user's symbolic link"])
def test_the_default_tmp_folder_is_verified(tmp_path: Path, nobody_default: Path,
                                            plant: str) -> None:
    """`nobody` has no $XDG_RUNTIME_DIR: its default socket is /tmp/vkserve-65534/vkserve.sock,
    a folder anyone could have made first."""
    if plant == "another user's folder":
        planted(nobody_default, ATTACKER, 0o755)
        expected = f"{nobody_default} (owner uid {ATTACKER}, mode 0755)"
    elif plant == "a 0777 folder":
        planted(nobody_default, NOBODY, 0o777)
        expected = f"{nobody_default} (owner uid 65534 (nobody), mode 0777)"
    else:
        target = planted(tmp_path / "elsewhere", NOBODY, 0o700)
        nobody_default.symlink_to(target)
        os.lchown(nobody_default, ATTACKER, ATTACKER)
        expected = f"{nobody_default} is a symbolic link owned by uid {ATTACKER}"
    p = serve("--models", str(make_repository(tmp_path / "repo", digits=False)),
              user=as_nobody())
    assert p.returncode == 2, p.stderr
    assert expected in p.stderr and "refusing to listen" in p.stderr, p.stderr


def test_the_daemon_makes_its_default_tmp_folder_private(tmp_path: Path, nobody_default: Path,
                                                         launch_daemon: Launch) -> None:
    repo = make_repository(tmp_path / "repo", digits=False)
    d = launch_daemon(tmp_path, f'[server]\nsocket = ""\n[models]\nrepository = "{repo}"\n'
                                '[scheduler]\ncache_dir = ""\n',
                      wrapper=as_nobody(), env={"XDG_RUNTIME_DIR": "", "RUNTIME_DIRECTORY": ""})
    st = nobody_default.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == NOBODY
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert (nobody_default / "vkserve.sock").is_socket()
    assert f"vkserve: listening on unix {nobody_default}/vkserve.sock" in d.lines, d.lines
    assert d.stop(signal.SIGTERM) == 0


# ------------------------------------------------------------------------------ the clients


def test_clients_refuse_a_socket_in_another_users_folder(tmp_path: Path, impostor) -> None:
    folder = planted(sticky_folder(tmp_path) / "vk", ATTACKER, 0o755)
    path = folder / "vkserve.sock"
    imp = impostor(path)
    with pytest.raises(UnsafeSocketFolder, match="refusing to connect") as err:
        Client.connect(f"unix:{path}")
    assert str(path) in str(err.value) and f"owner uid {ATTACKER}" in str(err.value)

    async def trio_connect() -> None:
        async with AsyncClient.connect(str(path)):
            pass  # pragma: no cover

    with pytest.raises(UnsafeSocketFolder):
        trio.run(trio_connect)
    p = subprocess.run(vkserve_cmd("status", "--socket", str(path)), check=False, cwd=ROOT,
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "refusing to connect" in p.stderr, p.stderr
    assert (imp.connections, imp.received) == (0, b"")


def test_clients_refuse_a_world_writable_folder(tmp_path: Path, impostor) -> None:
    folder = planted(tmp_path / "open", 0, 0o777)
    imp = impostor(folder / "vkserve.sock")
    with pytest.raises(UnsafeSocketFolder, match="writable by group or others"):
        Client.connect(f"unix:{folder}/vkserve.sock")
    assert imp.connections == 0


def test_a_client_without_xdg_runtime_dir_refuses_a_planted_default(nobody_default: Path,
                                                                    impostor) -> None:
    """`nobody` runs `vkserve status` with no socket given: the first candidate is its
    /tmp/vkserve-65534/vkserve.sock, planted here by another user."""
    planted(nobody_default, ATTACKER, 0o755)
    imp = impostor(nobody_default / "vkserve.sock")
    p = subprocess.run([*as_nobody(), *vkserve_cmd("status")], check=False, cwd=ROOT,
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert f"{nobody_default}/vkserve.sock: refusing to connect" in p.stderr, p.stderr
    assert (imp.connections, imp.received) == (0, b"")


# ------------------------------------------------------------------------------ what passes


def test_pytest_tmp_folders_pass(tmp_path: Path) -> None:
    """Every other test binds its daemons in a tmp folder: 0700, owned by root."""
    st = tmp_path.stat()
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o077
    for for_daemon in (True, False):
        assert socket_folder_problem(tmp_path / "d.sock", for_daemon=for_daemon) is None
        assert socket_folder_problem(tmp_path / "missing" / "d.sock", for_daemon=for_daemon) \
            is None  # the daemon creates it, a client's connect says it is missing


def test_a_service_folder_of_another_user_is_fine_for_clients(tmp_path: Path, impostor) -> None:
    """Like /run/vkserve (systemd's RuntimeDirectory=, 0750, owned by the daemon's user) in
    the root-owned /run: a client of any user may connect; only its owner may listen there."""
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    folder = planted(run / "vkserve", ATTACKER, 0o750)
    imp = impostor(folder / "vkserve.sock")
    Client.connect(f"unix:{folder}/vkserve.sock").close()
    assert socket_folder_problem(folder / "vkserve.sock", for_daemon=True) is not None
    deadline = 50
    while imp.connections == 0 and deadline:
        threading.Event().wait(0.05)
        deadline -= 1
    assert imp.connections == 1


def test_a_client_of_the_socket_activation_path() -> None:
    """/run (root, 0755) holds systemd's /run/vkserve.sock: fine for everyone."""
    assert socket_folder_problem("/run/vkserve.sock", for_daemon=False) is None
