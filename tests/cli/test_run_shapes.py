"""`vkserve run` / `verify` on a pnnx export as pnnx wrote it (no Input shape): the shape comes
from the --input file (or --shape); with neither, a usage error that says which flag to give."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from tests.support.daemon import vkserve_cmd
from tests.support.paths import PNNX_DIR, REPO

MODEL = PNNX_DIR / "densenet121.param"


def vk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(vkserve_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=300)


def test_run_takes_the_shape_from_the_input_file(tmp_path: Path) -> None:
    data = np.random.default_rng(0).uniform(-1, 1, (3, 40, 56)).astype(np.float32)
    np.save(tmp_path / "x.npy", data)
    p = vk("run", str(MODEL), "--input", f"in0={tmp_path / 'x.npy'}", "--json", "--repeat", "1")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["inputs"] == {"in0": [3, 40, 56]}
    assert [o["shape"] for o in report["outputs"]] == [[1000]]


def test_verify_takes_the_shape_from_shape(tmp_path: Path) -> None:
    p = vk("verify", str(MODEL), "--shape", "in0=3,32,32", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ok"] is True


def test_no_shape_and_no_data_is_a_usage_error_naming_the_flags() -> None:
    for command in (("run", "--random-input"), ("verify",)):
        p = vk(command[0], str(MODEL), *command[1:])
        assert p.returncode == 2
        assert ("input 'in0' declares no shape in densenet121.param (pnnx writes none): give one with "
                "--shape in0=3,224,224 or data with --input in0=file.npy") in p.stderr
