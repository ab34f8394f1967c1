"""deploy/vkserve.service under a real systemd (issue 10): the unit keeps the GPU.

Debian's systemd boots as PID 1 of new PID, mount, cgroup, UTS and IPC namespaces
(`unshare ... env container=other /lib/systemd/systemd --system`, i.e. a container). Its root
is an overlay: the host's / below, a tmpfs of the namespace above, so everything the boot
(systemd-tmpfiles, journald, sysusers) and deploy/install.sh write (the vkserve user in
/etc/passwd, /opt/vkserve, /etc/vkserve, /etc/systemd/system, /var/lib/vkserve, pip's cache)
vanishes with the namespace. /tmp, /var/tmp and /run are fresh tmpfs, the checkout's parent
folder (this checkout and the shared folders beside it) is hidden behind an empty tmpfs (install.sh gets a copy of the
checkout in /usr/local/src/vkserve), /proc/sys is read-only (no sysctl reaches the host), and
the namespace gets its own cgroup subtree, removed at teardown. The network namespace is the
host's: pip downloads the dependencies, and the test reads the daemon's metrics on a free port.

Then, with install.sh's unit as shipped: the daemon reaches READY, a digits job runs on the
Vulkan device (lavapipe) with the answer 3, `systemctl reload` rescans the models, `systemctl
stop` drains and exits 0, `systemctl start` is READY again; as a control, the same unit with
MemoryDenyWriteExecute=yes (what issue 10 removed) does not start, saying why in one line.

Needs root (CI runs the tests as root); the test command installs Debian's systemd package.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO

SYSTEMD = "/lib/systemd/systemd"
VKSERVE = "/opt/vkserve/venv/bin/vkserve"
SOCKET = "/run/vkserve/vkserve.sock"
SAMPLE = "/var/lib/vkserve/models/digits/samples/3.npy"
SRC = "/usr/local/src/vkserve"  # the checkout's copy inside the namespace
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host variables passed to commands run inside (the rest of the environment is not: a pyenv or
# virtualenv PATH must not pick install.sh's python3); pip's network settings pass through.
PASS_ENV = re.compile(r"^(PIP_\w+|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY|SSL_CERT_\w+|"
                      r"REQUESTS_CA_BUNDLE|LANG)$")

# Runs as PID 1 of the new namespaces ($1: the checkout); ends by exec'ing systemd.
BOOT_SH = r"""
set -eu
src=$1
cd "$src"   # keeps the checkout reachable (for the copy below) once /tmp is over-mounted
mount --make-rprivate /
# The namespace's scratch space: a tmpfs on /tmp, seen by this namespace only.
mount -t tmpfs -o mode=0700 vkserve-test /tmp
mkdir /tmp/upper /tmp/work /tmp/root
R=/tmp/root
mount -t overlay vkserve-test-root -o lowerdir=/,upperdir=/tmp/upper,workdir=/tmp/work $R
# systemd-tmpfiles --remove empties /tmp and /var/tmp at boot: they, and /run, are fresh tmpfs.
for d in tmp var/tmp run; do mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $R/$d; done
chmod 0755 $R/run
# Nothing beside the checkout (its parent folder: the clone, shared folders) is reachable;
# install.sh gets a copy.
parent=$(dirname "$src")
[ "$parent" = / ] || [ ! -d "$R$parent" ] || mount -t tmpfs -o mode=0755 tmpfs "$R$parent"
mkdir -p $R$SRC_DIR
tar -C . --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=.pytest_cache -cf - . | tar -C $R$SRC_DIR -xf -
mount -t proc proc $R/proc
for p in sys sysrq-trigger; do   # read-only, as systemd-nspawn does: no sysctl reaches the host
  [ -e $R/proc/$p ] || continue
  mount --bind $R/proc/$p $R/proc/$p
  mount -o remount,bind,ro $R/proc/$p
