"""Turn an ONNX or TorchScript model into a vkserve model folder with pnnx (``vkserve import``).

pnnx (``pip install --no-deps pnnx``; its executable converts ONNX without torch, TorchScript
needs torch beside it) writes ``NAME.ncnn.param``/``NAME.ncnn.bin`` and its own files next to
the model it reads, so it runs in a scratch folder on a link to the source. Its graph
(``NAME.pnnx.param``) records every input's traced shape (``pnnx.Input in0 ... #0=(1,3,8,8)f32``),
which becomes the folder's ``[inputs]`` in ncnn order (the batch of 1 dropped) unless given;
the ncnn graph names the inputs ``in0``, ``in1``, ... in the same order.
Weights stay fp32 (pnnx's default would store fp16).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from vkserve.models.graph import read_param

__all__ = ["LABELS", "PNNX_INSTALL", "SOURCE_KINDS", "ConversionFailed", "Converted", "ImportProblem", "PnnxNotFound",
           "Preprocessing", "config_toml", "convert", "find_pnnx", "pnnx_input_shapes", "write_folder"]

Shape = tuple[int, ...]

#: Source suffix -> the suffix pnnx needs to read it (it decides ONNX vs TorchScript by it).
SOURCE_KINDS = {".onnx": ".onnx", ".pt": ".pt", ".torchscript": ".pt"}
PNNX_INSTALL = ("pnnx is not installed: `pip install --no-deps pnnx` (converts ONNX; its "
                "executable needs no torch), or `pip install 'vkserve[import]'` (pnnx with torch, "
                "for TorchScript .pt), or put a pnnx executable on PATH")
OUTPUT_TAIL_LINES = 40
LABELS = "labels.txt"  # the --labels file's name in the model folder
_INPUT_NAME = re.compile(r"^in(\d+)$")
_OPTION_ECHO = re.compile(r"^[a-z0-9]+ = ")  # pnnx first echoes every option, one a line
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PNNX_INPUT = re.compile(r"^pnnx\.Input\s.*#\S+=\(([^)]*)\)")


class ImportProblem(Exception):
    """The request cannot be carried out as given (a usage error: exit status 2)."""


class PnnxNotFound(Exception):
    """No pnnx executable; the message says what to install."""

    def __init__(self) -> None:
        super().__init__(PNNX_INSTALL)


class ConversionFailed(Exception):
    """pnnx failed or wrote no ncnn graph; ``output`` holds the tail of what it printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """The ``[preprocess]`` keys given on the command line (None: not given)."""

    pixel_format: str | None = None
    resize: tuple[int, int] | None = None
    mean: tuple[float, ...] | None = None
    norm: tuple[float, ...] | None = None

    def given(self) -> bool:
        return any(v is not None for v in dataclasses.astuple(self))


@dataclasses.dataclass(frozen=True)
class Converted:
    """pnnx's ncnn files in the scratch folder and the traced input shapes (ncnn order)."""

    param: Path
    bin: Path
    input_shapes: dict[str, Shape | None]


def find_pnnx() -> Path:
    """The pnnx executable: the native one inside the ``pnnx`` package of this Python (found
    without importing the package, which imports torch), else ``pnnx`` next to
    ``sys.executable``, else on PATH."""
    spec = importlib.util.find_spec("pnnx")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        native = Path(folder) / "pnnx"
        if native.is_file() and os.access(native, os.X_OK):
            return native
    beside = Path(sys.executable).parent / "pnnx"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("pnnx")
    if found is None:
        raise PnnxNotFound()
    return Path(found)


def ordered_shapes(shapes: Mapping[str, Shape]) -> list[Shape]:
    """``--shape`` values in pnnx's input order (in0, in1, ...); names must be exactly those."""
    indices: dict[int, str] = {}
    for name in shapes:
        m = _INPUT_NAME.match(name)
        if m is None:
            raise ImportProblem(f"--shape {name}=...: pnnx names the inputs in0, in1, ... in the "
                                "order the model takes them; use those names")
        indices[int(m.group(1))] = name
    if sorted(indices) != list(range(len(indices))):
        raise ImportProblem(f"--shape gives {', '.join(sorted(shapes))}: pnnx needs the shapes "
                            "of in0 .. inN without gaps")
    return [shapes[indices[i]] for i in range(len(indices))]


