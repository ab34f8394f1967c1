"""`vkserve import`: an ONNX or TorchScript model -> a model folder (pnnx), checked by verify.

The folder (``DIR/NAME/``: model.param, model.bin, config.toml with ``[inputs]`` and the
``[preprocess]``/``[postprocess]`` given here, labels.txt) is assembled in a scratch folder,
scanned as the daemon scans it, and verified there with `vkserve verify`'s own command (same
flags, same output); it lands in DIR only when the model loads. Exit status: 0 imported and
verify ok; 1 pnnx failed, the model does not load, or verify found a mismatch (the folder is
then kept, for a look); 2 a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from vkserve.cli.commands import verify
from vkserve.cli.commands._device import device_arg
from vkserve.cli.commands._inputs import UsageError, parse_shapes
from vkserve.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandFailed, print_json
from vkserve.cli.progress import Progress
from vkserve.devices.names import DeviceName, parse_device
from vkserve.models.errors import ModelFormatError
from vkserve.models.importer import (
    LABELS,
    SOURCE_KINDS,
    ConversionFailed,
    ImportProblem,
    PnnxNotFound,
    Preprocessing,
    config_toml,
    convert,
    find_pnnx,
    write_folder,
)
from vkserve.processing.config import PixelFormat
from vkserve.scheduler.registry import NAME_RE, read_model_folder

NAME = "import"
HELP = ("convert an ONNX or TorchScript model with pnnx into a model folder (model.param, "
        "model.bin, config.toml), then verify it against ncnn")


def _numbers(kind: type[int] | type[float], count: tuple[int, ...], what: str
             ) -> Callable[[str], tuple[float, ...]]:
    """argparse ``type=``: comma-separated numbers, as many as one of ``count``."""
    def parse(text: str) -> tuple[int | float, ...]:
        try:
            values = tuple(kind(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: expected {kind.__name__}s like "
                                             f"{','.join(['1'] * count[-1])}, got {text!r}") from None
        if len(values) not in count:
            raise argparse.ArgumentTypeError(f"{what}: expected {' or '.join(map(str, count))} "
                                             f"values, got {len(values)}")
        return values
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="MODEL", type=Path,
                        help="MODEL.onnx, MODEL.pt or MODEL.torchscript (TorchScript needs torch)")
    parser.add_argument("--name", required=True, help="the model's name: its folder in DIR")
    parser.add_argument("--models", type=Path, default=Path("."), metavar="DIR",
                        help="the model repository to write NAME/ into (default: the current "
                             "folder); serve it with `vkserve serve --models DIR`")
    parser.add_argument("--shape", action="append", default=[], metavar="inN=d0,d1,...",
                        help="an input's shape in ncnn order without the batch, e.g. "
                             "in0=3,224,224 (default: the size pnnx traces; needed for inputs of "
                             "dynamic size; pnnx names the inputs in0, in1, ...)")
    parser.add_argument("--device", type=device_arg, default=parse_device("cpu"), metavar="DEVICE",
                        help="where verify runs the model: cpu (default), vulkan:N or N")
    pre = parser.add_argument_group("pre- and postprocessing, written to config.toml (docs/MODELS.md)")
    pre.add_argument("--pixel-format", choices=[f.value for f in PixelFormat],
                     help="channel order the model expects")
    pre.add_argument("--resize", type=_numbers(int, (2,), "--resize"), metavar="H,W",
                     help="resize images to H,W (default: the input's shape)")
    pre.add_argument("--mean", type=_numbers(float, (1, 3), "--mean"), metavar="M0,M1,M2",
                     help="per channel: value = (pixel - mean) * norm")
    pre.add_argument("--norm", type=_numbers(float, (1, 3), "--norm"), metavar="N0,N1,N2",
                     help="per channel, see --mean (e.g. 0.0078125 for 1/128)")
    pre.add_argument("--labels", type=Path, metavar="FILE",
                     help="class names, one a line: copied as labels.txt, [postprocess] top-k")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _per_channel(values: tuple[float, ...] | None, channels: int) -> tuple[float, ...] | None:
    """One --mean/--norm value stands for every channel."""
    return values * channels if values is not None and len(values) == 1 else values


def _check(args: argparse.Namespace) -> Path:
    """Usage errors before any work; returns the model's future folder."""
    if not NAME_RE.match(args.name):
        raise UsageError(f"--name {args.name!r}: must match {NAME_RE.pattern}")
    if args.source.suffix.lower() not in SOURCE_KINDS:
        raise UsageError(f"{args.source}: expected a {', '.join(SOURCE_KINDS)} file")
    if not args.source.is_file():
        raise UsageError(f"{args.source}: no such file")
    if args.labels is not None and not args.labels.is_file():
        raise UsageError(f"--labels {args.labels}: no such file")
    if not args.models.is_dir():
        raise UsageError(f"--models {args.models}: not a folder")
    target = args.models / args.name
    if target.exists():
        raise UsageError(f"{target} exists: remove it or choose another --name")
    return target


