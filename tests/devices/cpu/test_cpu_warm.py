"""`compile_kernels` (the daemon's start, `vkserve cache warm`) leaves nothing for a model's
first request to compile: CPU jobs of the example model and of the later layers, inputs
read-only as the daemon's are (a view of the request or of shared memory), add no kernel
specialization afterwards. It runs in a child so no earlier test has compiled that
specialization in this process."""

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
import importlib, json, numba, pkgutil
import numpy as np
from pathlib import Path
import vkserve.devices.cpu.jit as package
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.cpu.warm import KERNEL_MODULES, compile_kernels
from vkserve.models.graph import build_graph, load_model, parse_param_text
from vkserve.models.randinit import random_weights

def signatures():
    return {f"{m.__name__}.{k}": [str(s) for s in v.signatures]
            for m in KERNEL_MODULES
            for k, v in vars(m).items() if isinstance(v, numba.core.registry.CPUDispatcher)}

def read_only(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    x.flags.writeable = False
    return x

compile_kernels()
before = signatures()
folder = Path("vkserve/examples/digits")
Plan(load_model(folder / "model.param", folder / "model.bin")).run({"data": read_only((1, 8, 8))})
layers = parse_param_text('''7767517
15 16
Input data 0 1 data 0=10 1=10 2=6
BatchNorm bn 1 1 data a 0=6
ReLU relu 1 1 a b
Interp up 1 1 b c 0=2 3=16 4=16
Interp cubic 1 1 c d 0=3 3=12 4=12
GELU gelu 1 1 d e
GELU tanh 1 1 e f 0=1
LayerNorm ln 1 1 f g 0=12 1=1e-05
RMSNorm rms 1 1 g h 0=12 1=1e-05
Reshape rows 1 1 h i 0=12 1=72
Gemm linear 1 1 i j 10=4 2=0 3=1 4=0 5=1 6=1 7=72 8=16 9=12
GELU mlp 1 1 j k
MultiHeadAttention attn 1 1 k l 0=16 1=2 2=256
Split pair 1 2 l l1 l2
MatMul scores 2 1 l1 l2 out 0=1
''', "later layers")
for layer, weights in zip(layers, random_weights(layers, 0)):
    layer.weights = weights
Plan(build_graph(layers, "later layers")).run({"data": read_only((6, 10, 10))})
after = signatures()
modules = [importlib.import_module(f"{package.__name__}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
print(json.dumps({
    "left_out": [m.__name__ for m in modules if m not in KERNEL_MODULES and any(
        isinstance(v, numba.core.registry.CPUDispatcher) and v.__module__ == m.__name__ for v in vars(m).values())],
    "compiled_later": {k: v for k, v in after.items() if v != before.get(k)},
}))
"""


def test_models_run_on_kernels_compiled_at_start() -> None:
    """The example model and a net of the layers compiled after the first kernels (BatchNorm,
    bilinear and bicubic Interp, GELU, LayerNorm, RMSNorm, a Linear Gemm with a GELU fused, self-attention, MatMul), inputs read-only as the daemon's
    are, add no specialization after ``compile_kernels``; every module of the package with
    compiled kernels is among the warm-up's (``KERNEL_MODULES``)."""
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"left_out": [], "compiled_later": {}}


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