def pnnx_command(pnnx: Path, source: Path, shapes: Sequence[Shape]) -> list[str]:
    """The pnnx command line for ``source`` in its folder, with a batch of 1 per input."""
    command = [str(pnnx), source.name, "fp16=0"]
    if shapes:
        command.append("inputshape=" + ",".join(f"[1,{','.join(map(str, s))}]" for s in shapes))
    return command


def pnnx_input_shapes(pnnx_param: str) -> list[Shape | None]:
    """The traced shape of each input, in order, in ncnn order (batch dropped), from pnnx's
    ``.pnnx.param``; None where a dimension is dynamic or the batch is not 1."""
    shapes: list[Shape | None] = []
    for line in pnnx_param.splitlines():
        m = _PNNX_INPUT.match(line)
        if m is None:
            continue
        dims = [d.strip() for d in m.group(1).split(",") if d.strip()]
        ok = len(dims) >= 2 and all(d.isdigit() for d in dims) and dims[0] == "1"
        shapes.append(tuple(int(d) for d in dims[1:]) if ok else None)
    return shapes


def _ncnn_input_names(param: Path) -> list[str]:
    """The blobs of the ncnn graph's Input layers, in order (in0, in1, ...)."""
    return [b for layer in read_param(param) if layer.type == "Input" for b in layer.outputs]


def _tail(text: str) -> str:
    """What pnnx printed, less the echo of its options and colour codes, last lines only."""
    lines = [_ANSI.sub("", line) for line in text.rstrip().splitlines() if not _OPTION_ECHO.match(line)]
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])


def convert(pnnx: Path, source: Path, shapes: Mapping[str, Shape], scratch: Path) -> Converted:
    """Run pnnx on ``source`` inside ``scratch`` (blocking)."""
    link = scratch / f"model{SOURCE_KINDS[source.suffix.lower()]}"
    link.symlink_to(source.resolve())
    command = pnnx_command(pnnx, link, ordered_shapes(shapes))
    try:
        done = subprocess.run(command, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", check=False)
    except OSError as exc:
        raise ConversionFailed(f"cannot run {pnnx}: {exc}", "") from None
    param, weights = scratch / "model.ncnn.param", scratch / "model.ncnn.bin"
    pnnx_param = scratch / "model.pnnx.param"
    # pnnx exits 0 even when it could not write its files, so the files decide
    if done.returncode != 0 or not (param.is_file() and weights.is_file() and pnnx_param.is_file()):
        how = ("wrote no ncnn graph" if done.returncode == 0 else f"killed by signal {-done.returncode}"
               if done.returncode < 0 else f"exit status {done.returncode}")
        raise ConversionFailed(f"pnnx failed on {source} ({how})", _tail(done.stdout))
    names = _ncnn_input_names(param)
    traced = pnnx_input_shapes(pnnx_param.read_text(errors="replace"))
    if len(traced) != len(names):  # pnnx's two graphs disagree: trust neither's shapes
        traced = [None] * len(names)
    return Converted(param, weights, dict(zip(names, traced)))


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for the names and paths written here
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def config_toml(source: Path, inputs: Mapping[str, Shape], preprocess: Preprocessing,
                preprocess_input: str | None, labels: str | None) -> str:
    """The model folder's config.toml: [inputs], and [preprocess]/[postprocess] as given."""
    lines = [f"# imported from {source.name} by `vkserve import` (pnnx); keys: docs/MODELS.md",
             "", "[inputs]"]
    lines += [f"{name} = {_toml_value(shape)}" for name, shape in inputs.items()]
    if preprocess.given():
        lines += ["", "[preprocess]"]
        if preprocess_input is not None:
            lines.append(f"input = {_toml_value(preprocess_input)}")
        for key, value in dataclasses.asdict(preprocess).items():
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
    if labels is not None:
        lines += ["", "[postprocess]", 'kind = "topk"', f"labels = {_toml_value(labels)}"]
    return "\n".join(lines) + "\n"


def write_folder(converted: Converted, folder: Path, config: str, labels: Path | None) -> None:
    """A new model folder: model.param, model.bin, config.toml (and labels.txt)."""
    folder.mkdir(parents=True)
    shutil.copyfile(converted.param, folder / "model.param")
    shutil.copyfile(converted.bin, folder / "model.bin")
    (folder / "config.toml").write_text(config, encoding="utf-8")
    if labels is not None:
        shutil.copyfile(labels, folder / LABELS)
