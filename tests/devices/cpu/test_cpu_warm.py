"""`compile_kernels` (the daemon's start, `vkserve cache warm`) leaves nothing for a model's
first request to compile: a CPU job of the example model, its input read-only as the daemon's
are (a view of the request or of shared memory), adds no kernel specialization afterwards.
It runs in a child so no earlier test has compiled that specialization in this process."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO
from vkserve.devices.cpu.warm import compile_kernels, kernels_cached

_CHILD = """
import json, numba, numpy as np
from pathlib import Path
from vkserve.devices.cpu.warm import KERNEL_MODULES, compile_kernels
from vkserve.devices.cpu.executor import Plan
from vkserve.models.graph import load_model

def signatures():
    return {f"{m.__name__}.{k}": [str(s) for s in v.signatures]
            for m in KERNEL_MODULES
            for k, v in vars(m).items() if isinstance(v, numba.core.registry.CPUDispatcher)}

compile_kernels()
before = signatures()
folder = Path("vkserve/examples/digits")
x = np.random.default_rng(1).standard_normal((1, 8, 8)).astype(np.float32)
x.flags.writeable = False
Plan(load_model(folder / "model.param", folder / "model.bin")).run({"data": x})
after = signatures()
print(json.dumps({k: v for k, v in after.items() if v != before.get(k)}))
"""


def test_a_read_only_input_runs_on_kernels_compiled_at_start() -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    added = json.loads(done.stdout.strip().splitlines()[-1])
    assert added == {}, f"compiled at the first request, not at start: {added}"


def test_the_stamp_says_whether_these_kernels_are_cached_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``compile_kernels`` leaves a stamp beside numba's cache (its folder: ``NUMBA_CACHE_DIR``)
    that ``kernels_cached`` checks; another stamp (other sources, numba or CPU) is a miss; a
    folder it cannot write to costs a warning, never the start."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert not kernels_cached()
    compile_kernels()
    stamp = tmp_path / "vkserve-kernels.stamp"
    assert kernels_cached() and len(stamp.read_text()) == 64
    stamp.write_text("0" * 64)
    assert not kernels_cached()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "missing"))
    with caplog.at_level(logging.WARNING, "vkserve.devices.cpu.warm"):
        compile_kernels()
    assert f"cannot write {tmp_path}/missing/vkserve-kernels.stamp (No such file or directory" in caplog.text
    assert not kernels_cached()
