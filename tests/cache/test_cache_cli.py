"""`vkserve cache warm|inspect|clear` as real processes on lavapipe and real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from vkserve.cache.cache_file import HEADER_SIZE, DeviceIdentity
from vkserve.devices.capabilities import DeviceCaps

VKSERVE = Path(sys.executable).with_name("vkserve")
TIMEOUT_S = 60
#: the first `cache warm` of a run may compile every CPU kernel from cold (about 60 s on a
#: 2-core box; the numba cache is shared by the whole test run)
COLD_WARM_TIMEOUT_S = 300
WARM_KEYS = {"device", "file", "pipelines", "glsl_compiles", "spirv_hits", "driver_blob_bytes",
             "seconds"}


def vkserve(*args: str | Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VKSERVE), *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], bytes]:
    """One `vkserve cache warm --json` from cold: its report and the file it wrote."""
    proc = vkserve("cache", "warm", "--cache-dir", tmp_path_factory.mktemp("warm"), "--json",
                   timeout=COLD_WARM_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    reports = json.loads(proc.stdout)
    [report] = [r for r in reports if r["device"] != "cpu"]
    # and the CPU kernels: compiled for this machine, or loaded from numba's cache
    [cpu] = [r for r in reports if r["device"] == "cpu"]
    assert cpu["kernels_compiled"] + cpu["kernels_cached"] > 0 and cpu["cache_dir"] == os.environ["NUMBA_CACHE_DIR"]
    return report, Path(report["file"]).read_bytes()


def test_warm_json_reports_every_builtin_pipeline(warmed: tuple[dict[str, Any], bytes],
                                                  vulkan_caps: DeviceCaps) -> None:
    report, data = warmed
    assert set(report) >= WARM_KEYS
    assert report["device"] == f"vulkan:{vulkan_caps.index}" and report["device_name"] == vulkan_caps.name
    assert Path(report["file"]).name == DeviceIdentity.from_caps(vulkan_caps).file_name()
    # every built-in in every mode (not recounted here: others may be adding shaders)
    modes = len(vulkan_caps.supported_precisions())
    assert report["pipelines"] >= 2 * modes and report["pipelines"] % modes == 0
    assert (report["glsl_compiles"], report["spirv_hits"]) == (report["pipelines"], 0)
    assert report["driver_blob_bytes"] > 0 and report["seconds"] > 0
    assert report["saved"] and report["writer"]
    assert len(data) > HEADER_SIZE


def test_warm_of_a_missing_device_fails_with_a_message(tmp_path: Path) -> None:
    proc = vkserve("cache", "warm", "--cache-dir", tmp_path, "--device", "99")
    assert proc.returncode != 0 and "no Vulkan device 99" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_inspect_a_valid_file(warmed: tuple[dict[str, Any], bytes], tmp_path: Path,
                              vulkan_caps: DeviceCaps) -> None:
    report, data = warmed
    path = tmp_path / "copy.cache"
    path.write_bytes(data)
    proc = vkserve("cache", "inspect", path, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["valid"] is True and info["reason"] is None
    assert info["size"] == len(data) and info["file"] == str(path)
    assert info["driver_blob_bytes"] == report["driver_blob_bytes"]
    assert info["header"]["vendor_id"] == vulkan_caps.vendor_id
    assert info["header"]["vkserve_version_matches"] is True
    assert len(info["entries"]) == report["pipelines"]
    assert {e["shader_id"] for e in info["entries"]} >= {"relu", "clip"}
    text = vkserve("cache", "inspect", path)
    assert text.returncode == 0 and f"{path}: valid" in text.stdout


@pytest.mark.parametrize(("name", "corrupt", "reason"), [
    ("spirv_byte", lambda d: d[:HEADER_SIZE + 10] + bytes([d[HEADER_SIZE + 10] ^ 1])
     + d[HEADER_SIZE + 11:], "SPIR-V section hash mismatch"),
    ("truncated", lambda d: d[:-1], "do not add up to the file size"),
    ("empty", lambda d: b"", "file is empty"),
])
def test_inspect_a_corrupt_file(name: str, corrupt: Callable[[bytes], bytes], reason: str,
                                tmp_path: Path, warmed: tuple[dict[str, Any], bytes]) -> None:
    path = tmp_path / f"{name}.cache"
    path.write_bytes(corrupt(warmed[1]))
    proc = vkserve("cache", "inspect", path, "--json")
    assert proc.returncode == 1, proc.stderr
    info = json.loads(proc.stdout)
    assert info["valid"] is False and reason in info["reason"]
    assert info["driver_blob_bytes"] is None
    text = vkserve("cache", "inspect", path)
    assert text.returncode == 1 and "INVALID: " in text.stdout and reason in text.stdout


def test_inspect_a_missing_file(tmp_path: Path) -> None:
    proc = vkserve("cache", "inspect", tmp_path / "nothing.cache")
    assert proc.returncode != 0 and "cannot read" in proc.stderr


HOLD_LOCK = ("import sys; from vkserve.cache.persist import WriterLock; lock = WriterLock(sys.argv[1]); "
             "print(lock.acquire(), flush=True); sys.stdin.read()")


def test_clear_removes_files_but_keeps_one_in_use(warmed: tuple[dict[str, Any], bytes],
                                                  tmp_path: Path) -> None:
    idle = tmp_path / Path(warmed[0]["file"]).name
    idle.write_bytes(warmed[1])
    busy = tmp_path / "vkserve-1234-5678-0123456789ab.cache"
    busy.write_bytes(warmed[1])
    other = tmp_path / "notes.txt"  # not a cache file: never touched
    other.write_text("keep")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(busy)], cwd=REPO, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "True"
        proc = vkserve("cache", "clear", "--cache-dir", tmp_path)
        assert proc.returncode == 1, proc.stderr  # something was kept
        assert not idle.exists() and busy.exists() and other.exists()
        assert f"in use by a running vkserve, kept: {busy}" in proc.stdout
        assert f"removed {idle}" in proc.stdout
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        assert holder.wait(timeout=TIMEOUT_S) == 0

    proc = vkserve("cache", "clear", "--cache-dir", tmp_path)  # the holder is gone
    assert proc.returncode == 0, proc.stderr
    assert not busy.exists() and other.exists()
    assert f"1 cache file(s) removed from {tmp_path}" in proc.stdout
