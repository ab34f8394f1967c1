"""Malformed .param/.bin files raise ModelFormatError naming file, line and layer."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from vkserve.models.binfile import TAG_FP16, read_bin
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model, parse_param_text, read_param
from vkserve.models.weights import bin_size, write_random_bin

GOOD = """7767517
4 4
Input            data   0 1 data 0=8 1=8 2=3
Convolution      conv1  1 1 data c1 0=4 1=3 4=1 5=1 6=108 9=1
Pooling          pool1  1 1 c1 p1 0=1 4=1
InnerProduct     fc     1 1 p1 out 0=2 1=1 2=8
"""


def _error(text: str) -> ModelFormatError:
    with pytest.raises(ModelFormatError) as info:
        parse_param_text(text, "net.param")
    return info.value


def test_good_model_parses() -> None:
    layers = parse_param_text(GOOD, "net.param")
    assert [layer.name for layer in layers] == ["data", "conv1", "pool1", "fc"]


def test_unknown_layer_types_named_together() -> None:
    text = GOOD.replace("Pooling          pool1", "Frobnicate pool1").replace(
        "InnerProduct     fc", "Wibble fc")
    err = _error(text)
    assert err.file == "net.param" and err.line == 5 and err.layer == "pool1"
    assert "Frobnicate (line 5, layer 'pool1')" in str(err)
    assert "Wibble (line 6, layer 'fc')" in str(err)


def test_missing_blob() -> None:
    err = _error(GOOD.replace("1 1 c1 p1", "1 1 nothere p1"))
    assert (err.line, err.layer) == (5, "pool1")
    assert "input blob 'nothere'" in err.message


def test_blob_produced_twice() -> None:
    err = _error(GOOD.replace("1 1 c1 p1", "1 1 c1 c1"))
    assert (err.line, err.layer) == (5, "pool1") and "already produced by layer 'conv1'" in str(err)


def test_wrong_param_type_message() -> None:
    err = _error(GOOD.replace("0=4 1=3 4=1", "0=4 1=3.5 4=1"))
    assert str(err) == (
        "net.param line 4 (layer 'conv1' Convolution): param 1 (kernel_w): "
        "expected int, got float '3.5'"
    )
    assert (err.file, err.line, err.layer) == ("net.param", 4, "conv1")


def test_float_param_int_bits_rejected() -> None:
    text = GOOD.replace("4 4\n", "5 5\n") + "ReLU r 1 1 out o2 0=2\n"
    assert "param 0 (slope): expected float, got int '2'" in _error(text).message
    ok = GOOD.replace("4 4\n", "5 5\n") + "ReLU r 1 1 out o2 0=0\n"
    assert parse_param_text(ok, "net.param")[-1].params.slope == 0.0


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda t: t.replace("7767517", "7767518"), "bad magic"),
        (lambda t: t.replace("4 4\n", "5 4\n"), "declares 5 layers"),
        (lambda t: t.replace("4 4\n", "4 2\n"), "declares 2 blobs"),
        (lambda t: t.replace("1 1 c1 p1", "1 2 c1 p1"), "looks like a param"),
        (lambda t: t.replace("1 1 c1 p1 0=1 4=1", "1 3 c1 p1"), "declares 1 inputs and 3 outputs"),
        (lambda t: t.replace("1 1 c1 p1", "x 1 c1 p1"), "input count"),
        (lambda t: t.replace("0=2 1=1 2=8", "0=2 1=1 2=9"), "multiple of num_output"),
        (lambda t: t.replace("0=1 4=1", "0=7 4=1"), "pooling_type"),
        (lambda t: t.replace("Convolution      conv1  1 1 data c1",
                             "Convolution      conv1  2 1 data data c1"), "takes 1 input"),
        (lambda t: "", "empty"),
    ],
)
def test_structural_errors(mutate: object, fragment: str) -> None:
    assert fragment in str(_error(mutate(GOOD)))  # type: ignore[operator]


def test_duplicate_layer_names_load_as_ncnn_does() -> None:
    """pnnx writes duplicate layer names (convnext_tiny: splitncnn_0..3); ncnn accepts them."""
    from vkserve.models.graph import build_graph

    layers = parse_param_text(GOOD.replace("fc     1 1", "data   1 1"), "net.param")
    assert [layer.name for layer in layers].count("data") == 2
    assert [layer.type for layer in build_graph(layers, "net.param").layers][-1] == "InnerProduct"


def test_shape_inference_error_names_layer() -> None:
    text = GOOD.replace("6=108", "6=100")
    layers = parse_param_text(text, "net.param")
    from vkserve.models.graph import build_graph

    with pytest.raises(ModelFormatError, match="weight_data_size 100") as info:
        build_graph(layers, "net.param")
    assert (info.value.line, info.value.layer) == (4, "conv1")


def test_short_bin_reports_expected_and_actual(tmp_path: Path) -> None:
    param = tmp_path / "net.param"
    param.write_text(GOOD)
    binf = tmp_path / "net.bin"
    write_random_bin(param, binf, seed=1)
    layers = read_param(param)
    assert binf.stat().st_size == bin_size(layers) == 4 + 108 * 4 + 4 * 4 + 4 + 8 * 4 + 2 * 4
    data = binf.read_bytes()
    binf.write_bytes(data[:-5])
    with pytest.raises(ModelFormatError) as info:
        load_model(param, binf)
    err = info.value
    assert err.file == "net.bin" and err.layer == "fc" and err.line == 6
    assert "expected 8 bytes" in err.message and "only 3 left" in err.message


def test_fp16_and_quantized_weights_are_widened(tmp_path: Path) -> None:
    param = tmp_path / "net.param"
    param.write_text(GOOD)
    rng = np.random.default_rng(0)
    conv_w = rng.standard_normal(108).astype(np.float16)
    conv_b = rng.standard_normal(4).astype(np.float32)
    table = np.linspace(-1, 1, 256, dtype=np.float32)
    idx = rng.integers(0, 256, 8).astype(np.uint8)
    fc_b = rng.standard_normal(2).astype(np.float32)
    blob = (struct.pack("<I", TAG_FP16) + conv_w.tobytes() + conv_b.tobytes()
            + struct.pack("<I", 0x00000101) + table.tobytes() + idx.tobytes() + fc_b.tobytes())
    (tmp_path / "net.bin").write_bytes(blob)
    layers = read_param(param)
    read_bin(layers, tmp_path / "net.bin")
    np.testing.assert_array_equal(layers[1].weights[0], conv_w.astype(np.float32))
    np.testing.assert_array_equal(layers[1].weights[1], conv_b)
    np.testing.assert_array_equal(layers[3].weights[0], table[idx])
    assert all(w.dtype == np.float32 and w.ndim == 1 for w in layers[1].weights)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="cannot read"):
        load_model(tmp_path / "absent.param")
    bad = tmp_path / "bad.param"
    bad.write_bytes(b"\xff\xfe7767517")
    with pytest.raises(ModelFormatError, match="UTF-8"):
        load_model(bad)
