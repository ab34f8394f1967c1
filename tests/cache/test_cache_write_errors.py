"""Issue 11, item 3: a pipeline cache that cannot be written never makes a model unservable.

Every file-system error of the cache (creating its folder, taking the lock, reading, saving,
reading the tuning file beside it) is one WARNING naming the path and the errno, and a count in
``CacheStats`` / ``vkserve_pipeline_cache_errors_total{device,op}``; the cache then works in
memory and a later save, once the fault is fixed, writes the file.

First on a PipelineCache over lavapipe, then against real `vkserve serve` subprocesses with the
three faults of the issue: the cache folder on a full disk (a 32 KiB tmpfs, mounted here: the
tests run as root), the cache file replaced by a directory, and ``$XDG_CACHE_HOME/vkserve`` a
regular file.
"""

from __future__ import annotations

import errno
import logging
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import DIGITS, Daemon, Launch, make_repository
from vkserve.cache import persist
from vkserve.cache.cache_file import DeviceIdentity, decode_cache_file
from vkserve.cache.pipeline_cache import PipelineCache, PipelineRequest
from vkserve.client import Client
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.context import VulkanContext
from vkserve.devices.vulkan.pipeline_backend import OPTION_BITS, VulkanPipelineBackend
from vkserve.devices.vulkan.shader_registry import builtin_shader

RELU = PipelineRequest(builtin_shader("relu"), OPTION_BITS[Precision.FP32])


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """``mount(folder, size)``: a tmpfs of ``size`` at ``folder``; unmounted at teardown
    (lazily: a daemon killed by a failing test may still hold a file there)."""
    mounted: list[Path] = []

    def mount(folder: Path, size: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},nr_inodes=64,mode=0755", "tmpfs",
                        str(folder)], check=True)
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> None:
    """Fill the file system of ``folder`` to the last byte (unbuffered writes: page by page,
    then byte by byte, until ENOSPC)."""
    with open(folder / "filler", "wb", buffering=0) as f:
        for chunk in (b"\0" * 4096, b"\0"):
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC


def cache_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def open_cache(ctx: VulkanContext, directory: Path) -> PipelineCache:
    return PipelineCache(VulkanPipelineBackend(ctx), directory)


def cache_file_of(caps: DeviceCaps, directory: Path) -> Path:
    return directory / DeviceIdentity.from_caps(caps).file_name()


# ------------------------------------------------------------------------------ PipelineCache


