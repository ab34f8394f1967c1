"""`verify` judged against ncnn's own reduced precision: ncnn also runs its bf16 (CPU engine)
or fp16 (Vulkan engine) path on the same input and weights, and ours is ok within
max(fixed bar, 1.5x ncnn's deviation from its own fp32), unless ncnn's reduced run is itself
broken (its cosine below the minimum). The rule as a unit, then real model runs whose reports
carry ncnn's deviation: on the CPU (bf16), on lavapipe (ncnn's Vulkan fp16) and the fallback
to ncnn's CPU fp16 path when ncnn has no such Vulkan device, through the library and the CLI;
ncnn runs in child processes there, so an ncnn crash is reported, not fatal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import MODELS_DIR, PNNX_DIR
from vkserve.cli.main import main as cli_main
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.devices.reference import (
    REFERENCE_FACTOR,
    TOLERANCE,
    compare,
    judge,
    random_inputs,
    run_reduced_reference,
    without_shape_hints,
)
from vkserve.models.graph import load_model
from vkserve.models.weights import write_random_bin

SQUEEZENET = MODELS_DIR / "squeezenet.param"
SMALL = {"data": (3, 64, 64)}


def test_judge_takes_the_larger_of_bar_and_ncnns_deviation() -> None:
    assert REFERENCE_FACTOR == 1.5
    assert judge(0.03, 0.024, 0.02) == (pytest.approx(0.036), True)  # ncnn 2.4 % off: bar 3.6 %
    assert judge(0.04, 0.024, 0.02) == (pytest.approx(0.036), False)
    assert judge(0.019, 0.001, 0.02) == (0.02, True)  # ncnn close to its fp32: the fixed bar
    assert judge(0.021, 0.001, 0.02) == (0.02, False)
    assert judge(0.021, None, 0.02) == (0.02, False)  # no reduced run: the fixed bar


def test_compare_relaxes_the_bar_only_for_a_sound_reduced_run() -> None:
    ref = np.random.default_rng(0).uniform(-1.0, 1.0, 4096).astype(np.float32)
    ours = ref.copy()
    ours[0] += 0.03  # 3 % of the max abs
    ncnn_bf16 = ref.copy()
    ncnn_bf16[1] += 0.025
    fixed = compare("x", ours, ref, "bf16")
    relaxed = compare("x", ours, ref, "bf16", ncnn_bf16)
    assert not fixed.ok and fixed.bar == TOLERANCE["bf16"][1] and fixed.ref_deviation is None
    assert relaxed.ok and relaxed.bar == pytest.approx(1.5 * relaxed.ref_deviation)
    assert relaxed.ref_deviation == pytest.approx(0.025 / np.abs(ref).max(), rel=1e-3)
    garbage = np.random.default_rng(1).uniform(-1.0, 1.0, 4096).astype(np.float32)
    broken = compare("x", ours, ref, "bf16", garbage)  # e.g. ncnn's bf16 grouped convolution
    assert broken.ref_cosine is not None and broken.ref_cosine < 0.5
    assert not broken.ok and broken.bar == TOLERANCE["bf16"][1]


def test_shape_hints_are_dropped_for_ncnns_vulkan_path() -> None:
    text = "7767517\n1 1\nInput data 0 1 data -23330=4,3,224,224,3 0=224 1=224 2=3\n"
    assert without_shape_hints(text) == "7767517\n1 1\nInput data 0 1 data 0=224 1=224 2=3\n"


def test_cpu_report_carries_ncnns_bf16_deviation() -> None:
    graph = load_model(SQUEEZENET, None, SMALL)
    report = verify_cpu(graph, SQUEEZENET, None, random_inputs(SMALL), reduced=True)
    assert report.ok and report.reference == "ncnn cpu fp32"
    assert report.reduced_reference == "ncnn cpu bf16"
    for o in report.outputs:
        assert o.ref_deviation is not None and o.ref_cosine is not None and o.deviation is not None
        assert 0 < o.ref_deviation < 0.05 and o.ref_cosine > 0.999  # bf16 rounding, not garbage
        assert o.bar == pytest.approx(max(0.02, 1.5 * o.ref_deviation))
        assert o.deviation <= o.bar
    plain = verify_cpu(graph, SQUEEZENET, None, random_inputs(SMALL))  # single-layer checks' way
    assert plain.reduced_reference is None
    assert all(o.ref_deviation is None and o.bar == 0.02 for o in plain.outputs)


def test_fp16_falls_back_to_ncnns_cpu_path_and_says_why(tmp_path: Path) -> None:
    bin_path = tmp_path / "squeezenet.bin"
    write_random_bin(SQUEEZENET, bin_path)
    found = run_reduced_reference("fp16", SQUEEZENET, bin_path, random_inputs(SMALL), ["output"],
                                  vulkan_device=99)
    assert found is not None
    label, out = found
    assert label == "ncnn cpu fp16 (ncnn vulkan fp16: ncnn sees no Vulkan device 99)"
    assert out["output"].shape == (1000,)
    assert run_reduced_reference("fp32", SQUEEZENET, bin_path, random_inputs(SMALL), ["output"]) is None


def test_verify_cli_vulkan_fp16_json(capsys: pytest.CaptureFixture[str], vulkan_caps: object) -> None:
    args = ["verify", str(SQUEEZENET), "--device", "0", "--precision", "fp16", "--shape", "data=3,64,64"]
    assert cli_main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["reduced_reference"] == "ncnn vulkan fp16"
    for o in out["outputs"]:
        assert {"deviation", "ref_deviation", "ref_cosine", "bar", "ok"} <= set(o)
        assert 0 < o["ref_deviation"] < 0.05 and o["deviation"] <= o["bar"]
        assert o["bar"] == pytest.approx(max(0.02, 1.5 * o["ref_deviation"]))


def test_verify_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["verify", str(SQUEEZENET), "--shape", "data=3,64,64"]) == 0
    table = capsys.readouterr().out
    assert "reference ncnn cpu fp32; reduced-precision reference ncnn cpu bf16" in table
    assert "ref_dev" in table and "bar" in table and table.rstrip().endswith("OK")


def test_verify_cli_reports_an_ncnn_crash(capsys: pytest.CaptureFixture[str]) -> None:
    """ncnn segfaults running deeplabv3_mbv3 (see tests/devices/test_pnnx_models.py): verify
    says so and exits 2 instead of dying; should ncnn get fixed, the model verifies."""
    rc = cli_main(["verify", str(PNNX_DIR / "deeplabv3_mbv3.param"), "--shape", "in0=3,256,256"])
    err = capsys.readouterr().err
    assert rc == 0 or (rc == 2 and "ncnn cpu fp32: crashed (SIGSEGV)" in err), (rc, err)