def _verify(folder: Path, inputs: dict[str, tuple[int, ...]], device: DeviceName,
            as_json: bool) -> tuple[int, dict[str, object] | None]:
    """`vkserve verify FOLDER --shape ...` through verify's own parser and command: its
    exit status and, with ``as_json``, its JSON report (else it printed its table)."""
    parser = argparse.ArgumentParser(prog="vkserve verify")
    verify.add_arguments(parser)
    argv = [str(folder), "--device", str(device)]
    argv += [f"--shape={n}={','.join(map(str, s))}" for n, s in inputs.items()]
    out = io.StringIO()
    try:
        if as_json:
            with contextlib.redirect_stdout(out):
                status = verify.main(parser.parse_args([*argv, "--json"]))
        else:
            status = verify.main(parser.parse_args(argv))
    except CommandFailed as exc:  # the model does not load or run here
        raise CommandFailed(EXIT_FAILED, exc.code, f"{folder.name} does not run in vkserve: "
                            f"{exc.message}") from None
    if status == EXIT_USAGE:
        raise CommandFailed(EXIT_FAILED, "FAILED", f"{folder.name} does not run in vkserve "
                            "(verify's message above)")
    return status, json.loads(out.getvalue()) if as_json else None


def _convert(args: argparse.Namespace, pnnx: Path, shapes: dict[str, tuple[int, ...]],
             scratch: Path) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """pnnx, then the model folder in ``scratch``, scanned as the daemon scans it; returns the
    folder and the input shapes."""
    with Progress(NAME, quiet=args.json) as progress:
        progress.stage(f"converting {args.source.name} with {pnnx}")
        try:
            converted = convert(pnnx, args.source, shapes, scratch)
        except ImportProblem as exc:
            raise CommandFailed.usage(str(exc)) from None
        except ConversionFailed as exc:
            raise CommandFailed(EXIT_FAILED, "FAILED", f"{exc}; pnnx said:\n{exc.output}") from None
        except ModelFormatError as exc:  # e.g. a layer type vkserve does not run
            raise CommandFailed(EXIT_FAILED, "FAILED", f"{args.name} does not run in vkserve: {exc}") from None
    unknown = sorted(set(shapes) - set(converted.input_shapes))
    if unknown:
        raise CommandFailed.usage(f"--shape names {unknown}; the model's inputs are "
                                  f"{sorted(converted.input_shapes)}")
    inputs: dict[str, tuple[int, ...]] = {}
    for name, traced in converted.input_shapes.items():
        shape = shapes.get(name, traced)
        if shape is None:
            raise CommandFailed.usage(f"input {name} has no fixed shape in {args.source.name}: "
                                      f"give one with --shape {name}=3,224,224")
        inputs[name] = shape
    channels = PixelFormat(args.pixel_format or PixelFormat.RGB).channels
    preprocessing = Preprocessing(args.pixel_format, args.resize, _per_channel(args.mean, channels),
                                  _per_channel(args.norm, channels))
    config = config_toml(args.source, inputs, preprocessing, next(iter(inputs), None),
                         LABELS if args.labels is not None else None)
    folder = scratch / "out" / args.name
    write_folder(converted, folder, config, args.labels)
    spec = read_model_folder(folder)
    if spec.error is not None:
        raise CommandFailed.usage(spec.error)
    return folder, inputs


def main(args: argparse.Namespace) -> int:
    try:
        target = _check(args)
        shapes = parse_shapes(args.shape)
        pnnx = find_pnnx()
    except (UsageError, ImportProblem) as exc:
        raise CommandFailed.usage(str(exc)) from None
    except PnnxNotFound as exc:
        raise CommandFailed(EXIT_FAILED, "FAILED", str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="vkserve-import-") as scratch:
        staged, inputs = _convert(args, pnnx, shapes, Path(scratch))
        status, report = _verify(staged, inputs, args.device, args.json)
        shutil.move(staged, target)
    if args.json:
        print_json({"model": args.name, "folder": str(target), "source": str(args.source),
                    "inputs": {n: list(s) for n, s in inputs.items()}, "verify": report,
                    "ok": status == EXIT_OK})
    else:
        print(f"imported {args.source.name} as {args.name} into {target} "
              f"(inputs: {', '.join(f'{n} {s}' for n, s in inputs.items())})")
        if status != EXIT_OK:
            print(f"verify did not pass: the folder is kept for a look; remove {target} to import "
                  "again")
    return EXIT_OK if status == EXIT_OK else EXIT_FAILED
