"""The built wheel, installed into a fresh venv outside the checkout, is one `vkserve` namespace
and serves its packaged example model from an empty folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO

OUR_PARTS = ("cache", "cli", "client", "daemon", "devices", "models", "scheduler")
PIP_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(wheel, venv): `pip wheel` of the checkout, installed with its dependencies into a new venv."""
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"),
                    str(REPO)], check=True, timeout=PIP_TIMEOUT_S, capture_output=True)
    [wheel] = (work / "dist").glob("vkserve-*.whl")
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                   check=True, timeout=PIP_TIMEOUT_S, capture_output=True)
    yield wheel, env_dir


def test_wheel_holds_one_top_level_package(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith((".dist-info", ".data"))}
    assert tops == {"vkserve"}, tops
    for part in OUR_PARTS:
        assert f"vkserve/{part}/__init__.py" in names
    assert "vkserve/examples/digits/model.param" in names
    assert "vkserve/examples/digits/samples/3.npy" in names
    assert "vkserve/devices/vulkan/shaders/conv_gemm.comp" in names
    assert "vkserve/daemon/vkserve.toml" in names


def test_only_the_namespace_imports(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, env_dir = installed
    python = str(env_dir / "bin" / "python")
    (tmp_path / "empty").mkdir()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "client.py").write_text("WHO = 'the application'\n")  # an app's own module
    for part in OUR_PARTS:
        p = subprocess.run([python, "-c", f"import {part}"], cwd=tmp_path / "empty", capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and "ModuleNotFoundError" in p.stderr, (part, p.stderr)
    imports = "; ".join(f"import vkserve.{part}" for part in OUR_PARTS)
    p = subprocess.run([python, "-c", f"{imports}; from client import WHO; print(WHO)"], cwd=tmp_path / "app",
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "the application", p.stderr
    p = subprocess.run([str(env_dir / "bin" / "vkserve"), "--version"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "vkserve 0.1.0", (p.stdout, p.stderr)


def test_installed_wheel_serves_digits_from_an_empty_folder(installed: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    """`vkserve serve` with the embedded config (no --config, no --models) from an empty folder;
    `vkserve infer digits` with the sample shipped in the wheel answers class 3."""
    _, env_dir = installed
    exe = str(env_dir / "bin" / "vkserve")
    empty = tmp_path / "empty"
    empty.mkdir()
    sock = tmp_path / "vk.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VKSERVE_", "VIRTUAL_ENV"))}
    env.update(PYTHONUNBUFFERED="1", HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("PYTHONPATH", None)
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([exe, "serve", "--socket", str(sock), "--metrics-listen", "off"], cwd=empty,
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    site = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                           "import vkserve, pathlib; print(pathlib.Path(vkserve.__file__).parent)"],
                          capture_output=True, text=True, cwd=empty, env=env, timeout=60, check=True)
    sample = Path(site.stdout.strip()) / "examples" / "digits" / "samples" / "3.npy"
    assert sample.is_relative_to(env_dir) and not sample.is_relative_to(REPO)
    try:
        answer = None
        end = time.monotonic() + 120
        while time.monotonic() < end and proc.poll() is None:
            answer = subprocess.run([exe, "infer", "digits", "--input", f"data={sample}", "--socket", str(sock),
                                     "--timeout", "30"], capture_output=True, text=True, cwd=empty, env=env,
                                    timeout=60)
            if answer.returncode == 0:
                break
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        assert answer is not None and answer.returncode == 0, (answer, (tmp_path / "serve.log").read_text()[-3000:])
        assert "class 3" in answer.stdout, answer.stdout
        assert list(empty.iterdir()) == []  # nothing written into the working folder
    finally:
        proc.terminate()
        rc = proc.wait(timeout=60)
        log.close()
    assert rc == 0, (tmp_path / "serve.log").read_text()[-3000:]
