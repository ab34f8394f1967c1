"""The JIT compiler's pages out of the resident set once the kernels are loaded (``jit.residency``)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

#: in a fresh process: llvmlite's resident KiB after the imports, after ``compile_kernels``,
#: after a model ran (and its output), after numba compiled a new function
_CHILD = """
import json
import numpy as np
from numba import njit
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.cpu.jit.residency import compiler_mappings, release_compiler_pages
from vkserve.devices.cpu.warm import compile_kernels
from vkserve.models.graph import build_graph, parse_param_text
from vkserve.models.randinit import random_weights

def compiler_rss_kib():
    starts = {start for start, _ in compiler_mappings()}
    total, inside = 0, False
    with open("/proc/self/smaps") as lines:
        for line in lines:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) in starts
            elif inside and head == "Rss:":
                total += int(line.split()[1])
    return total

def output():
    layers = parse_param_text('''7767517
3 3
Input data 0 1 data 0=12 1=12 2=8
ConvolutionDepthWise dw 1 1 data a 0=8 1=3 4=1 5=1 6=72 7=8 9=1
Convolution pw 1 1 a out 0=16 1=1 5=1 6=128
''', "residency net")
    for layer, weights in zip(layers, random_weights(layers, 0)):
        layer.weights = weights
    data = np.random.default_rng(0).standard_normal((8, 12, 12)).astype(np.float32)
    return Plan(build_graph(layers, "residency net")).run({"data": data})["out"].tobytes().hex()

import llvmlite, os
assert llvmlite.__file__.startswith(os.environ["PYTHONPATH"]), llvmlite.__file__  # the private copy
got = {"mapped": len(compiler_mappings()), "imported": compiler_rss_kib()}
compile_kernels()
got["loaded"] = compiler_rss_kib()
got["supported"] = release_compiler_pages() > 0
first = output()
got["ran"] = compiler_rss_kib()
got["same"] = output() == first

@njit
def twice(x):
    return 2 * x

got["twice"] = twice(21)
got["compiled"] = compiler_rss_kib()
print(json.dumps(got))
"""


def test_loaded_kernels_run_without_the_compilers_pages_and_it_compiles_after(tmp_path: Path) -> None:
    """In a fresh process llvmlite's library holds tens of MiB resident after the imports;
    after ``compile_kernels`` (every kernel loaded) almost none, and a model runs without
    bringing them back, the same bits each run; numba still compiles a new function
    afterwards (reading some back). The kernel pages out only what no other process maps, and
    other processes map the installed library (this one, a test worker beside it): the child
    loads a copy of llvmlite of its own."""
    spec = importlib.util.find_spec("llvmlite")
    assert spec is not None and spec.origin is not None
    copy = shutil.copytree(Path(spec.origin).parent, tmp_path / "llvmlite")
    for library in copy.rglob("*.so"):  # written back: the kernel pages out clean pages only
        with library.open("rb") as f:
            os.fsync(f.fileno())
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["mapped"], "llvmlite's library is not mapped: nothing was measured"
    if not got["supported"]:
        pytest.skip("this kernel refuses madvise(MADV_PAGEOUT) (Linux < 5.4)")
    assert got["imported"] > 24 * 1024 and got["loaded"] < 8 * 1024 and got["ran"] < 8 * 1024, got
    assert got["same"] and got["twice"] == 42
    assert got["compiled"] > got["ran"], got
