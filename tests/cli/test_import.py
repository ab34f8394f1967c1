"""`vkserve import` with the real pnnx executable (`pip install --no-deps pnnx`, deploy/dev.sh)
on an ONNX model this test builds with the `onnx` package; the imported folder's outputs on the
CPU engine against onnx's reference evaluator; pnnx's own file names (NAME.ncnn.param) in model
folders and for `vkserve run`/`verify`; the failures (pnnx missing or failing, bad flags)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from vkserve.cli.main import main
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.reference import compare
from vkserve.models import importer
from vkserve.models.graph import load_model
from vkserve.scheduler.registry import read_model_folder

IN_SHAPE = (3, 16, 16)
CLASSES = 6


def small_cnn(dynamic: bool = False) -> onnx.ModelProto:
    """Conv 3x3 -> Relu -> MaxPool 2x2 -> Conv 3x3 -> Relu -> GlobalAveragePool -> Flatten ->
    Gemm -> Softmax, seeded weights; ``dynamic``: height and width left free."""
    rng = np.random.default_rng(42)

    def weight(name: str, *shape: int, scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["in0", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
    ]
    inits = [weight("w1", 8, 3, 3, 3, scale=0.4), weight("b1", 8, scale=0.1),
             weight("w2", 12, 8, 3, 3, scale=0.2), weight("b2", 12, scale=0.1),
             weight("w3", CLASSES, 12, scale=0.8), weight("b3", CLASSES, scale=0.1)]
    dims: list[int | str] = [1, 3, "h", "w"] if dynamic else [1, *IN_SHAPE]
    graph = helper.make_graph(nodes, "small_cnn",
                              [helper.make_tensor_value_info("in0", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, CLASSES])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "small_cnn.onnx"
    onnx.save(small_cnn(), path)
    return path


@pytest.fixture(scope="module")
def imported(onnx_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """`vkserve import small_cnn.onnx --name small --json` with preprocessing and labels: the
    repository and the JSON document it printed."""
    repo = tmp_path_factory.mktemp("repo")
    labels = repo.parent / "classes.txt"
    labels.write_text("".join(f"class{i}\n" for i in range(CLASSES)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["import", str(onnx_file), "--name", "small", "--models", str(repo),
                       "--pixel-format", "BGR", "--resize", "16,16", "--mean", "104,117,123",
                       "--norm", "0.017,0.017,0.017", "--labels", str(labels), "--json"])
    document = json.loads(out.getvalue())
    assert status == 0, document
    return repo, document


def test_import_writes_a_model_folder_and_verify_passes(imported: tuple[Path, dict]) -> None:
    repo, document = imported
    folder = repo / "small"
    assert document["ok"] is True and document["folder"] == str(folder)
    assert document["inputs"] == {"in0": list(IN_SHAPE)}
    assert document["verify"]["ok"] is True
    compared = {o["name"]: o["ok"] for o in document["verify"]["outputs"]}
    assert compared["out0"] is True and all(compared.values()), compared
    assert sorted(p.name for p in folder.iterdir()) == ["config.toml", "labels.txt", "model.bin",
                                                        "model.param"]
    config = tomllib.loads((folder / "config.toml").read_text())
    assert config["inputs"] == {"in0": list(IN_SHAPE)}
    assert config["preprocess"] == {"input": "in0", "pixel_format": "BGR", "resize": [16, 16],
                                    "mean": [104.0, 117.0, 123.0], "norm": [0.017] * 3}
    assert config["postprocess"] == {"kind": "topk", "labels": "labels.txt"}


def test_imported_folder_scans_as_the_daemon_scans_it(imported: tuple[Path, dict]) -> None:
    spec = read_model_folder(imported[0] / "small")
    assert spec.error is None
    assert spec.inputs["in0"].shapes == (IN_SHAPE,)
    assert spec.preprocess is not None and spec.preprocess.pixel_format.value == "BGR"
    assert spec.postprocess is not None and spec.postprocess.labels == tuple(f"class{i}" for i in range(CLASSES))


def test_imported_model_computes_what_onnx_computes(imported: tuple[Path, dict], onnx_file: Path) -> None:
    folder = imported[0] / "small"
    graph = load_model(folder / "model.param", folder / "model.bin", {"in0": IN_SHAPE})
    plan = Plan(graph, {"in0": IN_SHAPE})
    evaluator = ReferenceEvaluator(onnx.load(onnx_file))
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = rng.uniform(-1, 1, IN_SHAPE).astype(np.float32)
        want = evaluator.run(None, {"in0": x[None]})[0].reshape(-1)
        got = np.asarray(next(iter(plan.run({"in0": x}).values()))).reshape(-1)
        report = compare("prob", got, want, "bf16")
        assert report.ok, report
        assert int(got.argmax()) == int(want.argmax())


def test_dynamic_onnx_input_needs_a_shape_and_takes_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "dyn.onnx"
    onnx.save(small_cnn(dynamic=True), source)
    assert main(["import", str(source), "--name", "dyn", "--models", str(tmp_path)]) == 2
    assert "input in0 has no fixed shape in dyn.onnx: give one with --shape in0=" in capsys.readouterr().err
    assert not (tmp_path / "dyn").exists()
    assert main(["import", str(source), "--name", "dyn", "--models", str(tmp_path),
                 "--shape", "in0=3,24,20", "--mean", "127.5", "--norm", "0.0078125"]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and f"imported dyn.onnx as dyn into {tmp_path / 'dyn'}" in out
    config = tomllib.loads((tmp_path / "dyn" / "config.toml").read_text())
    assert config["inputs"] == {"in0": [3, 24, 20]}
    # one value stands for each channel of the default RGB
    assert config["preprocess"] == {"input": "in0", "mean": [127.5] * 3, "norm": [0.0078125] * 3}


def test_pnnx_failure_shows_what_pnnx_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "broken.onnx"
    source.write_bytes(b"this is not a protobuf")
    assert main(["import", str(source), "--name", "broken", "--models", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"pnnx failed on {source}" in err and "pnnx said:" in err and "onnx" in err
    assert not (tmp_path / "broken").exists()
    assert not list(tmp_path.glob("*.pnnx*")), "pnnx's side files must not land next to the source"


def test_a_layer_vkserve_does_not_run_fails_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """pnnx turns an ONNX LSTM into ncnn's LSTM, which vkserve does not run: exit 1, the line
    and layer named, nothing written."""
    rng = np.random.default_rng(0)
    hidden = 4
    weights = [numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, n)) * 0.3).astype(np.float32), name)
               for name, n in (("W", 3), ("R", hidden))]
    graph = helper.make_graph([helper.make_node("LSTM", ["in0", "W", "R"], ["y"], hidden_size=hidden)], "lstm",
                              [helper.make_tensor_value_info("in0", TensorProto.FLOAT, [5, 1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 1, hidden])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    source = tmp_path / "lstm.onnx"
    onnx.save(model, source)
    assert main(["import", str(source), "--name", "lstm", "--models", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "lstm does not run in vkserve: model.ncnn.param line" in err and "LSTM" in err
    assert not (tmp_path / "lstm").exists()


def test_missing_pnnx_says_what_to_install(onnx_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # fault injection: this Python has no pnnx package, nothing beside it or on PATH
    monkeypatch.setattr(importer.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(importer.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["import", str(onnx_file), "--name", "x", "--models", str(tmp_path), "--json"]) == 1
    captured = capsys.readouterr()
    assert "pip install --no-deps pnnx" in captured.err
    assert json.loads(captured.out)["error"]["message"] == importer.PNNX_INSTALL


def test_pnnx_is_found_beside_python_then_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importer.find_pnnx()  # the package's native executable (deploy/dev.sh installs it)
    assert real.name == "pnnx" and real.parent.name == "pnnx"
    monkeypatch.setattr(importer.importlib.util, "find_spec", lambda name: None)
    beside, on_path = tmp_path / "venv-bin", tmp_path / "path-bin"
    for folder in (beside, on_path):
        folder.mkdir()
        (folder / "pnnx").symlink_to(real)
    monkeypatch.setattr(importer.sys, "executable", str(beside / "python"))
    monkeypatch.setenv("PATH", str(on_path))
    assert importer.find_pnnx() == beside / "pnnx"
    (beside / "pnnx").unlink()
    assert importer.find_pnnx() == on_path / "pnnx"


def test_import_verifies_on_lavapipe_when_asked(onnx_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(onnx_file), "--name", "gpu", "--models", str(tmp_path),
                 "--device", "vulkan:0", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is True and document["verify"]["ok"] is True
    assert document["verify"]["device"].startswith("vulkan:0"), document["verify"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--name", "small"], "exists: remove it or choose another --name"),
    (["--name", "bad/name"], "--name 'bad/name': must match"),
    (["--name", "n", "--shape", "data=3,16,16"], "pnnx names the inputs in0, in1"),
    (["--name", "n", "--shape", "in1=3,16,16"], "without gaps"),
    (["--name", "n", "--mean", "1,2"], "--mean: expected 1 or 3 values, got 2"),
    (["--name", "n", "--labels", "/nonexistent/labels.txt"], "no such file"),
])
def test_usage_errors_exit_2_and_write_nothing(imported: tuple[Path, dict], onnx_file: Path, argv: list[str],
                                               message: str, capsys: pytest.CaptureFixture[str]) -> None:
    repo = imported[0]
    before = sorted(repo.iterdir())
    assert main(["import", str(onnx_file), "--models", str(repo), *argv]) == 2
    assert message in capsys.readouterr().err
    assert sorted(repo.iterdir()) == before


def test_unknown_source_kind_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "model.tflite"
    source.write_bytes(b"\0")
    assert main(["import", str(source), "--name", "m", "--models", str(tmp_path)]) == 2
    assert "expected a .onnx, .pt, .torchscript file" in capsys.readouterr().err


@pytest.fixture(scope="module")
def pnnx_folder(onnx_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pnnx's own output, as a user gets it: net.ncnn.param / net.ncnn.bin (and its other files)."""
    scratch = tmp_path_factory.mktemp("pnnx-scratch")
    converted = importer.convert(importer.find_pnnx(), onnx_file, {}, scratch)
    folder = tmp_path_factory.mktemp("pnnx-repo") / "net"
    folder.mkdir()
    shutil.copyfile(converted.param, folder / "net.ncnn.param")
    shutil.copyfile(converted.bin, folder / "net.ncnn.bin")
    return folder