def test_full_disk_save_is_a_warning_and_a_later_save_writes(
        tmp_path: Path, tmpfs: Callable[[Path, str], Path], vulkan_ctx: VulkanContext,
        vulkan_caps: DeviceCaps, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmpfs(tmp_path / "cache", "32k")
    cache = open_cache(vulkan_ctx, folder)
    try:
        fill(folder)
        assert cache.pipeline(RELU) is not None  # the cache serves from memory
        with caplog.at_level(logging.WARNING):
            assert cache.save() is False  # no exception
        path = cache_file_of(vulkan_caps, folder)
        [message] = [m for m in cache_warnings(caplog) if "cannot save" in m]
        assert str(path) in message and "errno 28" in message and "ENOSPC" in message
        assert cache.stats.errors() == {"create": 0, "lock": 0, "load": 0, "save": 1,
                                        "tuning": 0, "driver_bypass": 0}
        assert not path.exists()
        assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # temp removed
        (folder / "filler").unlink()
        assert cache.save() is True  # the fault fixed: the next save writes the file
        contents = decode_cache_file(path.read_bytes(), DeviceIdentity.from_caps(vulkan_caps))
        assert RELU.spirv_key in contents.spirv
    finally:
        cache.close()


def test_a_directory_at_the_cache_path(tmp_path: Path, vulkan_ctx: VulkanContext,
                                       vulkan_caps: DeviceCaps,
                                       caplog: pytest.LogCaptureFixture) -> None:
    path = cache_file_of(vulkan_caps, tmp_path)
    path.mkdir()
    with caplog.at_level(logging.WARNING):
        cache = open_cache(vulkan_ctx, tmp_path)
        try:
            cache.pipeline(RELU)
            assert cache.save() is False
        finally:
            cache.close()
    [message] = [m for m in cache_warnings(caplog) if "cannot save" in m]
    assert str(path) in message and "errno 21" in message and "EISDIR" in message
    assert cache.stats.save_errors == 1 and cache.stats.create_errors == 0
    path.rmdir()
    cache = open_cache(vulkan_ctx, tmp_path)  # in a fresh cache (nothing compiled) the file
    try:  # is not due; compile, and it is written
        cache.pipeline(RELU)
        assert cache.save() is True and path.is_file()
    finally:
        cache.close()


def test_a_file_where_the_folder_should_be(tmp_path: Path, vulkan_ctx: VulkanContext,
                                           vulkan_caps: DeviceCaps,
                                           caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "vkserve"
    folder.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        cache = open_cache(vulkan_ctx, folder)
    try:
        [message] = [m for m in cache_warnings(caplog) if "cannot create" in m]
        assert str(folder) in message and "errno 17" in message and "EEXIST" in message
        assert cache.stats.create_errors == 1 and not cache.writable
        cache.pipeline(RELU)
        assert cache.save() is False  # tries the folder again: still a file
        assert cache.stats.create_errors == 2
        folder.unlink()
        assert cache.save() is True  # fixed: the folder, the lock and the file are made
        assert cache.writable and cache_file_of(vulkan_caps, folder).is_file()
    finally:
        cache.close()


def test_lock_and_read_errors_are_counted(tmp_path: Path, vulkan_ctx: VulkanContext,
                                          vulkan_caps: DeviceCaps,
                                          monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    path = cache_file_of(vulkan_caps, tmp_path)
    lock = path.with_name(path.name + ".lock")
    lock.mkdir()  # opening it O_RDWR fails: EISDIR
    path.write_bytes(b"anything")

    def failing_read(f: object, max_bytes: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(persist, "_read_bounded", failing_read)
    with caplog.at_level(logging.WARNING):
        cache = open_cache(vulkan_ctx, tmp_path)
    try:
        assert cache.stats.lock_errors == 1 and cache.stats.load_errors == 1
        warnings = cache_warnings(caplog)
        assert any(str(lock) in m and "errno 21" in m for m in warnings), warnings
        assert any(str(path) in m and "errno 5" in m for m in warnings), warnings
        cache.pipeline(RELU)
        monkeypatch.undo()
        lock.rmdir()
        assert cache.save() is True  # the lock is taken now: the bad file is replaced
        assert cache.stats.lock_errors == 1
    finally:
        cache.close()


def test_a_corrupt_file_is_still_a_miss_not_an_error(tmp_path: Path, vulkan_ctx: VulkanContext,
                                                     vulkan_caps: DeviceCaps) -> None:
    path = cache_file_of(vulkan_caps, tmp_path)
    path.write_bytes(b"VKSRVPC\0" + b"\xff" * 100)
    cache = open_cache(vulkan_ctx, tmp_path)
    try:
        assert sum(cache.stats.errors().values()) == 0
        cache.pipeline(RELU)
        assert cache.save() is True
    finally:
        cache.close()


# ------------------------------------------------------------------------------ real daemons


def scrape(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def cache_errors(d: Daemon, op: str) -> float:
    return scrape(d).get(("vkserve_pipeline_cache_errors_total",
                          (("device", "vulkan:0"), ("op", op))), 0.0)


def assert_serves_on_vulkan(d: Daemon) -> None:
    """digits is ready on device 0 (the Vulkan device) and answers correctly there."""
    with Client.connect(f"unix:{d.socket}") as c:
        [digits] = [m for m in c.models() if m["name"] == "digits"]
        assert digits["state"] == "ready", digits
        placements = {p["device"]: p for p in digits["placements"]}
        assert placements[0]["state"] == "ready" and placements[0]["error"] is None, digits
        status = c.status()
        [vk] = [dev for dev in status["devices"] if dev["index"] == 0]
        assert vk["kind"] == "vulkan" and "digits" in vk["models"], vk
        x = np.load(DIGITS / "samples" / "3.npy")
        assert int(c.infer("digits", {"data": x})["prob"].argmax()) == 3
    s = scrape(d)
    assert s[("vkserve_requests_total",
              (("device", "vulkan:0"), ("model", "digits"), ("outcome", "ok")))] == 1


def start(launch: Launch, work: Path, cache_line: str, env: dict[str, str] | None = None
          ) -> Daemon:
    repo = make_repository(work / "repo", slow=False)
    return launch(work, f"""
[server]
socket = "{work}/d.sock"
[models]
repository = "{repo}"
[scheduler]
{cache_line}
""", env=env)


def test_daemon_on_a_full_disk(tmp_path: Path, tmpfs: Callable[[Path, str], Path],
                               launch_daemon: Launch, vulkan_caps: DeviceCaps) -> None:
    folder = tmpfs(tmp_path / "cache", "32k")
    fill(folder)
    d = start(launch_daemon, tmp_path, f'cache_dir = "{folder}"')
    assert_serves_on_vulkan(d)
    path = cache_file_of(vulkan_caps, folder)
    log = d.log_text()
    assert f"pipeline cache {path}: cannot save: No space left on device (errno 28, ENOSPC)" \
        in log, log[-3000:]
    assert "WARNING" in next(ln for ln in log.splitlines() if "cannot save" in ln)
    assert "load failed" not in log
    assert cache_errors(d, "save") >= 1 and cache_errors(d, "create") == 0
    # room again: the save at shutdown writes the file
    subprocess.run(["mount", "-o", "remount,size=64m", str(folder)], check=True)
    assert d.stop() == 0
    assert path.is_file() and decode_cache_file(path.read_bytes(),
                                                DeviceIdentity.from_caps(vulkan_caps)).spirv


def test_daemon_with_a_directory_at_the_cache_file(tmp_path: Path, launch_daemon: Launch,
                                                   vulkan_caps: DeviceCaps) -> None:
    folder = tmp_path / "cache"
    path = cache_file_of(vulkan_caps, folder)
    path.mkdir(parents=True)
    d = start(launch_daemon, tmp_path, f'cache_dir = "{folder}"')
    assert_serves_on_vulkan(d)
    log = d.log_text()
    assert f"pipeline cache {path}: cannot save: Is a directory (errno 21, EISDIR)" in log, \
        log[-3000:]
    assert "load failed" not in log
    assert cache_errors(d, "save") >= 1
    path.rmdir()  # fixed: the save at shutdown writes the file
    assert d.stop() == 0
    assert path.is_file()


def test_daemon_with_a_file_at_the_xdg_cache_folder(tmp_path: Path, launch_daemon: Launch,
                                                    vulkan_caps: DeviceCaps) -> None:
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    (xdg / "vkserve").write_text("a file where the cache folder goes\n")
    # no cache_dir in the config: the default, $XDG_CACHE_HOME/vkserve
    d = start(launch_daemon, tmp_path, "", env={"XDG_CACHE_HOME": str(xdg)})
    assert_serves_on_vulkan(d)
    log = d.log_text()
    assert (f"pipeline cache folder {xdg / 'vkserve'}: cannot create: File exists "
            "(errno 17, EEXIST)") in log, log[-3000:]
    assert "load failed" not in log
    assert cache_errors(d, "create") >= 1
    # the tuning file beside the cache cannot be read either: a warning and a count, no more
    assert cache_errors(d, "tuning") >= 1 and "ignoring tuning file" in log
    (xdg / "vkserve").unlink()  # fixed: the save at shutdown creates the folder and the file
    assert d.stop() == 0
    assert cache_file_of(vulkan_caps, xdg / "vkserve").is_file()
    shutil.rmtree(xdg)
