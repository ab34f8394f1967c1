"""The built wheel, installed into a fresh venv outside the checkout, is one `vkserve` namespace
and serves its packaged example model from an empty folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO
from vkserve.devices.cpu.kernel_cache import sources_key

OUR_PARTS = ("cache", "cli", "client", "daemon", "devices", "models", "scheduler")
PIP_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(wheel, venv): `pip wheel` of the checkout, installed with its dependencies into a new venv
    (by this interpreter's pip, ``--python``: the venv needs none of its own; ``--no-compile``:
    modules get their bytecode when first imported)."""
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"),
                    str(REPO)], check=True, timeout=PIP_TIMEOUT_S, capture_output=True)
    [wheel] = (work / "dist").glob("vkserve-*.whl")
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "-q",
                    "--no-compile", str(wheel)], check=True, timeout=PIP_TIMEOUT_S, capture_output=True)
    yield wheel, env_dir


def seed_cpu_kernels(installed_jit: Path, numba_cache: Path) -> None:
    """Copy this process's numba cache of the checkout's CPU kernels to where a process running
    the installed copy of the same sources looks for it in ``numba_cache``. numba keys its cache
    folder by the source file's folder, each entry by the source's content hash, the function's
    bytecode, its signature and the CPU, so the installed copy loads them instead of compiling
    them again (51 kernels, 90 s on a 2-core box; a first start's compilation of a fresh
    install is test_systemd_real's)."""
    import numba  # noqa: PLC0415
    from numba.core.caching import UserProvidedCacheLocator  # noqa: PLC0415

    from vkserve.devices.cpu import jit  # noqa: PLC0415 (sets numba's cache folder)
    from vkserve.devices.cpu.warm import compile_kernels  # noqa: PLC0415

    compile_kernels()  # loaded from the cache where an earlier test compiled them
    ours = Path(jit.__file__).parent
    assert (installed_jit / "conv.py").read_bytes() == (ours / "conv.py").read_bytes()
    subpath = UserProvidedCacheLocator.get_suitable_cache_subpath
    shutil.copytree(Path(numba.config.CACHE_DIR) / subpath(str(ours / "conv.py")),
                    numba_cache / subpath(str(installed_jit / "conv.py")))


def test_wheel_holds_one_top_level_package(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith((".dist-info", ".data"))}
    assert tops == {"vkserve"}, tops
    for part in OUR_PARTS:
        assert f"vkserve/{part}/__init__.py" in names
    assert "vkserve/examples/digits/model.param" in names
    assert "vkserve/examples/digits/samples/3.npy" in names
    shaders = REPO / "vkserve" / "devices" / "vulkan" / "shaders"
    for shader in [*shaders.glob("*.comp"), *shaders.glob("*.h")]:  # the headers they #include too
        assert f"vkserve/devices/vulkan/shaders/{shader.name}" in names
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
    env.pop("NUMBA_CACHE_DIR", None)  # the daemon's default: numba/<key> in its XDG cache folder
    site = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                           "import vkserve, pathlib; print(pathlib.Path(vkserve.__file__).parent)"],
                          capture_output=True, text=True, cwd=empty, env=env, timeout=60, check=True)
    package = Path(site.stdout.strip())
    sample = package / "examples" / "digits" / "samples" / "3.npy"
    assert sample.is_relative_to(env_dir) and not sample.is_relative_to(REPO)
    # the installed copy's kernels folder: named by its sources, the same as the checkout's
    seed_cpu_kernels(package / "devices" / "cpu" / "jit", tmp_path / "cache" / "vkserve" / "numba" / sources_key())
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([exe, "serve", "--socket", str(sock), "--metrics-listen", "off"], cwd=empty,
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
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
