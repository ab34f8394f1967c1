"""`vkserve run` / `verify` on a pnnx export as pnnx wrote it (no Input shape): the shape comes
from the --input file (or --shape, or the model folder's config.toml [inputs]); with none, a
usage error that says which flag to give."""

from __future__ import annotations

import json
import shutil
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


def model_folder(tmp_path: Path, config: str) -> Path:
    folder = tmp_path / "densenet"
    folder.mkdir()
    shutil.copy(MODEL, folder / "model.param")
    (folder / "config.toml").write_text(config)
    return folder


def test_a_model_folder_s_config_gives_the_shape_and_shape_still_wins(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "random_weights = true\n[inputs]\nin0 = [3, 32, 40]\n")
    p = vk("run", str(folder), "--random-input", "--json", "--repeat", "1")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["inputs"] == {"in0": [3, 32, 40]}
    p = vk("run", str(folder), "--random-input", "--shape", "in0=3,48,32", "--json", "--repeat", "1")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["inputs"] == {"in0": [3, 48, 32]}
    p = vk("verify", str(folder), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ok"] is True


def test_a_broken_config_is_named(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "[inputs]\nimage = [3, 32, 32]\n")
    p = vk("run", str(folder), "--random-input")
    assert p.returncode == 2
    assert "densenet/config.toml: [inputs] names 'image', not inputs of model.param" in p.stderr
