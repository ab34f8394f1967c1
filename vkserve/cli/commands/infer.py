"""`vkserve infer`: send one job to the daemon and print its outputs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from vkserve.cli.commands._client import add_address_arguments, run_client_command
from vkserve.cli.commands._inputs import UsageError, load_inputs
from vkserve.client import Client
from vkserve.client.errors import NotFound

NAME = "infer"
HELP = "run a model on the daemon: print output shapes (and the class of a score vector)"

#: Outputs up to this many elements have their values in --json.
JSON_VALUES_MAX = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="model name (see vkserve models)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=file.npy",
                        help="input data (.npy, sent as float32); repeat for several inputs")
    parser.add_argument("--random-input", action="store_true",
                        help="uniform [0, 1) float32 data for inputs not given with --input "
                             "(shapes from the daemon's model list)")
    parser.add_argument("--seed", type=int, default=0, help="seed for --random-input")
    parser.add_argument("--priority", type=int, default=0, help="higher runs first (default 0)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="deadline for the answer, queueing and execution included")
    parser.add_argument("--json", action="store_true",
                        help=f"print one JSON object (values of outputs up to {JSON_VALUES_MAX} elements)")
    add_address_arguments(parser)


def model_input_shapes(model: dict[str, Any]) -> dict[str, list[int] | None]:
    """Input name -> shape from a ``list_models`` entry (``{name: shape}`` or ``[{name, shape}]``)."""
    inputs = model.get("inputs")
    out: dict[str, list[int] | None] = {}
    if isinstance(inputs, dict):
        for name, shape in inputs.items():
            if isinstance(shape, dict):
                shape = shape.get("shape")
            out[str(name)] = list(shape) if isinstance(shape, list) else None
    elif isinstance(inputs, list):
        for item in inputs:
            if isinstance(item, dict) and "name" in item:
                shape = item.get("shape")
                out[str(item["name"])] = list(shape) if isinstance(shape, list) else None
            elif isinstance(item, str):
                out[item] = None
    return out


def random_inputs(client: Client, model: str, have: set[str], seed: int) -> dict[str, np.ndarray]:
    entry = next((m for m in client.models() if isinstance(m, dict) and m.get("name") == model), None)
    if entry is None:
        # what the daemon answers for the model by name: the same error as with --input
        raise NotFound(f"no model '{model}' (see vkserve models)")
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in model_input_shapes(entry).items():
        if name in have:
            continue
        if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise UsageError(f"--random-input: input {name!r} takes shapes the client must choose "
                             f"(the daemon lists {shape or 'any shape'}); use --input {name}=file.npy")
        arrays[name] = rng.random(shape, dtype=np.float32)
    return arrays


def score_class(array: np.ndarray) -> int | None:
    """The argmax of a score vector (one dimension > 1 after squeezing), else None."""
    squeezed = np.squeeze(array)
    if squeezed.ndim != 1 or squeezed.size < 2 or not np.issubdtype(squeezed.dtype, np.number):
        return None
    return int(np.argmax(squeezed))


def describe(outputs: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, arr in outputs.items():
        info: dict[str, Any] = {"dtype": str(arr.dtype), "shape": list(arr.shape)}
        cls = score_class(arr)
        if cls is not None:
            info["class"] = cls
            info["score"] = float(np.squeeze(arr)[cls])
        if arr.size <= JSON_VALUES_MAX:
            info["values"] = arr.tolist()
        out[name] = info
    return out


def main(args: argparse.Namespace) -> int:
    try:
        inputs = load_inputs(args.input)
    except UsageError as exc:
        print(f"vkserve infer: {exc}", file=sys.stderr)
        return 2

    def body(client: Client) -> int:
        arrays = dict(inputs)
        if args.random_input:
            arrays.update(random_inputs(client, args.model, set(arrays), args.seed))
        if not arrays:
            raise UsageError("no inputs: pass --input NAME=file.npy or --random-input")
        start = time.perf_counter()
        outputs = client.infer(args.model, arrays, priority=args.priority, timeout=args.timeout)
        elapsed = time.perf_counter() - start
        info = describe(outputs)
        if args.json:
            print(json.dumps({"model": args.model, "outputs": info,
                              "round_trip_ms": round(elapsed * 1e3, 3)}))
            return 0
        for name, o in info.items():
            line = f"{name}  {o['dtype']} {tuple(o['shape'])}"
            if "class" in o:
                line += f"  class {o['class']} (score {o['score']:.4g})"
            print(line)
        print(f"round trip {elapsed * 1e3:.2f} ms")
        return 0

    return run_client_command(NAME, args, body)
