import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, Launch, running_daemon
from vkserve.devices.capabilities import DeviceCaps, DeviceKind
from vkserve.devices.cpu.kernel_cache import default_numba_dir
from vkserve.devices.discovery import discover_devices


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist the controller compiles the CPU kernels into numba's cache once, before
    its workers start: each worker's first CPU test, and each daemon it starts (a first start
    compiles them all in a child), would otherwise compile them again side by side. (Run in one
    process, the suite's first folder, ``tests/cache``, compiles them through `vkserve cache
    warm`.) Where they are cached already, the child only loads them: a few seconds."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", default=None):
        return
    os.environ.setdefault("NUMBA_CACHE_DIR", str(default_numba_dir()))
    print(f"compiling the CPU kernels into {os.environ['NUMBA_CACHE_DIR']} for the workers", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "vkserve.devices.cpu.compile_child", str(os.getpid())],
                   check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def vulkan_caps() -> DeviceCaps:
    """The first Vulkan device (lavapipe in CI). Its absence is a failure, not a skip:
    the test command installs the driver, so a missing device is a broken environment."""
    gpus = [d for d in discover_devices() if d.kind is DeviceKind.VULKAN]
    assert gpus, "no Vulkan device found: is mesa-vulkan-drivers (lavapipe) installed?"
    return gpus[0]


@pytest.fixture(scope="session")
def vulkan_ctx(vulkan_caps):
    from vkserve.devices.vulkan.context import VulkanContext

    ctx = VulkanContext(vulkan_caps)
    yield ctx
    ctx.destroy()


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory):
    """Pipeline caches and tuning files of this test run (daemons included: subprocesses
    inherit the variable) go to a temporary folder, never the user's ~/.cache. numba's
    compiled CPU kernels stay where vkserve keeps them for this user (numba keys them by source
    and CPU): compiling them all again costs every daemon of a run started alone 1-2 minutes
    (tests that need a cold numba cache set ``NUMBA_CACHE_DIR`` themselves)."""
    os.environ.setdefault("NUMBA_CACHE_DIR", str(default_numba_dir()))
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ.pop("CACHE_DIRECTORY", None)
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


def _daemon_launcher() -> Iterator[Launch]:
    """``launch(workdir, config, **start_daemon_kwargs)`` starts `vkserve serve`
    (tests.support.daemon.running_daemon); at the fixture's teardown every daemon whose exit the
    test has not collected gets SIGTERM and must exit 0, and one that does not stop is killed: no
    process outlives the fixture."""
    with ExitStack() as stack:

        def launch(workdir: Path, config: str, **kwargs: Any) -> Daemon:
            return stack.enter_context(running_daemon(workdir, config, **kwargs))

        yield launch


@pytest.fixture
def launch_daemon() -> Iterator[Launch]:
    """The daemon-launching fixture of a test (see ``_daemon_launcher``)."""
    yield from _daemon_launcher()


@pytest.fixture(scope="module")
def launch_module_daemon() -> Iterator[Launch]:
    """The same, for module-scoped daemon fixtures: the daemons live until the module's end."""
    yield from _daemon_launcher()
