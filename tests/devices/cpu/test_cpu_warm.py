"""`compile_kernels` (the daemon's start, `vkserve cache warm`) leaves nothing for a model's
first request to compile: a CPU job of the example model, its input read-only as the daemon's
are (a view of the request or of shared memory), adds no kernel specialization afterwards.
It runs in a child so no earlier test has compiled that specialization in this process."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import REPO

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