done
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs $R/sys
# The cgroup hierarchies, mounted inside the cgroup namespace: rooted at this test's subtree.
grep -E ' - cgroup2? ' /proc/self/mountinfo > /tmp/cgroup-mounts
unified=$(grep -c ' /sys/fs/cgroup ' /tmp/cgroup-mounts || true)  # 1: cgroup v2 only
[ "$unified" = 1 ] || mount -t tmpfs -o mode=0755,nosuid,nodev,noexec cgroup $R/sys/fs/cgroup
while read -r _ _ _ _ mp _ rest; do
  fstype=${rest#*- }; fstype=${fstype%% *}
  opts=$(echo "${rest##* }" | tr , '\n' | grep -vxE 'rw|ro' | paste -sd, -)
  mkdir -p "$R$mp"
  if [ "$fstype" = cgroup2 ]; then mount -t cgroup2 cgroup2 "$R$mp"
  else mount -t cgroup -o "$opts" cgroup "$R$mp"; fi
done < /tmp/cgroup-mounts
[ "$unified" = 1 ] || mount -o remount,ro $R/sys/fs/cgroup
# A minimal /dev (lavapipe needs no device node).
mount -t tmpfs -o mode=0755,nosuid dev $R/dev
for n in null zero full random urandom tty; do touch $R/dev/$n; mount --bind /dev/$n $R/dev/$n; done
mkdir $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts $R/dev/pts
ln -s pts/ptmx $R/dev/ptmx
mount -t tmpfs -o mode=1777,nosuid,nodev shm $R/dev/shm
ln -s /proc/self/fd $R/dev/fd
echo "# vkserve test namespace: nothing to mount" > $R/etc/fstab
# Boot only what the unit needs: sysinit.target and sockets.target (journald), no timers and
# none of the host's enabled services.
mkdir -p $R/etc/systemd/system
cat > $R/etc/systemd/system/vkserve-test.target <<'EOF'
[Unit]
Description=vkserve test boot (sysinit and sockets only)
Requires=sysinit.target sockets.target
After=sysinit.target sockets.target
AllowIsolate=yes
EOF
for u in systemd-timesyncd.service systemd-pstore.service; do
  ln -sf /dev/null $R/etc/systemd/system/$u
done
cd $R
mkdir .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
cd /
exec setpriv --bounding-set -sys_module,-sys_time,-sys_rawio \
  env -i container=other PATH=$PATH_DIRS $SYSTEMD_BIN --system --unit=vkserve-test.target
"""

# Stage 1, in the host's namespaces: join this test's cgroups ("$@"), then unshare. pdeathsig and
# --kill-child end the namespace should pytest itself die without its teardown.
START_SH = r"""
for procs in "$@"; do echo $$ > "$procs"; done
exec setpriv --pdeathsig KILL -- unshare --pid --mount --cgroup --uts --ipc --fork \
  --kill-child=KILL --mount-proc sh "$BOOT_SH" "$SRC_CHECKOUT"
"""


def _make_cgroups(name: str, dirs: list[Path]) -> None:
    """One new child cgroup of this process's cgroup in each mounted hierarchy (v1 and v2),
    appended to `dirs` as made."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, post = line.split(" - ", 1)
        fields, (fstype, _source, opts) = pre.split(), post.split()
        if fstype in ("cgroup", "cgroup2"):
            mounts.append((fields[4], fields[3], fstype, set(opts.split(","))))
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for mountpoint, root, fstype, opts in mounts:
            if (fstype == "cgroup2" and not controllers) or (
                    fstype == "cgroup" and controllers and set(controllers.split(",")) <= opts):
                rel = path[len(root):] if root != "/" and path.startswith(root) else path
                parent = Path(mountpoint + rel)
                _remove_cgroups(_stale_cgroups(parent), timeout=0)
                child = parent / name
                child.mkdir()
                dirs.append(child)
                if "cpuset" in opts:  # a v1 cpuset cgroup takes no task before cpus and mems
                    for key in ("cpuset.cpus", "cpuset.mems"):
                        (child / key).write_text((parent / key).read_text())


def _stale_cgroups(parent: Path) -> list[Path]:
    """Subtrees left by a run killed before its teardown (its processes died with it)."""
    stale = []
    for child in parent.glob("vkserve-test-*-*"):
        pid = child.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.append(child)
    return stale


def _remove_cgroups(dirs: list[Path], timeout: float = 15) -> list[str]:
    """rmdir the test's cgroup subtrees bottom-up (systemd made init.scope, system.slice, ...)."""
    left = []
    for top in dirs:
        deadline = time.monotonic() + timeout
        while top.exists():
            try:
                for here, subdirs, _files in os.walk(top, topdown=False):
                    for sub in subdirs:
                        os.rmdir(os.path.join(here, sub))
                os.rmdir(top)
            except OSError as exc:
                if time.monotonic() >= deadline:
                    left.append(f"{top}: {exc}")
                    break
                time.sleep(0.2)
    return left


class Namespace:
    """The booted systemd: `nsenter -t PID1 -m -p` runs commands inside its namespaces."""

    def __init__(self, pid1: int, log: Path):
        self.pid1 = pid1
        self.log = log
        self.env = [f"{k}={v}" for k, v in os.environ.items() if PASS_ENV.match(k)]
        self.env += [f"PATH={PATH}", "HOME=/root"]

    def exec(self, *argv: str, input: str | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = ["nsenter", "-t", str(self.pid1), "-m", "-p", "--", "env", "-i", *self.env, *argv]
        return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def run(self, *argv: str, input: str | None = None, timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """`argv` inside; a failure (check) or a timeout fails the test with the journal."""
        try:
            out = self.exec(*argv, input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(argv)}: no answer in {timeout} s\n{self.diagnostics()}")
        if check and out.returncode != 0:
            pytest.fail(f"{' '.join(argv)}: exit {out.returncode}\nstdout: {out.stdout[-3000:]}\n"
                        f"stderr: {out.stderr[-3000:]}\n{self.diagnostics()}")
        return out

    def systemctl(self, *args: str, check: bool = True, timeout: float = 90) -> str:
        return self.run("systemctl", "--no-pager", *args, check=check, timeout=timeout).stdout.strip()

    def show(self, prop: str, unit: str = "vkserve.service") -> str:
        return self.systemctl("show", "--value", "-p", prop, unit)

    def write(self, path: str, text: str) -> None:
        self.run("sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path, input=text)

    def journal(self, *match: str, lines: int = 60) -> str:
        out = self.run("journalctl", "--no-pager", "-o", "short-precise", "-n", str(lines),
                       *(match or ("-u", "vkserve.service")), check=False, timeout=30)
        return out.stdout + out.stderr

    def diagnostics(self) -> str:
        """systemctl status, the unit's journal tail and systemd's console, for failure messages."""
        try:
            status = self.exec("systemctl", "--no-pager", "status", "vkserve.service",
                               timeout=20).stdout
            journal = self.exec("journalctl", "--no-pager", "-o", "short-precise", "-n", "60",
                                "-u", "vkserve.service", timeout=20).stdout
        except Exception as exc:  # noqa: BLE001 - diagnostics must not hide the failure
            status, journal = "", f"(journal unreadable: {exc})"
        boot = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return (f"--- systemctl status vkserve ---\n{status}\n--- journalctl -u vkserve (tail) ---\n"
                f"{journal}\n--- systemd's console (tail) ---\n{boot}")

    def wait_for(self, what: str, check: Callable[[], object], timeout: float = 60) -> object:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what}\n{self.diagnostics()}")
            time.sleep(0.25)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


@pytest.fixture
def booted_systemd(tmp_path) -> Iterator[Namespace]:
    if os.geteuid() != 0:
        pytest.fail("tests/deploy/test_systemd_real.py boots systemd in new namespaces and needs "
                    "root (CI runs the tests as root)")
    missing = [tool for tool in ("unshare", "nsenter", "setpriv", "pivot_root", "tar")
               if shutil.which(tool) is None]
    assert not missing and Path(SYSTEMD).exists(), (
        f"missing {missing or SYSTEMD}: the test command installs Debian's systemd package")
    boot_sh = tmp_path / "boot.sh"
    boot_sh.write_text(BOOT_SH)
    log = tmp_path / "systemd-console.log"
    cgroups: list[Path] = []
    proc = None
    try:
        _make_cgroups(f"vkserve-test-{os.getpid()}-{secrets.token_hex(3)}", cgroups)
        env = {"PATH": PATH, "BOOT_SH": str(boot_sh), "SRC_CHECKOUT": str(REPO),
               "SRC_DIR": SRC, "PATH_DIRS": PATH, "SYSTEMD_BIN": SYSTEMD}
        with open(log, "wb") as out:
            proc = subprocess.Popen(["sh", "-c", START_SH, "sh",
                                     *(str(d / "cgroup.procs") for d in cgroups)],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env)
        deadline = time.monotonic() + 60
        pid1 = None
        while pid1 is None:
            for child in _children(proc.pid):
                with contextlib.suppress(FileNotFoundError):
                    if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                        pid1 = child
            if pid1 is None:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"systemd did not start in the namespace (exit {proc.poll()}):\n"
                                f"{log.read_text(errors='replace')[-4000:]}")
                time.sleep(0.1)
        ns = Namespace(pid1, log)
        state = ns.wait_for(
            "systemctl is-system-running to say running or degraded",
            lambda: (s := ns.run("systemctl", "is-system-running", check=False).stdout.strip())
            in ("running", "degraded") and s, timeout=90)
        if state == "degraded":
            print(ns.systemctl("list-units", "--failed"))
        yield ns
    finally:
        if proc is not None:
            for pid in _children(proc.pid) or [proc.pid]:
                # The namespace's PID 1: its death kills every process of the namespace.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        left = _remove_cgroups(cgroups)
        assert not left, f"cgroups left on the host: {left}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of the Prometheus text `text`, None when absent."""
    for line in text.splitlines():
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if m and m.group(1) == name:
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                return float(m.group(3))
    return None


def test_unit_serves_on_vulkan_under_real_systemd(booted_systemd: Namespace) -> None:
    ns = booted_systemd
    port = _free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    config = (REPO / "deploy" / "vkserve.toml").read_text()
    assert 'listen = "127.0.0.1:9464"' in config
    # Kept by install.sh (it installs the shipped file only where none is): the shipped config
    # with a free metrics port, the network namespace being the host's.
    ns.write("/etc/vkserve/vkserve.toml",
             config.replace('listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{port}"'))

    # install.sh as documented (`bash deploy/install.sh`), from the checkout's copy: the user,
    # the venv (pip install from the network), the model repository, enable --now.
    install = ns.run("bash", f"{SRC}/deploy/install.sh", timeout=300, check=False)
    assert install.returncode == 0, (
        f"install.sh failed ({install.returncode}):\n{install.stdout[-3000:]}\n"
        f"{install.stderr[-3000:]}\n{ns.diagnostics()}")
    assert ns.systemctl("is-enabled", "vkserve.service") == "enabled"
    assert ns.systemctl("is-active", "vkserve.service", check=False) == "active", ns.diagnostics()

    # The unit as shipped: no MemoryDenyWriteExecute=, the rest of the hardening in force.
    for prop, want in [("MemoryDenyWriteExecute", "no"), ("ProtectSystem", "strict"),
                       ("NoNewPrivileges", "yes"), ("PrivateTmp", "yes"), ("User", "vkserve"),
                       ("DevicePolicy", "closed"), ("Type", "notify")]:
        assert ns.show(prop) == want, f"{prop}={ns.show(prop)}, expected {want}"

    # systemctl stop: SIGTERM, the drain, exit 0.
    pid = ns.show("MainPID")
    ns.systemctl("stop", "vkserve.service")
    assert ns.systemctl("is-active", "vkserve.service", check=False) == "inactive", ns.diagnostics()
    assert (ns.show("Result"), ns.show("ExecMainCode"), ns.show("ExecMainStatus")) == (
        "success", "1", "0"), f"not a clean exit\n{ns.diagnostics()}"
    ns.wait_for("the daemon's drain and stop messages in the journal",
                lambda: all(s in ns.journal(f"_PID={pid}", lines=200)
                            for s in ("draining", "vkserve: stopped")), timeout=20)

    # systemctl start: Type=notify, so it returns once the daemon said READY=1.
    ns.systemctl("start", "vkserve.service")
    assert ns.systemctl("is-active", "vkserve.service", check=False) == "active", ns.diagnostics()
    status_text = ns.show("StatusText")
    assert status_text.startswith(f"serving on unix:{SOCKET}") and "digits (ready)" in status_text, (
        f"StatusText={status_text!r}\n{ns.diagnostics()}")

    # A job through the installed client: answered 3, run on the Vulkan device.
    infer = ns.run(VKSERVE, "infer", "digits", "--input", f"data={SAMPLE}", "--socket", SOCKET,
                   "--json")
    answer = json.loads(infer.stdout)
    assert answer["outputs"]["prob"]["class"] == 3, answer
    status = json.loads(ns.run(VKSERVE, "status", "--json", "--socket", SOCKET).stdout)
    gpus = [d for d in status["devices"] if d["kind"] == "vulkan"]
    assert gpus, (f"no Vulkan device inside the unit (served on the CPU only): "
                  f"{[d['name'] for d in status['devices']]}\n{ns.diagnostics()}")
    gpu = gpus[0]
    assert gpu["healthy"] and "digits" in gpu["models"] and gpu["completed"] >= 1, gpu
    assert gpu["device"] == f"vulkan:{gpu['index']}" and gpu["device"] in status_text, (gpu, status_text)
    assert all(d["completed"] == 0 for d in status["devices"] if d["kind"] == "cpu"), status
    metrics = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    label = gpu["device"]
    assert _metric(metrics, "vkserve_requests_total", device=label, model="digits",
                   outcome="ok") == 1.0, metrics
    assert _metric(metrics, "vkserve_device_healthy", device=label) == 1.0, metrics

    # systemctl reload (SIGHUP): the daemon rescans /var/lib/vkserve/models and keeps serving.
    pid = ns.show("MainPID")
    ns.run("cp", "-a", "/var/lib/vkserve/models/digits", "/var/lib/vkserve/models/digits2")
    ns.systemctl("reload", "vkserve.service")

    def digits2_ready() -> bool:
        out = ns.run(VKSERVE, "models", "--json", "--socket", SOCKET, check=False)
        models = json.loads(out.stdout) if out.returncode == 0 else []
        return any(m.get("name") == "digits2" and m.get("state") == "ready" for m in models)

    ns.wait_for("digits2 ready after systemctl reload", digits2_ready, timeout=60)
    assert ns.systemctl("is-active", "vkserve.service", check=False) == "active", ns.diagnostics()
    assert ns.show("MainPID") == pid, "reload restarted the daemon"
    answer = json.loads(ns.run(VKSERVE, "infer", "digits2", "--input", f"data={SAMPLE}",
                               "--socket", SOCKET, "--json").stdout)
    assert answer["outputs"]["prob"]["class"] == 3, answer
    metrics = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    assert _metric(metrics, "vkserve_requests_total", device=label, model="digits2",
                   outcome="ok") == 1.0, metrics

    ns.systemctl("stop", "vkserve.service")
    assert ns.systemctl("is-active", "vkserve.service", check=False) == "inactive", ns.diagnostics()
    assert (ns.show("Result"), ns.show("ExecMainStatus")) == ("success", "0"), ns.diagnostics()

    # Control: the same unit with MemoryDenyWriteExecute=yes (removed by issue 10). Neither engine
    # can run then (the Vulkan binding's cffi callbacks, the CPU kernels' numba JIT): the daemon
    # exits 1 at start with one line that says why, not a traceback.
    ns.write("/etc/systemd/system/vkserve.service.d/mdwe.conf",
             "[Service]\nMemoryDenyWriteExecute=yes\n")
    ns.systemctl("daemon-reload")
    ns.systemctl("start", "vkserve.service", check=False)
    ns.wait_for("the executable-memory error in the journal",
                lambda: "MemoryDenyWriteExecute=yes prevents it" in ns.journal(lines=200), timeout=30)
    assert ns.systemctl("is-active", "vkserve.service", check=False) != "active", ns.diagnostics()
    last_start = ns.journal(lines=200).rpartition("Starting vkserve.service")[2]
    assert "Traceback" not in last_start, last_start
    ns.systemctl("stop", "vkserve.service", check=False)
