"""The vector width and GEMM tile the CPU kernels are compiled for (``jit.vectors``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from numba.core.codegen import get_host_cpu_features

from tests.support.paths import REPO
from vkserve.devices.cpu import jit
from vkserve.devices.cpu.jit import vectors
from vkserve.devices.cpu.warm import compile_kernels

AVX2 = "+avx,+avx2,+fma,-avx512f,-avx512bw"
AVX512 = "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512bf16"
NEON = "+neon,+fp-armv8"


def test_avx512_hosts_get_full_width_vectors_and_the_8_row_tile() -> None:
    s = vectors.choose(AVX512, "znver4", {})
    assert s.features == AVX512 + ",-prefer-256-bit"
    assert (s.tile_rows, s.vector_bits, s.bf16_dot) == (8, 512, True)
    no_bf16 = vectors.choose(AVX512.replace("+avx512bf16", "-avx512bf16"), "znver4", {})
    assert (no_bf16.tile_rows, no_bf16.vector_bits, no_bf16.bf16_dot) == (8, 512, False)


def test_bf16_pair_products_only_on_amd_cores() -> None:
    """Intel's vdpbf16ps issues on one port, where its FMAs issue on two: measured slower than
    the fp32 kernel on a Sapphire Rapids Xeon, so not used there (unless NUMBA_CPU_NAME says)."""
    intel = vectors.choose(AVX512, "sapphirerapids", {})
    assert (intel.tile_rows, intel.vector_bits, intel.bf16_dot) == (8, 512, False)
    assert vectors.choose(AVX512, "sapphirerapids", {"NUMBA_CPU_NAME": "znver4"}).bf16_dot
    assert vectors.choose(AVX512, "znver5", {}).bf16_dot


AMX = AVX512 + ",+amx-tile,+amx-bf16"


def test_amx_tiles_where_the_cpu_has_them_and_the_os_grants_them() -> None:
    """Intel's AMX (tile and bf16) with the 8-row tile beside it (the fp32 kernels that remain:
    Winograd, direct); asked of the OS only where it would be used; never with the AMD pair
    products; off with VKSERVE_CPU_AMX=0, without the OS's grant, or in explicit features
    lacking it."""
    asked = []

    def grant() -> bool:
        asked.append(True)
        return True

    s = vectors.choose(AMX, "sapphirerapids", {}, permit=grant)
    assert (s.tile_rows, s.vector_bits, s.bf16_dot, s.amx) == (8, 512, False, True) and asked
    assert not vectors.choose(AMX, "sapphirerapids", {}, permit=lambda: False).amx
    assert not vectors.choose(AMX, "sapphirerapids", {"VKSERVE_CPU_AMX": "0"}, permit=grant).amx
    asked.clear()
    assert not vectors.choose(AVX512, "sapphirerapids", {}, permit=grant).amx and not asked
    assert vectors.choose(AMX, "znver4", {}, permit=grant) == vectors.VectorSettings(AMX + ",-prefer-256-bit", 8, 512,
                                                                                      True, False)
    wide = AMX + ",-prefer-256-bit"
    assert vectors.choose(AVX2, "sapphirerapids", {"NUMBA_CPU_FEATURES": wide}, permit=grant).amx
    assert not vectors.choose(AMX, "sapphirerapids", {"NUMBA_CPU_FEATURES": AVX512 + ",-prefer-256-bit"},
                              permit=grant).amx


def test_other_hosts_keep_numbas_choice_and_the_4_row_tile() -> None:
    assert vectors.choose(AVX2, "znver2", {}) == vectors.VectorSettings(None, 4, 256, False)
    assert vectors.choose(NEON, "cortex-a76", {}) == vectors.VectorSettings(None, 4, 128, False)


def test_an_explicit_numba_cpu_features_wins() -> None:
    # on an AVX-512 host, features without -prefer-256-bit: LLVM's 256-bit vectors, 4 rows, and
    # no bf16 products (their kernel is written for 512-bit registers)
    assert vectors.choose(AVX512, "znver4", {"NUMBA_CPU_FEATURES": AVX512}) == vectors.VectorSettings(None, 4, 256, False)
    wide = AVX512 + ",-prefer-256-bit"
    assert vectors.choose(AVX2, "znver2", {"NUMBA_CPU_FEATURES": wide}) == vectors.VectorSettings(None, 8, 512, True)
    no_bf16 = wide.replace("+avx512bf16", "-avx512bf16")
    assert vectors.choose(AVX512, "znver4", {"NUMBA_CPU_FEATURES": no_bf16}) == vectors.VectorSettings(None, 8, 512, False)


def test_this_process_compiles_with_its_choice() -> None:
    import numba

    assert jit.conv.MR == jit.VECTORS.tile_rows
    if jit.VECTORS.features is not None:
        assert numba.config.CPU_FEATURES == jit.VECTORS.features
    report = compile_kernels()
    assert report.vector_bits == jit.VECTORS.vector_bits
    assert f"{report.vector_bits}-bit vectors" in report.describe()


#: run in a child: the real ``jit.vectors`` module, loaded on its own with the tile of argv[3]
#: rows and the bf16 products of argv[4] set, stands in for the package's import of it (the
#: GEMM path is fixed when ``jit.conv`` compiles). numba keys cached code by source and CPU, not
#: by the settings it froze in: every kernel whose code reaches them (``MR``, ``DOT`` and what
#: follows from them, the register-tile kernels, through the kernels it calls) is cached in the
#: child's own folder (argv[2], empty), so none is loaded from the other path's cache nor
#: written there; the others (depthwise, InnerProduct, element-wise, ...) do not depend on the
#: path and are loaded from the process's cache folder where an earlier test compiled them.
_OTHER_TILE = """
import dataclasses, importlib.util, sys, types
name = "vkserve.devices.cpu.jit.vectors"
spec = importlib.util.spec_from_file_location(name, sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[name] = module
spec.loader.exec_module(module)
module.SETTINGS = dataclasses.replace(module.SETTINGS, tile_rows=int(sys.argv[3]), bf16_dot=sys.argv[4] == "dot",
                                     amx=sys.argv[4] == "amx")
import numba
import pytest
from numba.core.dispatcher import Dispatcher
from vkserve.devices.cpu.jit import (conv, direct, elementwise, epilogue, implicit, implicit_pairs, innerproduct,
                                     linear, lrn, nms, pooling, winograd)
assert (conv.MR, conv.DOT, conv.AMX) == (int(sys.argv[3]), sys.argv[4] == "dot", sys.argv[4] == "amx")
TILE = {"MR", "DOT", "AMX", "BR", "KALIGN", "PAIR", "PANEL", "PANEL_ROWS", "PANEL_COLS", "_micro", "_micro2",
        "_micro_half", "_micro_rows", "_micro2_rows", "_micro_half_rows", "strips_fp32", "strips_dot", "_dot1", "_dot2",
        "_rows_product", "_tiles_begin", "_tiles_end", "_pack_flat", "_put", "compile_micro"}

def names(code):
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from names(c)

def reaches_tile(d, seen):
    if d in seen:
        return False
    seen.add(d)
    for n in names(d.py_func.__code__):
        g = d.py_func.__globals__.get(n)
        if n in TILE or (isinstance(g, Dispatcher) and reaches_tile(g, seen)):
            return True
    return False

kernels = {d for m in (conv, direct, elementwise, epilogue, implicit, implicit_pairs, innerproduct, linear, lrn, nms,
                      pooling, winograd)
           for d in vars(m).values() if isinstance(d, Dispatcher) and d._cache.__class__.__name__ != "NullCache"}
tiled = {d for d in kernels if reaches_tile(d, set())}
assert {conv.conv_gemm, direct.conv_direct, winograd.winograd43, winograd._multiply_and_store, linear.linear,
        linear.matmul, implicit.conv_planes, implicit_pairs.conv_pairs} <= tiled, tiled
shared = numba.config.CACHE_DIR
numba.config.CACHE_DIR = sys.argv[2]
for d in tiled:
    d.enable_caching()
numba.config.CACHE_DIR = shared
code = pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[5:]])
assert all(not d.stats.cache_hits for d in tiled), [d.py_func.__name__ for d in tiled if d.stats.cache_hits]
assert conv.conv_gemm.stats.cache_misses and winograd.winograd43.stats.cache_misses
sys.exit(code)
"""


def without_avx512(features: str) -> str:
    """An LLVM feature string with every AVX-512 and AMX feature turned off: what an AVX2 host's
    kernels are compiled for."""
    return ",".join("-" + f[1:] if f.startswith(("+avx512", "+amx")) else f for f in features.split(","))


@pytest.mark.parametrize(("rows", "path"), [(4, "fp32"), (8, "fp32"), (8, "dot"), (8, "amx")])
def test_the_other_gemm_paths_match_ncnn_on_this_host_too(tmp_path: Path, rows: int, path: str) -> None:
    """The GEMM paths this host does not use, compiled for this CPU: the 4-row fp32 tile of AVX2
    and Arm hosts, the 8-row one of AVX-512 hosts, the bf16 pair products of AVX-512 BF16 hosts
    and the AMX tiles of Intel's (where the CPU has them): every dense, Winograd and planes'
    (AMX tiles or bf16 pairs) convolution case and a Linear layer against ncnn, the Linear and
    MatMul kernels against numpy, the same bits on any thread count, and a channel scale read
    into the GEMM's panels as the BinaryOp would have stored it, so each path is tested on any
    machine that can run it. The kernels the path reaches compile afresh in the child (their
    own numba cache folder). The 4-row tile compiles for this CPU without its AVX-512 and AMX
    features (an AVX2 host's target), every kernel afresh: code of the wider paths left in a
    kernel there fails to compile (a pair product's intrinsic once stopped every AVX2 host's
    first 1x1 convolution, unseen on the AVX-512 hosts that ran the suite)."""
    if (rows, path == "dot", path == "amx") == (jit.VECTORS.tile_rows, jit.VECTORS.bf16_dot, jit.VECTORS.amx):
        pytest.skip("the path this host uses: the rest of the suite runs it")
    if path == "dot" and vectors.BF16 not in get_host_cpu_features().split(","):
        pytest.skip("bf16 pair products need a CPU with AVX-512 BF16")
    if path == "amx" and not (vectors.AMX <= set(get_host_cpu_features().split(",")) and vectors.request_tiles()):
        pytest.skip("AMX tiles need a CPU with AMX and the OS's grant")
    env = dict(os.environ)
    if rows == 4:
        env["NUMBA_CPU_FEATURES"] = without_avx512(get_host_cpu_features())
    proc = subprocess.run(
        [sys.executable, "-c", _OTHER_TILE, vectors.__file__, str(tmp_path / "numba"), str(rows), path,
         "tests/devices/cpu/test_cpu_jit_conv.py::test_convolution_matches_ncnn",
         "tests/devices/cpu/test_cpu_jit_conv.py::test_same_bits_with_one_and_more_threads_and_run_to_run",
         "tests/devices/cpu/test_cpu_jit_conv.py::test_gemm_split_gives_every_thread_work_where_the_layer_has_it",
         "tests/devices/cpu/test_cpu_jit_conv.py::test_shared_input_panels_give_the_same_bits",
         "tests/devices/cpu/test_cpu_winograd.py::test_winograd_matches_ncnn",
         "tests/devices/cpu/test_cpu_winograd.py::test_winograd_same_bits_with_one_and_more_threads_and_run_to_run",
         "tests/devices/cpu/test_cpu_implicit.py::test_implicit_matches_ncnn",
         "tests/devices/cpu/test_cpu_implicit.py::test_implicit_same_bits_with_one_and_more_threads_and_run_to_run",
         "tests/devices/cpu/test_cpu_matmul.py::test_linear_form_runs_compiled_with_the_gelu_after_it",
         "tests/devices/cpu/test_cpu_matmul.py::test_linear_form_same_bits_on_any_split",
         "tests/devices/cpu/test_cpu_matmul.py::test_linear_kernel_against_numpy_on_every_split",
         "tests/devices/cpu/test_cpu_matmul.py::test_matmul_runs_compiled_same_bits_on_any_split",
         "tests/devices/cpu/test_cpu_fusion.py::test_channel_scale_fused_gives_the_unfused_bits"],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_kernels_use_the_cache_folder_when_numba_was_imported_first(tmp_path: Path) -> None:
    """A program that imports numba before the engine still gets the engine's cache folder
    (numba reads NUMBA_CACHE_DIR at its own import only)."""
    code = ("import numba, os; import vkserve.devices.cpu.jit; "
            "print(numba.config.CACHE_DIR == os.environ['NUMBA_CACHE_DIR'] != '')")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.stdout.strip() == "True", out.stderr


def test_a_changed_numba_variable_keeps_the_engines_settings() -> None:
    """numba's compiler reads every NUMBA_* variable again once one has changed (here another
    library's, set after the engine loaded): the SLP vectorizer, the CPU features and the
    cache folder stay the engine's, so no kernel compiles slow and is cached as if it were not."""
    code = ("import os, numba, numba.core.config\n"
            "from vkserve.devices.cpu import jit\n"
            "want = (1, jit.VECTORS.features or numba.config.CPU_FEATURES, os.environ['NUMBA_CACHE_DIR'])\n"
            "os.environ['NUMBA_DEBUG_CACHE'] = '0'\n"
            "numba.core.config.reload_config()\n"
            "got = (numba.config.SLP_VECTORIZE, numba.config.CPU_FEATURES, numba.config.CACHE_DIR)\n"
            "print(got == want, got[0], want[2] != '')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_SLP_VECTORIZE", "NUMBA_CPU_FEATURES")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.stdout.split() == ["True", "1", "True"], out.stdout + out.stderr
