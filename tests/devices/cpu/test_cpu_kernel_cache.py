"""The CPU kernels' cache folder: named by the kernel modules' sources, so a changed helper
module (which numba's own check misses: it looks at the kernel's file alone) starts a new
folder, and the old folders are removed once the new kernels are in."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO
from vkserve.devices.cpu import warm
from vkserve.devices.cpu.kernel_cache import default_numba_dir, sources_key, stale_folders

_KEY = "from vkserve.devices.cpu.kernel_cache import default_numba_dir; print(default_numba_dir())"


def _folder_of(package_root: Path, cache_home: Path) -> Path:
    """``default_numba_dir`` as a process importing vkserve from ``package_root`` sees it."""
    env = {**os.environ, "PYTHONPATH": str(package_root), "XDG_CACHE_HOME": str(cache_home)}
    env.pop("CACHE_DIRECTORY", None)
    done = subprocess.run([sys.executable, "-c", _KEY], capture_output=True, text=True, env=env,
                          cwd=package_root, timeout=60, check=True)
    return Path(done.stdout.strip())


def test_the_folder_follows_every_kernel_module_not_its_time(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "vkserve", copy / "vkserve", ignore=shutil.ignore_patterns("__pycache__"))
    home = tmp_path / "cache"
    ours = _folder_of(copy, home)
    assert ours == home / "vkserve" / "numba" / sources_key()  # the same sources, the same key
    helper = copy / "vkserve" / "devices" / "cpu" / "jit" / "epilogue.py"
    os.utime(helper, (1, 1))  # a reinstall: other times, same contents
    assert _folder_of(copy, home) == ours
    helper.write_text(helper.read_text() + "\n# a changed helper that kernels of other modules inline\n")
    changed = _folder_of(copy, home)
    assert changed.parent == ours.parent and changed != ours


def test_other_sources_folders_are_removed_once_these_kernels_are_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    ours = default_numba_dir()
    root = ours.parent
    (ours / "jit_0123").mkdir(parents=True)
    (ours / "jit_0123" / "conv.conv_gemm-1.py311.nbi").write_bytes(b"ours")
    older = root / "00112233aabbccdd"
    (older / "jit_4567").mkdir(parents=True)
    (older / "jit_4567" / "conv.conv_gemm-1.py311.nbi").write_bytes(b"older")
    legacy = root / "jit_89ab"  # before the key folders: numba's folders in numba/ itself
    legacy.mkdir()
    (root / "vkserve-kernels.stamp").write_text("0" * 64)
    (root / "notes.txt").write_text("not ours to remove")
    assert stale_folders(ours) == [older, legacy, root / "vkserve-kernels.stamp"]
    assert stale_folders(tmp_path / "explicit") == []  # an explicit NUMBA_CACHE_DIR: its owner's

    with caplog.at_level(logging.INFO, "vkserve.devices.cpu.warm"):
        warm._remove_stale(ours)
    assert sorted(p.name for p in root.iterdir()) == [ours.name, "notes.txt"]
    assert (ours / "jit_0123" / "conv.conv_gemm-1.py311.nbi").read_bytes() == b"ours"
    assert (f"removed what other versions of the kernels left in {root}: "
            f"00112233aabbccdd, jit_89ab, vkserve-kernels.stamp") in caplog.text
