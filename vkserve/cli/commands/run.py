"""`vkserve run`: run a model outside the daemon and report outputs, latency and memory.

MODEL is a model folder (``model.param`` + optional ``model.bin``) or a ``.param`` file (with
an optional ``.bin`` of the same stem). Without a ``.bin`` the weights are seeded random ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vkserve.cli.commands._inputs import UsageError, load_inputs
from vkserve.devices.cpu.executor import Plan, PlanError
from vkserve.devices.reference import random_inputs
from vkserve.devices.vulkan.engine import DeviceNotFound, load_plan
from vkserve.devices.vulkan.engine.plan import PlanError as VulkanPlanError
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph, load_model, read_param

NAME = "run"
HELP = "run a model on one device outside the daemon; print outputs, latency and arena size"


@dataclass
class ModelFiles:
    param: str
    bin: str | None


def resolve_model(path: str) -> ModelFiles:
    """A folder holding model.param (+ model.bin), or a .param (+ a .bin beside it)."""
    if os.path.isdir(path):
        param = os.path.join(path, "model.param")
        weights = os.path.join(path, "model.bin")
    elif path.endswith(".param"):
        param = path
        weights = path[: -len(".param")] + ".bin"
    else:
        raise UsageError(f"{path}: not a model folder or a .param file")
    if not os.path.isfile(param):
        raise UsageError(f"{param}: no such file")
    return ModelFiles(param, weights if os.path.isfile(weights) else None)


def check_device(args: argparse.Namespace) -> None:
    """--device is cpu or a Vulkan device index; --precision applies to Vulkan devices only."""
    if args.device == "cpu":
        if args.precision is not None:
            raise UsageError("--precision applies to Vulkan devices; the CPU engine runs bf16")
        return
    if not args.device.isdigit():
        raise UsageError(f"--device {args.device}: expected cpu or a Vulkan device index N")


def _name_value(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise UsageError(f"{what} {text!r}: expected NAME=VALUE")
    return name, value


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items:
        name, value = _name_value(item, "--shape")
        try:
            shapes[name] = tuple(int(v) for v in value.split(","))
        except ValueError:
            raise UsageError(f"--shape {item!r}: dims must be integers like 3,224,224") from None
    return shapes


def prepare(args: argparse.Namespace) -> tuple[ModelFiles, Graph, dict[str, np.ndarray]]:
    """Resolve the model, load it for the given input shapes and build the inputs."""
    check_device(args)
    files = resolve_model(args.model)
    arrays = load_inputs(args.input)
    shapes = parse_shapes(args.shape)
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


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="model folder or .param file")
    parser.add_argument("--device", default="cpu", help="cpu (default) or a GPU index N")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default=None,
                        help="Vulkan devices: fp32 (default) or fp16 (fp16 arithmetic where the "
                             "device has it, else fp16 storage)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="pipeline cache folder for Vulkan devices (default: "
                             "$CACHE_DIRECTORY or $XDG_CACHE_HOME/vkserve)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=file.npy",
                        help="input data (float32 .npy); repeat for several inputs")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=d0,d1,...",
                        help="input shape in ncnn order, e.g. data=3,224,224 (default: the .param's)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--random-input", action="store_true",
                        help="seeded uniform [-1, 1) data for inputs not given with --input")
    parser.add_argument("--repeat", type=int, default=10, metavar="K",
                        help="timed runs after the first (median reported; default 10)")


def main(args: argparse.Namespace) -> int:
    try:
        files, graph, inputs = prepare(args)
        t0 = time.perf_counter()
        shapes = {n: a.shape for n, a in inputs.items()}
        if args.device == "cpu":
            plan: Any = Plan(graph, shapes)
            engine = {"device": "cpu", "precision": "bf16"}
            loaded = None
        else:
            loaded = load_plan(graph, int(args.device), args.precision or "fp32", shapes,
                               cache_dir=args.cache_dir)
            plan = loaded.plan
            engine = loaded.info()
        compile_s = time.perf_counter() - t0
    except (UsageError, ModelFormatError, PlanError, VulkanPlanError, DeviceNotFound) as e:
        print(f"vkserve run: {e}", file=sys.stderr)
        return 2
    try:
        return _run(args, files, plan, inputs, engine, compile_s)
    finally:
        if loaded is not None:
            loaded.close()


def _run(args: argparse.Namespace, files: ModelFiles, plan: Any, inputs: dict[str, np.ndarray],
         engine: dict[str, Any], compile_s: float) -> int:
    t0 = time.perf_counter()
    outputs = plan.run(inputs)
    first_s = time.perf_counter() - t0
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
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"model    {result['model']}  (weights: {result['weights']})")
    if "load_seconds" in result:
        print(f"device   {result['device']} ({result['device_name']}), {result['precision']}: "
              f"load {result['load_seconds']:.3f} s, {result['glsl_compiles']} GLSL compiles")
    for o in result["outputs"]:
        print(f"output   {o['name']}  shape {tuple(o['shape'])}")
    print(f"latency  first {result['first_ms']:.2f} ms, median {result['median_ms']:.2f} ms "
          f"over {len(times)} runs (compile {result['compile_ms']:.1f} ms)")
    print(f"memory   arena {plan.arena_bytes / 2**20:.2f} MiB vs {plan.naive_bytes / 2**20:.2f} MiB "
          f"for all blobs ({plan.naive_bytes / max(plan.arena_bytes, 1):.1f}x)")
    return 0
