"""Parsing the real ncnn benchmark architectures and the typed param forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import MODELS_DIR, PNNX_DIR
from vkserve.models.errors import ModelFormatError, Where
from vkserve.models.graph import load_model, parse_param_text
from vkserve.models.layers import (
    LAYER_TYPES,
    ConvolutionParams,
    CropParams,
    PermuteParams,
    PoolingParams,
    Yolov3DetectionOutputParams,
    binary_broadcast_shape,
)
from vkserve.models.paramdict import parse_paramdict

PARAMS = sorted(MODELS_DIR.glob("*.param"))
WHERE = Where("t.param", 3, "l", "T")

REQUIRED_TYPES = {
    "Clip", "Flatten", "Padding", "Dropout", "Noop", "Crop", "Interp", "LRN", "Permute", "Reshape",
    "Slice", "Softmax", "Yolov3DetectionOutput", "ReLU", "Sigmoid", "Swish", "HardSigmoid",
    "HardSwish", "ShuffleChannel", "BinaryOp", "Eltwise", "Concat", "Split", "Pooling",
    "InnerProduct", "Convolution", "ConvolutionDepthWise", "Input",
}


def _shape_hints(path: Path) -> dict[str, tuple[int, ...]]:
    """The -23330 per-output shape hints ncnn's converter writes (dims, w, h, c)."""
    hints = {}
    for line in path.read_text().splitlines()[2:]:
        tokens = line.split()
        n_in, n_out = int(tokens[2]), int(tokens[3])
        outs = tokens[4 + n_in : 4 + n_in + n_out]
        for tok in tokens:
            if tok.startswith("-23330="):
                values = [int(v) for v in tok.split("=")[1].split(",")[1:]]
                step = len(values) // n_out
                for j, blob in enumerate(outs):
                    dims, w, h, c = values[j * step : j * step + 4]
                    hints[blob] = {1: (w,), 2: (h, w), 3: (c, h, w)}[dims]
    return hints


def test_models_folder_present() -> None:
    assert len(PARAMS) >= 12


def test_registry_covers_required_and_used_types() -> None:
    used = {line.split()[0] for p in PARAMS for line in p.read_text().splitlines()[2:] if line}
    assert REQUIRED_TYPES | used <= set(LAYER_TYPES)
    for name, cls in LAYER_TYPES.items():
        assert cls.__name__ == f"{name}Params"


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.stem)
def test_real_model_parses_and_matches_shape_hints(path: Path) -> None:
    graph = load_model(path)
    assert graph.input_names and graph.output_names
    produced = [b for layer in graph.layers for b in layer.outputs]
    assert len(produced) == len(set(produced)) == len(graph.blob_shapes)
    for layer in graph.layers:
        assert [w.size for w in layer.weights] == [s.count for s in layer.params.weight_specs()]
    hints = _shape_hints(path)
    detection = {b for layer in graph.layers if layer.type == "Yolov3DetectionOutput"
                 for b in layer.outputs}
    for blob, hint in hints.items():
        if blob not in graph.blob_shapes:
            continue  # lines after the declared layer count (ncnn ignores them)
        if blob in detection:  # data-dependent row count: ours is the upper bound
            assert graph.blob_shapes[blob][1] == hint[1] and graph.blob_shapes[blob][0] >= hint[0]
        else:
            assert graph.blob_shapes[blob] == hint, blob


def test_input_shapes_override_resolution() -> None:
    graph = load_model(MODELS_DIR / "mobilenet.param", input_shapes={"data": (3, 160, 160)})
    assert graph.blob_shapes["data"] == (3, 160, 160)
    assert graph.blob_shapes["output"] == (1000,)
    assert graph.blob_shapes["conv6/sep_relu6/sep"] == (1024, 5, 5)


def test_input_without_dims_needs_given_shape() -> None:
    text = "7767517\n2 2\nInput in 0 1 x\nReLU r 1 1 x y\n"
    layers = parse_param_text(text, "t.param")
    from vkserve.models.graph import build_graph

    with pytest.raises(ModelFormatError, match="input_shapes") as info:
        build_graph(layers, "t.param")
    assert info.value.line == 3 and info.value.layer == "in"
    assert build_graph(layers, "t.param", {"x": (2, 5, 7)}).blob_shapes["y"] == (2, 5, 7)


def test_paramdict_forms() -> None:
    pd = parse_paramdict(
        ["0=3", "1=2.5", "2=1e-3", "-23303=3,1,2.0,-3", "4=0.5,0.25", "5=hello", "-23330=0"], WHERE
    )
    assert pd[0] == 3 and isinstance(pd[0], int)
    assert pd[1] == 2.5 and pd[2] == pytest.approx(1e-3)
    assert pd[3] == [1, 2.0, -3] and isinstance(pd[3][0], int) and isinstance(pd[3][1], float)
    assert pd[4] == [0.5, 0.25]
    assert pd[5] == "hello"
    assert pd[30] == []


@pytest.mark.parametrize(
    "token, message",
    [("0=", "empty value"), ("x=1", "not an integer"), ("32=1", "outside 0..31"),
     ("-23300=3,1,2", "declares 3 elements, has 2"), ("0=1.2.3", "malformed float"),
     ("0=12abc", "malformed number"), ("0=99999999999", "int32"), ("0=1e99", "float32"),
     ("0", "key=value")],
)
def test_paramdict_errors(token: str, message: str) -> None:
    with pytest.raises(ModelFormatError, match=message):
        parse_paramdict([token], WHERE)


