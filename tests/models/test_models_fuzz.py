"""Fuzzing the .param reader: whatever the text, it parses or raises ModelFormatError."""

from __future__ import annotations

import dataclasses
import logging

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.paths import MODELS_DIR
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import build_graph, parse_param_text
from vkserve.models.layers import LAYER_TYPES

REAL_TEXTS = [p.read_text() for p in sorted(MODELS_DIR.glob("*.param"))]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

logging.getLogger("vkserve.models.graph").setLevel(logging.ERROR)


def _parse_only_own_errors(text: str) -> None:
    try:
        layers = parse_param_text(text, "fuzz.param")
        build_graph(layers, "fuzz.param")
    except ModelFormatError as exc:
        assert exc.file == "fuzz.param" and exc.message


@FUZZ
@given(st.text(max_size=400))
def test_arbitrary_text(text: str) -> None:
    _parse_only_own_errors(text)


@FUZZ
@given(st.text(alphabet="7651 \n=-,.eE0123456789abcInputReLU\t", max_size=300))
def test_arbitrary_param_like_text(text: str) -> None:
    _parse_only_own_errors("7767517\n" + text)


TOKENS = st.sampled_from(
    ["0", "1", "-1", "2", "3", "-233", "-234", "0.5", "1e-3", "-23300", "9999999", "x", "=", ",",
     "1,2", "-23309=1,0", "0=0", "1=3", "5=1", "6=27", "7=2", "\n", "  ", "abc", "3.5", "1e40",
     "-23330=4,3,8,8,3", "Convolution", "Split", "Input", "2147483648"]
)


@st.composite
def mutated_real_file(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(REAL_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "replace_token", "swap_lines", "dup_line"]))
        if kind in ("swap_lines", "dup_line"):
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if kind == "swap_lines":
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines.insert(j, lines[i])
            text = "\n".join(lines)
        elif kind == "replace_token":
            tokens = text.split(" ")
            i = draw(st.integers(0, len(tokens) - 1))
            tokens[i] = draw(TOKENS | st.text(max_size=6))
            text = " ".join(tokens)
        else:
            i = draw(st.integers(0, len(text)))
            if kind == "delete":
                text = text[:i] + text[i + draw(st.integers(1, 20)) :]
            else:
                text = text[:i] + draw(TOKENS | st.text(max_size=8)) + text[i:]
    return text


@FUZZ
@given(mutated_real_file())
def test_mutated_real_files(text: str) -> None:
    _parse_only_own_errors(text)


SMALL_INTS = st.integers(-3, 12) | st.sampled_from([-233, -234, 0, 1, 2])
VALUE_BY_KIND = {
    "int": SMALL_INTS.map(str),
    "float": st.floats(-4, 4, allow_nan=False).map(lambda f: f"{f:.4f}"),
    "ints": st.lists(SMALL_INTS, max_size=4).map(lambda v: ",".join(map(str, [len(v), *v]))),
    "floats": st.lists(st.floats(-4, 4, allow_nan=False), max_size=13).map(
        lambda v: ",".join([str(len(v)), *(f"{f:.3f}" for f in v)])),
    # shape expressions (Reshape param 6): random token sequences, well-formed or not
    "str": st.lists(st.sampled_from(["0w", "0h", "0c", "0d", "0n", "1w", "-1", "0", "2", "2.5",
                                     "+", "*", "//", "/", "max", "neg", "round", "bad"]),
                    min_size=1, max_size=7).map(lambda v: '"' + ",".join(v) + '"'),
}


@st.composite
def one_layer_model(draw: st.DrawFn) -> str:
    """Input of random shape feeding one layer of a random type with well-typed random params
    (so most examples get through parsing and exercise shape inference)."""
    dims = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    shape = " ".join(f"{k}={v}" for k, v in zip((0, 1, 2), dims))
    layer_type = draw(st.sampled_from(sorted(LAYER_TYPES)))
    n_in = draw(st.sampled_from([1, 1, 1, 2, 3, 0]))
    n_out = draw(st.sampled_from([1, 1, 1, 2, 3, 0]))
    ins = " ".join(["x"] * n_in)
    outs = " ".join(f"y{i}" for i in range(n_out))
    tokens = []
    for f in dataclasses.fields(LAYER_TYPES[layer_type]):
        if f.metadata and draw(st.booleans()):
            pid, kind = f.metadata["pid"], f.metadata["kind"]
            key = -23300 - pid if kind in ("ints", "floats") else pid
            tokens.append(f"{key}={draw(VALUE_BY_KIND[kind])}")
    return (f"7767517\n2 9\nInput in 0 1 x {shape}\n"
            f"{layer_type} l {n_in} {n_out} {ins} {outs} {' '.join(tokens)}\n")


@settings(max_examples=1500, deadline=None)
@given(one_layer_model())
def test_random_single_layers(text: str) -> None:
    _parse_only_own_errors(text)
