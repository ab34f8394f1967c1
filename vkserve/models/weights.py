"""Write .bin files in exactly the layout ncnn's ModelBin reads.

Per layer in file order, per weight in ``load_model`` order: a *flagged* weight is the 4-byte
little-endian storage tag 0x00000000 (float32) followed by its float32 data; an unflagged one
(biases, per-channel pad data) is plain float32. Everything is 4-byte aligned by construction.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

import numpy as np

from vkserve.models.binfile import TAG_FP32
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph, Layer, read_param
from vkserve.models.randinit import random_weights


def bin_size(layers: Sequence[Layer]) -> int:
    """Bytes of the float32 .bin for these layers (4 per element, plus 4 per flagged weight)."""
    return sum(
        4 * spec.count + (4 if spec.flagged else 0)
        for layer in layers
        for spec in layer.params.weight_specs()
    )


def write_bin(layers: Sequence[Layer], bin_path: str | os.PathLike[str]) -> None:
    """Write the layers' own ``weights`` (float32; flagged ones tagged fp32)."""
    chunks: list[bytes] = []
    for layer in layers:
        specs = layer.params.weight_specs()
        if len(layer.weights) != len(specs):
            raise ModelFormatError(
                os.fspath(bin_path), layer.line, layer.name,
                f"has {len(layer.weights)} weight arrays, its params need {len(specs)}",
                layer.type,
            )
        for spec, weight in zip(specs, layer.weights):
            data = np.ascontiguousarray(weight, dtype="<f4").reshape(-1)
            if data.size != spec.count:
                raise ModelFormatError(
                    os.fspath(bin_path), layer.line, layer.name,
                    f"{spec.name} has {data.size} elements, params say {spec.count}", layer.type,
                )
            if spec.flagged:
                chunks.append(struct.pack("<I", TAG_FP32))
            chunks.append(data.tobytes())
    tmp = f"{os.fspath(bin_path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(chunks))
    os.replace(tmp, bin_path)


def write_random_bin(
    graph_or_param_path: Graph | str | os.PathLike[str],
    bin_path: str | os.PathLike[str],
    seed: int = 0,
) -> None:
    """Write seeded random weights for a model: the same numbers ``load_model(param, None,
    seed=seed)`` uses, so vkserve and ncnn load identical weights."""
    if isinstance(graph_or_param_path, Graph):
        layers = list(graph_or_param_path.layers)
    else:
        layers = read_param(graph_or_param_path)
    rows = random_weights(layers, seed)
    fresh = [
        Layer(l.type, l.name, l.inputs, l.outputs, l.params, w, l.line)
        for l, w in zip(layers, rows)
    ]
    write_bin(fresh, bin_path)
