"""Graph IR of an ncnn model: parse a .param, read a .bin, infer blob shapes.

A .param file is (docs/developer-guide/param-and-model-file-structure.md):

    7767517
    <layer count> <blob count>
    <type> <name> <n inputs> <n outputs> <input blobs...> <output blobs...> <key=value...>

ncnn reads exactly <layer count> layer lines and ignores anything after them (a warning here).
The .bin holds each layer's weights in layer order, in the order the layer's ``load_model``
reads them (see ``LayerParams.weight_specs``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence

import numpy as np

from vkserve.models.binfile import StoredWeights, read_bin
from vkserve.models.errors import ModelFormatError, Where
from vkserve.models.layers import LAYER_TYPES, LayerParams, Shape, ShapeError
from vkserve.models.paramdict import parse_paramdict
from vkserve.models.randinit import random_weights

log = logging.getLogger(__name__)

MAGIC = "7767517"


@dataclasses.dataclass
class Layer:
    """One layer: ``weights`` are flat float32 arrays in ncnn load order (fp16 widened); from a
    .bin they are `StoredWeights`, read from the file each time one is indexed."""

    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: LayerParams
    weights: Sequence[np.ndarray]
    line: int

    def where(self, file: str) -> Where:
        return Where(file, self.line, self.name, self.type)

    def weight_elements(self) -> int:
        """Values in the layer's weights (stored ones are not read)."""
        if isinstance(self.weights, StoredWeights):
            return self.weights.elements
        return sum(int(np.asarray(w).size) for w in self.weights if w is not None)


@dataclasses.dataclass
class Graph:
    """Layers in topological order (file order, validated), model inputs/outputs, blob shapes."""

    layers: list[Layer]
    input_names: list[str]
    output_names: list[str]
    blob_shapes: dict[str, Shape]
    file: str = ""


# ---------------------------------------------------------------------------------------------
# .param


def _int_token(token: str, what: str, where: Where) -> int:
    try:
        value = int(token, 10)
    except ValueError:
        raise ModelFormatError.at(where, f"{what}: expected an integer, got {token!r}") from None
    if value < 0:
        raise ModelFormatError.at(where, f"{what}: must not be negative, got {value}")
    return value


def parse_param_text(text: str, file: str) -> list[Layer]:
    """Parse .param text into validated layers (no weights yet).

    Checks: magic, counts, line syntax, param types, unknown layer types (all named in one
    error), input/output counts per type, unique layer names, each blob produced exactly once and
    consumed only after it is produced.
    """
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise ModelFormatError(file, None, None, "empty .param file")
    n, first = lines[0]
    if first.split() != [MAGIC]:
        raise ModelFormatError(file, n, None, f"bad magic {first.strip()[:40]!r}, expected {MAGIC}")
    if len(lines) < 2:
        raise ModelFormatError(file, n, None, "missing '<layer count> <blob count>' line")
    n, counts = lines[1]
    count_tokens = counts.split()
    where = Where(file, n)
    if len(count_tokens) != 2:
        raise ModelFormatError.at(where, "expected '<layer count> <blob count>'")
    layer_count = _int_token(count_tokens[0], "layer count", where)
    blob_count = _int_token(count_tokens[1], "blob count", where)
    if layer_count == 0 or blob_count == 0:
        raise ModelFormatError.at(where, "layer count and blob count must be positive")
    body = lines[2:]
    if len(body) < layer_count:
        raise ModelFormatError(
            file, None, None, f"header declares {layer_count} layers, file has {len(body)}"
        )
    if len(body) > layer_count:
        log.warning(
            "%s: %d line(s) after the %d declared layers are ignored (as ncnn does), from line %d",
            file, len(body) - layer_count, layer_count, body[layer_count][0],
        )

    layers: list[Layer] = []
    unknown: list[tuple[str, int, str]] = []  # (type, line, layer name)
    for n, line in body[:layer_count]:
        layer = _parse_layer_line(line, n, file, unknown)
        if layer is not None:
            layers.append(layer)
    if unknown:
        listed = "; ".join(f"{t} (line {n}, layer {name!r})" for t, n, name in unknown)
        raise ModelFormatError(
            file, unknown[0][1], unknown[0][2],
            f"unknown layer type(s): {listed} (supported: {', '.join(sorted(LAYER_TYPES))})",
            unknown[0][0],
        )
    _check_blobs(layers, blob_count, file)
    return layers


def _parse_layer_line(
    line: str, n: int, file: str, unknown: list[tuple[str, int, str]]
) -> Layer | None:
    tokens = line.split()
    where = Where(file, n)
    if len(tokens) < 4:
        raise ModelFormatError.at(
            where, "expected '<type> <name> <n inputs> <n outputs> <blobs...> <params...>'"
        )
    layer_type, name = tokens[0], tokens[1]
    where = Where(file, n, name, layer_type)
    num_in = _int_token(tokens[2], "input count", where)
    num_out = _int_token(tokens[3], "output count", where)
    if len(tokens) < 4 + num_in + num_out:
        raise ModelFormatError.at(
            where, f"declares {num_in} inputs and {num_out} outputs, line has "
            f"{len(tokens) - 4} names"
        )
    inputs = tokens[4 : 4 + num_in]
    outputs = tokens[4 + num_in : 4 + num_in + num_out]
    for blob in inputs + outputs:
        if "=" in blob:
            raise ModelFormatError.at(where, f"blob name {blob!r} looks like a param (counts wrong?)")
    pd = parse_paramdict(tokens[4 + num_in + num_out :], where)
    cls = LAYER_TYPES.get(layer_type)
    if cls is None:
        unknown.append((layer_type, n, name))
        return None
    params = cls.from_paramdict(pd, where)
    (min_in, max_in), (min_out, max_out) = params.arity()
    if num_in < min_in or (max_in is not None and num_in > max_in):
        raise ModelFormatError.at(where, f"takes {_range(min_in, max_in)} input(s), got {num_in}")
    if num_out < min_out or (max_out is not None and num_out > max_out):
        raise ModelFormatError.at(
            where, f"produces {_range(min_out, max_out)} output(s), got {num_out}"
        )
    return Layer(layer_type, name, inputs, outputs, params, [], n)


