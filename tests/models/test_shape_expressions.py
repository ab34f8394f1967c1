"""ncnn shape expressions (Reshape param 6, as pnnx writes them): parsing, evaluation and the
errors for bad ones, without I/O. Expected values were taken from the ncnn package
(tests/devices/test_pnnx_shape_layers.py runs the same forms against it)."""

from __future__ import annotations

import pytest

from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import build_graph, parse_param_text
from vkserve.models.layers import ReshapeParams
from vkserve.models.shape_expr import ExpressionError, ShapeExpression, tokenize

# one input of ncnn dims (w, h, d, c) = (5, 4, 1, 3), i.e. numpy (3, 4, 5)
BLOB = (5, 4, 1, 3)


@pytest.mark.parametrize("text,want", [
    ("0w,-1", [5, -1]),
    ("-1", [-1]),
    ("0c,0h,0w", [3, 4, 5]),
    ("*(0w,0h),0c", [20, 3]),
    ("//(0c,1),-1,2", [3, -1, 2]),
    ("/(0w,2),-1", [2, -1]),  # float 2.5, truncated
    ("+(0w,1),-(0h,1),-1", [6, 3, -1]),
    ("max(0w,2),min(0h,2)", [5, 2]),
    ("1,1,//(60,0n),0n", [1, 1, 60, 1]),
    ("//(-7,2)", [-3]),  # C division truncates
    ("//(7,2.0)", [3]),  # "2.0" reads as the int 2
    ("//(7.5,2)", [3]),  # a float operand floors
    ("ceil(/(0w,2))", [3]),
    ("round(/(0w,2))", [3]),
    ("floor(/(0w,2))", [2]),
    ("neg(0h),abs(-3),square(0c)", [-4, 3, 9]),
    ("and(6,3),lshift(1,3)", [2, 8]),
    ("0d", [1]),
])
def test_evaluate(text: str, want: list[int]) -> None:
    expr = ShapeExpression(text)
    assert len(expr) == len(want)
    assert expr.evaluate([BLOB]) == want


def test_tokens_and_blob_count() -> None:
    assert tokenize("//(0w,2),*(1h,2),0c") == ["//", "0w", "2", "*", "1h", "2", "0c"]
    assert ShapeExpression("0w,1h,1c").blob_count == 2
    assert ShapeExpression("-1").blob_count == 0
    assert ShapeExpression("0w,1h,1c").evaluate([BLOB, (3, 6, 1, 2)]) == [5, 6, 2]


