"""`vkserve run`: run a model outside the daemon and report outputs, latency and memory.

MODEL is a model folder (``model.param`` + optional ``model.bin``, or pnnx's ``NAME.ncnn.param``
+ ``NAME.ncnn.bin``) or a ``.param`` file (with
an optional ``.bin`` of the same stem). Without a ``.bin`` the weights are seeded random ones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vkserve.cli.commands._device import device_arg, vulkan_device_arg
from vkserve.cli.commands._inputs import RANDOM_INPUT_HELP, UsageError, load_inputs, parse_shapes
from vkserve.cli.output import CommandFailed, print_json
from vkserve.cli.progress import Progress
from vkserve.devices.cpu.executor import Plan, PlanError
from vkserve.devices.names import parse_device
from vkserve.devices.reference import random_inputs
from vkserve.devices.vulkan.engine import DeviceNotFound, load_plan
from vkserve.devices.vulkan.engine.plan import PlanError as VulkanPlanError
from vkserve.models.errors import ModelFormatError
from vkserve.models.files import model_files
from vkserve.models.graph import Graph, load_model, read_param
from vkserve.scheduler.registry import read_model_folder

NAME = "run"
HELP = "run a model on one device outside the daemon; print outputs, latency and arena size"


@dataclass
class ModelFiles:
    param: str
    bin: str | None


def resolve_model(path: str) -> ModelFiles:
    """A folder holding model.param (+ model.bin) or pnnx's NAME.ncnn.param (+ NAME.ncnn.bin),
    or a .param (+ a .bin beside it)."""
    if os.path.isdir(path):
        found = model_files(Path(path))
        param, weights = str(found.param), str(found.weights)
    elif path.endswith(".param"):
        param = path
        weights = path[: -len(".param")] + ".bin"
    else:
        raise UsageError(f"{path}: not a model folder or a .param file")
    if not os.path.isfile(param):
        raise UsageError(f"{param}: no such file")
    return ModelFiles(param, weights if os.path.isfile(weights) else None)


def configured_shapes(model: str) -> dict[str, tuple[int, ...]]:
    """A model folder's input shapes from its config.toml ``[inputs]`` (the first one listed
    per input, as the daemon builds first): what --shape would say; {} for a .param file or a
    folder without them. A config.toml the daemon would refuse is refused here, named."""
    folder = Path(model)
    if not folder.is_dir() or not (folder / "config.toml").is_file():
        return {}
    spec = read_model_folder(folder)
    if spec.error is not None:
        raise UsageError(spec.error)
    return {blob: tuple(s.shapes[0]) for blob, s in spec.inputs.items() if s.shapes}


def check_device(args: argparse.Namespace) -> None:
    """--precision applies to Vulkan devices only."""
    if args.device.is_cpu and args.precision is not None:
        raise UsageError("--precision applies to Vulkan devices; the CPU engine runs bf16")


def prepare(args: argparse.Namespace) -> tuple[ModelFiles, Graph, dict[str, np.ndarray]]:
    """Resolve the model, load it for the given input shapes and build the inputs."""
    check_device(args)
    files = resolve_model(args.model)
    arrays = load_inputs(args.input)
    shapes = {**configured_shapes(args.model), **parse_shapes(args.shape)}
    shapes.update({n: a.shape for n, a in arrays.items()})
    open_inputs = [b for layer in read_param(files.param) if layer.type == "Input"
                   and layer.params.declared_shape() is None for b in layer.outputs if b not in shapes]
    if open_inputs:
        name = open_inputs[0]
        raise UsageError(f"input {name!r} declares no shape in {Path(files.param).name} (pnnx writes none): "
                         f"give one with --shape {name}=3,224,224 or data with --input {name}=file.npy")
    graph = load_model(files.param, files.bin, shapes or None, seed=args.seed)
    unknown = sorted(set(arrays) - set(graph.input_names))
    if unknown:
        raise UsageError(f"--input names {unknown}; the model's inputs are {graph.input_names}")
    missing = [n for n in graph.input_names if n not in arrays]
    if missing and not args.random_input:
        raise UsageError(f"no data for inputs {missing}: pass --input NAME=file.npy or --random-input")
    generated = random_inputs({n: graph.blob_shapes[n] for n in missing}, seed=args.seed)
    return files, graph, {**arrays, **generated}


def add_common_arguments(parser: argparse.ArgumentParser, *, cpu: bool = True,
                         default: str = "cpu") -> None:
    """The flags of run, verify, profile and tune; ``cpu`` False: a Vulkan device only;
    ``default``: the device when none is named."""
    parser.add_argument("model", metavar="MODEL", help="model folder or .param file")
    if cpu:
        choices = ("cpu (default), vulkan:N or N (vulkan:N)" if default == "cpu"
                   else f"vulkan:N or N (vulkan:N; default {default}), or cpu")
        parser.add_argument("--device", type=device_arg, default=parse_device(default),
                            metavar="DEVICE", help=choices)
    else:
        parser.add_argument("--device", type=vulkan_device_arg, default=parse_device("vulkan:0"),
                            metavar="DEVICE", help="a Vulkan device: vulkan:N or N (default "
                                                   "vulkan:0); not the CPU")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default=None,
                        help="Vulkan devices: fp32 (default) or fp16 (fp16 arithmetic where the "
                             "device has it, else fp16 storage)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="pipeline cache folder for Vulkan devices (default: "
                             "$CACHE_DIRECTORY or $XDG_CACHE_HOME/vkserve)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=file.npy",
                        help="input data (float32 .npy); repeat for several inputs")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=d0,d1,...",
                        help="input shape in ncnn order, e.g. data=3,224,224 (default: the model "
                             "folder's config.toml [inputs], else the .param's)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--random-input", action="store_true", help=RANDOM_INPUT_HELP)
    parser.add_argument("--repeat", type=int, default=10, metavar="K",
                        help="timed runs after the first (median reported; default 10)")


def main(args: argparse.Namespace) -> int:
    with Progress(NAME, quiet=args.json) as progress:
        try:
            files, graph, inputs = prepare(args)
            t0 = time.perf_counter()
            shapes = {n: a.shape for n, a in inputs.items()}
            if args.device.is_cpu:
                plan: Any = Plan(graph, shapes)
                engine = {"device": str(args.device), "precision": "bf16"}
                loaded = None
            else:
                progress.stage(f"building the Vulkan Plan on {args.device}")
                loaded = load_plan(graph, args.device.index, args.precision or "fp32", shapes,
                                   cache_dir=args.cache_dir, progress=progress)
                plan = loaded.plan
                engine = loaded.info()
            compile_s = time.perf_counter() - t0
        except (UsageError, ModelFormatError, PlanError, VulkanPlanError, DeviceNotFound) as e:
            raise CommandFailed.usage(str(e)) from None
        try:
            result = _measure(args, files, plan, inputs, engine, compile_s, progress)
        finally:
            if loaded is not None:
                loaded.close()
    return _report(args, result)


def _measure(args: argparse.Namespace, files: ModelFiles, plan: Any, inputs: dict[str, np.ndarray],
             engine: dict[str, Any], compile_s: float, progress: Progress) -> dict[str, Any]:
    # numba compiles the CPU kernels at their first call unless its cache has them (`vkserve
    # cache warm` does it ahead): the first run is what may take long
    progress.stage(f"first run on {args.device}")
    t0 = time.perf_counter()
    outputs = plan.run(inputs)
    first_s = time.perf_counter() - t0
    progress.stage(f"{max(args.repeat, 0)} timed runs")
    times = []
    for _ in range(max(args.repeat, 0)):
        t0 = time.perf_counter()
        plan.run(inputs)
        times.append(time.perf_counter() - t0)
    median_s = statistics.median(times) if times else first_s
    result = {
        "model": os.path.basename(os.path.normpath(args.model)),
        **engine,
        "weights": files.bin or f"random (seed {args.seed})",
        "inputs": {n: list(a.shape) for n, a in inputs.items()},
        "outputs": [{"name": n, "shape": list(a.shape)} for n, a in outputs.items()],
        "compile_ms": round(compile_s * 1e3, 3),
        "first_ms": round(first_s * 1e3, 3),
        "median_ms": round(median_s * 1e3, 3),
        "runs": len(times),
        "arena_bytes": plan.arena_bytes,
        "naive_bytes": plan.naive_bytes,
    }
    return result


def _report(args: argparse.Namespace, result: dict[str, Any]) -> int:
    if args.json:
        print_json(result)
        return 0
    print(f"model    {result['model']}  (weights: {result['weights']})")
    if "load_seconds" in result:
        print(f"device   {result['device']} ({result['device_name']}), {result['precision']}: "
              f"load {result['load_seconds']:.3f} s, {result['glsl_compiles']} GLSL compiles")
    for o in result["outputs"]:
        print(f"output   {o['name']}  shape {tuple(o['shape'])}")
    print(f"latency  first {result['first_ms']:.2f} ms, median {result['median_ms']:.2f} ms "
          f"over {result['runs']} runs (compile {result['compile_ms']:.1f} ms)")
    arena, naive = result["arena_bytes"], result["naive_bytes"]
    print(f"memory   arena {arena / 2**20:.2f} MiB vs {naive / 2**20:.2f} MiB "
          f"for all blobs ({naive / max(arena, 1):.1f}x)")
    return 0