def test_registry_serves_a_pnnx_named_pair(pnnx_folder: Path) -> None:
    spec = read_model_folder(pnnx_folder)
    assert spec.error is None
    assert spec.param_path == pnnx_folder / "net.ncnn.param" and spec.bin_path == pnnx_folder / "net.ncnn.bin"
    assert spec.load_layers()[1].weights, "the weights come from net.ncnn.bin"


def test_registry_names_a_missing_pnnx_bin_and_ambiguous_pairs(pnnx_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "half"
    folder.mkdir()
    shutil.copyfile(pnnx_folder / "net.ncnn.param", folder / "net.ncnn.param")
    assert "half/net.ncnn.bin: missing" in (read_model_folder(folder).error or "")
    shutil.copyfile(pnnx_folder / "net.ncnn.param", folder / "other.ncnn.param")
    error = read_model_folder(folder).error or ""
    assert "several pnnx graphs (net.ncnn.param, other.ncnn.param)" in error


def test_verify_and_run_take_a_pnnx_folder_and_file(pnnx_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(pnnx_folder), "--shape", "in0=3,16,16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    param = pnnx_folder / "net.ncnn.param"
    assert main(["run", str(param), "--shape", "in0=3,16,16", "--random-input", "--repeat", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["weights"] == str(pnnx_folder / "net.ncnn.bin")
    assert result["outputs"] == [{"name": "out0", "shape": [CLASSES]}]


def test_traced_shapes_come_from_pnnx_graph_in_input_order() -> None:
    text = ("7767517\n4 3\n"
            "pnnx.Input               pnnx_input_0             0 1 0 #0=(1,3,32,32)f32\n"
            "pnnx.Input               pnnx_input_1             0 1 1 #1=(1,3,?,?)f32\n"
            "pnnx.Input               in2                      0 1 2 #2=(2,10)f32\n"
            "pnnx.Output              out0                     1 0 0 #0=(1,3,32,32)f32\n")
    assert importer.pnnx_input_shapes(text) == [(3, 32, 32), None, None]