@pytest.mark.parametrize("text,message", [
    ("", "empty"),
    ("0w,foo", "unknown token 'foo'"),
    ("+(0w)", "lacks operands"),
    ("*", "lacks operands"),
    ("0x", "unknown token"),
])
def test_malformed(text: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        ShapeExpression(text)


def test_evaluation_errors() -> None:
    with pytest.raises(ExpressionError, match="divide by zero"):
        ShapeExpression("//(0w,0)").evaluate([BLOB])
    with pytest.raises(ExpressionError, match="reads input 1"):
        ShapeExpression("1w").evaluate([BLOB])


def _text(line: str, extra: tuple[str, ...] = ()) -> str:
    body = ["Input data 0 1 data 0=5 1=4 2=3", *extra, line]
    return "7767517\n" + f"{len(body)} 4\n" + "\n".join(body) + "\n"


@pytest.mark.parametrize("line,message", [
    ('Reshape bad 1 1 data out 6="0w,bogus"', "unknown token 'bogus'"),
    ('Reshape bad 1 1 data out 6="+(1)"', "lacks operands"),
    ('Reshape bad 1 1 data out 6="1,1,1,1,-1"', "gives 5 values"),
    ('Reshape bad 1 1 data out 6=3', "expected string"),
])
def test_bad_expression_names_file_line_and_layer(line: str, message: str) -> None:
    with pytest.raises(ModelFormatError) as info:
        parse_param_text(_text(line), "m.param")
    text = str(info.value)
    assert "m.param line 4" in text and "layer 'bad'" in text and message in text, text


def test_expression_reading_a_second_input_needs_it() -> None:
    with pytest.raises(ModelFormatError, match=r"m.param line 4 .*takes at least 2 input"):
        parse_param_text(_text('Reshape bad 1 1 data out 6="0w,1h,1c"'), "m.param")


@pytest.mark.parametrize("line,shape", [
    ('Reshape r 1 1 data out 6="0w,-1"', (12, 5)),
    ('Reshape r 1 1 data out 6="0w,0,-1"', (3, 4, 5)),
    ('Reshape r 1 1 data out 6="0w,2,//(0h,2),0c"', (3, 2, 2, 5)),
])
def test_shape_inference(line: str, shape: tuple[int, ...]) -> None:
    layers = parse_param_text(_text(line), "m.param")
    assert isinstance(layers[-1].params, ReshapeParams)
    assert build_graph(layers, "m.param").blob_shapes["out"] == shape


def test_impossible_target_names_file_line_and_layer() -> None:
    layers = parse_param_text(_text('Reshape bad 1 1 data out 6="7,-1"'), "m.param")
    with pytest.raises(ModelFormatError, match=r"m.param line 4 \(layer 'bad' Reshape\).*infer -1"):
        build_graph(layers, "m.param")


@pytest.mark.parametrize("line,shape", [
    ('Reshape r 1 1 data out 12=0 13=0 6="1,1,//(60,0n),0n"', (60, 1, 1)),
    ('Reshape r 1 1 data out 12=1 13=0 6="-1,0,0n"', (1, 60)),
    ('Reshape r 1 1 data out 12=0 6="-1,0n"', (1, 60)),
    ('Reshape r 1 1 data out 13=0 6="-1,0n"', (60,)),
    ("Reshape r 1 1 data out 12=0 13=0 0=-1 1=1 2=1", (1, 60)),
])
def test_batch_reshape_of_one(line: str, shape: tuple[int, ...]) -> None:
    """ncnn's batch reshape (params 12 / 13) with the batch of 1 the engines run (shapes as the
    ncnn package gives them)."""
    layers = parse_param_text(_text(line), "m.param")
    assert build_graph(layers, "m.param").blob_shapes["out"] == shape


@pytest.mark.parametrize("line", [
    'Reshape bad 1 1 data out 12=0 13=0 6="-1,2"',  # a batch of 2
    "Reshape bad 1 1 data out 12=0 13=0 0=0 1=1 2=-1",  # a batch of 15
])
def test_batch_reshape_to_a_larger_batch_is_refused(line: str) -> None:
    layers = parse_param_text(_text(line), "m.param")
    with pytest.raises(ModelFormatError, match=r"m.param line 4 \(layer 'bad' Reshape\).*batch of"):
        build_graph(layers, "m.param")


@pytest.mark.parametrize("line,extra,shape", [
    ('Interp i 1 1 data out 0=2 9="*(0w,2),*(0h,2)"', (), (3, 8, 10)),
    ('Interp i 1 1 data out 0=1 9="+(0w,3)"', (), (3, 4, 8)),  # outw alone: outh = h
    ('Interp i 2 1 data ref out 0=2 9="1w,*(0h,2)"', ("Input ref 0 1 ref 0=9 1=7 2=2",), (3, 8, 9)),
    ('Crop c 1 1 data out 19="1,0" 20="-(0c,1),-1" 21="0,-1"', (), (1, 4, 4)),
    ('Crop c 1 1 data out 19="1" 20="-233" 21="-2"', (), (3, 3, 5)),
    ('Crop c 2 1 data ref out 19="0,1" 20="1h,+(1w,1)" 21="1,2"',
     ("Input ref 0 1 ref 0=3 1=2",), (3, 2, 3)),
])
def test_interp_and_crop_expressions(line: str, extra: tuple[str, ...],
                                     shape: tuple[int, ...]) -> None:
    """Interp's size expression (param 9: outw[, outh]) and Crop's starts / ends / axes
    expressions (params 19 / 20 / 21), over the first input (5 x 4 x 3) and a reference."""
    layers = parse_param_text(_text(line, extra), "m.param")
    assert build_graph(layers, "m.param").blob_shapes["out"] == shape


@pytest.mark.parametrize("line,message", [
    ('Interp bad 1 1 data out 0=1 9="0w,0h,0c"', "param 9: size expression '0w,0h,0c' gives 3"),
    ('Interp bad 1 1 data out 0=1 9="+(0w)"', "param 9"),
    ('Crop bad 1 1 data out 20="-1"', "params 19 / 20"),
    ('Crop bad 1 1 data out 19="0" 20="bogus(0w)"', "param 20"),
])
def test_bad_interp_and_crop_expressions(line: str, message: str) -> None:
    with pytest.raises(ModelFormatError) as info:
        parse_param_text(_text(line), "m.param")
    assert "m.param line 4" in str(info.value) and message in str(info.value), str(info.value)


def test_interp_expression_reading_a_second_input_needs_it() -> None:
    with pytest.raises(ModelFormatError, match=r"m.param line 4 .*2 input"):
        parse_param_text(_text('Interp bad 1 1 data out 0=1 9="1w,1h"'), "m.param")
