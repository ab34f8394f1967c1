"""Which files of a model folder hold the graph and the weights.

A folder holds ``model.param`` + ``model.bin``, or one pair named as pnnx writes it,
``NAME.ncnn.param`` + ``NAME.ncnn.bin`` (so pnnx's output folder serves without renaming).
``model.param`` wins when both are there; two pnnx graphs and no ``model.param`` is ambiguous.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vkserve.models.errors import ModelFormatError

PARAM = "model.param"
PNNX_PARAM_SUFFIX = ".ncnn.param"


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    """The graph, and where its weights belong (``weights`` may not exist)."""

    param: Path
    weights: Path


def weights_beside(param: Path) -> Path:
    """``model.param`` -> ``model.bin``, ``net.ncnn.param`` -> ``net.ncnn.bin``."""
    return param.with_suffix(".bin")


def model_files(folder: Path) -> ModelFiles:
    """The folder's graph and weights; ModelFormatError (naming the folder) when it has no
    graph or several pnnx ones."""
    param = folder / PARAM
    if not param.is_file():
        found = sorted(p for p in folder.glob(f"*{PNNX_PARAM_SUFFIX}") if p.is_file())
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise ModelFormatError(folder.name, None, None,
                                   f"several pnnx graphs ({names}) and no {PARAM}: keep one, "
                                   f"or rename the one to serve {PARAM}")
        if not found:
            raise ModelFormatError(f"{folder.name}/{PARAM}", None, None,
                                   "missing (every model folder needs one, or one "
                                   f"NAME{PNNX_PARAM_SUFFIX} as pnnx writes it)")
        param = found[0]
    return ModelFiles(param, weights_beside(param))