def _range(lo: int, hi: int | None) -> str:
    if hi is None:
        return f"at least {lo}"
    return str(lo) if lo == hi else f"{lo}..{hi}"


def _check_blobs(layers: Sequence[Layer], blob_count: int, file: str) -> None:
    """Blobs, not layer names, wire the graph: a layer name may repeat (ncnn accepts it, and
    pnnx writes duplicate `splitncnn_N` names); errors name the line as well as the layer."""
    producer: dict[str, Layer] = {}
    for layer in layers:
        where = layer.where(file)
        for blob in layer.inputs:
            if blob not in producer:
                raise ModelFormatError.at(
                    where, f"input blob {blob!r} is not produced by any earlier layer"
                )
        for blob in layer.outputs:
            if blob in producer:
                raise ModelFormatError.at(
                    where,
                    f"output blob {blob!r} already produced by layer {producer[blob].name!r} "
                    f"(line {producer[blob].line})",
                )
            producer[blob] = layer
    if len(producer) > blob_count:
        raise ModelFormatError(
            file, None, None, f"header declares {blob_count} blobs, layers use {len(producer)}"
        )


def read_param(param_path: str | os.PathLike[str]) -> list[Layer]:
    """Parse a .param file (see ``parse_param_text``)."""
    # Errors name the file by its base name, as parse_param_text's do: callers that know
    # where it lies (the model's folder) prefix that themselves.
    file = os.path.basename(os.fspath(param_path))
    try:
        with open(param_path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ModelFormatError(file, None, None, f"cannot read: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelFormatError(file, None, None, f"not UTF-8 text ({exc.reason})") from exc
    return parse_param_text(text, file)


# ---------------------------------------------------------------------------------------------
# shapes


def infer_shapes(
    layers: Sequence[Layer], file: str, input_shapes: dict[str, Shape] | None = None
) -> dict[str, Shape]:
    """Shapes of every blob; Input layers take ``input_shapes[blob]`` or their declared shape."""
    given = dict(input_shapes or {})
    input_blobs = {b for layer in layers if layer.type == "Input" for b in layer.outputs}
    for name, shape in given.items():
        if name not in input_blobs:
            raise ModelFormatError(
                file, None, None,
                f"input_shapes names {name!r}, not an Input blob (inputs: {sorted(input_blobs)})",
            )
        if not (1 <= len(shape) <= 4 and all(isinstance(n, int) and n > 0 for n in shape)):
            raise ModelFormatError(
                file, None, None, f"input shape {shape!r} for {name!r} must be 1..4 positive ints"
            )
    shapes: dict[str, Shape] = {}
    for layer in layers:
        try:
            if layer.type == "Input" and all(b in given for b in layer.outputs):
                outs = [tuple(given[b]) for b in layer.outputs]
            else:
                outs = layer.params.infer_shapes(
                    [shapes[b] for b in layer.inputs], len(layer.outputs)
                )
                outs = [given.get(b, s) for b, s in zip(layer.outputs, outs)]
        except ShapeError as exc:
            raise ModelFormatError.at(layer.where(file), f"shape inference: {exc}") from None
        if len(outs) != len(layer.outputs):
            raise ModelFormatError.at(
                layer.where(file), f"shape inference gave {len(outs)} shapes for "
                f"{len(layer.outputs)} outputs"
            )
        shapes.update(zip(layer.outputs, outs))
    return shapes


def build_graph(
    layers: list[Layer], file: str, input_shapes: dict[str, Shape] | None = None
) -> Graph:
    consumed = {b for layer in layers for b in layer.inputs}
    inputs = [b for layer in layers if layer.type == "Input" for b in layer.outputs]
    outputs = [b for layer in layers for b in layer.outputs if b not in consumed]
    return Graph(layers, inputs, outputs, infer_shapes(layers, file, input_shapes), file)


def load_model(
    param_path: str | os.PathLike[str],
    bin_path: str | os.PathLike[str] | None = None,
    input_shapes: dict[str, Shape] | None = None,
    seed: int = 0,
) -> Graph:
    """Parse, load weights (seeded random ones when ``bin_path`` is None, the same numbers
    ``vkserve.models.weights.write_random_bin`` writes) and infer shapes."""
    layers = read_param(param_path)
    if bin_path is None:
        for layer, weights in zip(layers, random_weights(layers, seed)):
            layer.weights = weights
    else:
        read_bin(layers, bin_path)
    return build_graph(layers, os.path.basename(os.fspath(param_path)), input_shapes)