def test_duplicate_param_id() -> None:
    with pytest.raises(ModelFormatError, match="given twice"):
        parse_paramdict(["0=1", "0=2"], WHERE)


def test_convolution_defaults_and_fallbacks() -> None:
    p = ConvolutionParams.from_paramdict(parse_paramdict("0=8 1=3 3=2 4=1 6=216".split(), WHERE),
                                         WHERE)
    assert (p.kernel_w, p.kernel_h, p.stride_w, p.stride_h) == (3, 3, 2, 2)
    assert (p.pad_left, p.pad_right, p.pad_top, p.pad_bottom) == (1, 1, 1, 1)
    assert (p.dilation_w, p.dilation_h, p.bias_term, p.activation_type) == (1, 1, 0, 0)
    assert p.infer_shapes([(3, 224, 224)]) == [(8, 112, 112)]
    asym = ConvolutionParams.from_paramdict(
        parse_paramdict("0=4 1=3 11=5 4=1 14=2 6=36".split(), WHERE), WHERE)
    assert (asym.kernel_h, asym.pad_right, asym.pad_top, asym.pad_bottom) == (5, 1, 2, 2)
    direct = ConvolutionParams(num_output=2, kernel_w=3, weight_data_size=18)
    assert direct.kernel_h == 3 and direct.pad_bottom == 0


def test_convolution_same_padding() -> None:
    p = ConvolutionParams(num_output=1, kernel_w=3, stride_w=2, pad_left=-233,
                          weight_data_size=9)
    assert p.infer_shapes([(1, 7, 8)]) == [(1, 4, 4)]


def test_pooling_pad_modes() -> None:
    full = PoolingParams(kernel_w=3, stride_w=2)
    assert full.infer_shapes([(4, 6, 6)]) == [(4, 3, 3)]  # full mode pads the tail
    valid = PoolingParams(kernel_w=3, stride_w=2, pad_mode=1)
    assert valid.infer_shapes([(4, 6, 6)]) == [(4, 2, 2)]
    same = PoolingParams(kernel_w=3, stride_w=2, pad_mode=2)
    assert same.infer_shapes([(4, 7, 6)]) == [(4, 4, 3)]
    assert PoolingParams(global_pooling=1).infer_shapes([(4, 7, 6)]) == [(4,)]


def test_binaryop_broadcast_rules() -> None:
    assert binary_broadcast_shape((8, 5, 5), (8,))[2] == (8, 5, 5)  # per channel
    assert binary_broadcast_shape((3,), (8, 5, 3))[0] == (1, 1, 3)  # along w
    assert binary_broadcast_shape((8, 5), (8, 5, 4))[0] == (8, 5, 1)
    assert binary_broadcast_shape((8, 1, 1), (8, 5, 5))[2] == (8, 5, 5)


def test_permute_numpy_axes() -> None:
    assert PermuteParams(order_type=1).numpy_axes(2) == (1, 0)
    assert PermuteParams(order_type=3).numpy_axes(3) == (1, 2, 0)  # c w h: out w=c, h=w, c=h
    assert PermuteParams(order_type=3).infer_shapes([(2, 3, 4)]) == [(3, 4, 2)]


def test_crop_numpy_style_and_reference() -> None:
    p = CropParams(starts=(58,), ends=(116,), axes=(0,))
    assert p.infer_shapes([(116, 40, 40)]) == [(58, 40, 40)]
    assert CropParams(starts=(-233,), ends=(-1,), axes=(-1,)).infer_shapes([(2, 3, 9)]) == [
        (2, 3, 8)]
    ref = CropParams(woffset=1, hoffset=1)
    assert ref.uses_reference() and ref.infer_shapes([(4, 9, 9), (2, 5, 6)]) == [(2, 5, 6)]


def test_yolov3_mask_int_bits_read_as_floats() -> None:
    pd = parse_paramdict(
        "0=80 1=3 -23304=12,10,14,23,27,37,58,81,82,135,169,344,319 "
        "-23305=6,1077936128,1082130432,1084227584,1065353216,1073741824,1077936128 "
        "-23306=2,33.6,16.8".split(), WHERE)
    p = Yolov3DetectionOutputParams.from_paramdict(pd, WHERE)
    assert p.mask == (3.0, 4.0, 5.0, 1.0, 2.0, 3.0)
    assert p.infer_shapes([(255, 13, 13), (255, 26, 26)]) == [(3 * (13 * 13 + 26 * 26), 6)]


@pytest.mark.parametrize("param", sorted(PNNX_DIR.glob("*.param")), ids=lambda p: p.stem)
def test_pnnx_exports_load_or_name_file_line_and_layer(param: Path) -> None:
    """pnnx exports (no Input shape, Reshape expressions, layers not yet implemented) either load
    or are refused with an error that names the file, the line and the layer."""
    assert param.read_text().startswith("7767517\n")
    try:
        graph = load_model(param, None)
    except ModelFormatError as e:
        assert param.name in str(e) and " line " in str(e) and "layer '" in str(e), str(e)
    else:
        assert graph.layers
