"""Every model in tests/data/models (the 12 architectures of ncnn's benchmark set) passes
`verify` on the CPU engine (bf16 storage).

New .param files dropped into that folder are picked up automatically. Weights are the models
package's seeded random ones (written to a temporary .bin for ncnn), inputs seeded uniform
[-1, 1). Inputs keep the sizes declared in the .param: all twelve models together take about
15 s on one core here (vgg16 ~9 s, alexnet ~3 s, the rest about 1 s or less), well inside the
CI budget, so no input is shrunk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.paths import MODELS_DIR
from vkserve.cli.main import main as cli_main
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.models.graph import load_model

PARAMS = sorted(MODELS_DIR.glob("*.param"))


@pytest.mark.parametrize("param", PARAMS, ids=[p.stem for p in PARAMS])
def test_model_verifies_on_cpu(param: Path) -> None:
    graph = load_model(param, None)
    report = verify_cpu(graph, param, None)
    details = [(o.name, o.max_abs_err, o.ref_max_abs, o.cosine, o.detections) for o in report.outputs]
    assert report.ok, details
    detection = [lay for lay in graph.layers if lay.type == "Yolov3DetectionOutput"]
    if detection:
        names = {o.name for o in report.outputs}
        assert set(detection[0].inputs) <= names  # the tensors feeding the detection layer
        det = next(o for o in report.outputs if o.detections is not None)
        assert det.detections is not None and det.detections["matched"] > 0


def test_verify_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    param = MODELS_DIR / "mobilenet.param"
    rc = cli_main(["verify", str(param), "--json", "--shape", "data=3,64,64"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True
    assert out["device"] == "cpu" and out["precision"] == "bf16"
    assert out["reference"] == "ncnn cpu fp32" and out["reduced_reference"] == "ncnn cpu bf16"
    assert set(out["outputs"][0]) == {"name", "shape", "max_abs_err", "ref_max_abs", "cosine", "ok",
                                      "deviation", "ref_deviation", "ref_cosine", "bar"}


def test_run_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import numpy as np

    x = np.random.default_rng(0).uniform(-1, 1, (3, 48, 48)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    param = MODELS_DIR / "squeezenet.param"
    rc = cli_main(["run", str(param), "--input", f"data={tmp_path / 'x.npy'}", "--repeat", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["outputs"] == [{"name": "output", "shape": [1000]}]
    assert out["runs"] == 2 and out["first_ms"] > 0 and out["median_ms"] > 0
    assert 0 < out["arena_bytes"] < out["naive_bytes"]


def test_cli_rejects_gpu_index_and_missing_input(capsys: pytest.CaptureFixture[str]) -> None:
    param = str(MODELS_DIR / "mobilenet.param")
    assert cli_main(["run", param, "--device", "99", "--random-input"]) == 2
    assert "no Vulkan device 99" in capsys.readouterr().err
    if PARAMS:
        assert cli_main(["run", param]) == 2
        assert "--random-input" in capsys.readouterr().err
