"""`vkserve infer`: send one job to the daemon and print its outputs."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from vkserve.cli.commands._client import add_address_arguments, run_client_command
from vkserve.cli.commands._inputs import RANDOM_INPUT_HELP, UsageError, load_inputs
from vkserve.cli.commands._meanings import meaning_lines, meanings_json, save_mask
from vkserve.cli.output import CommandFailed
from vkserve.client import DEFAULT_TIMEOUT, Client
from vkserve.client.errors import NotFound
from vkserve.client.images import image_file
from vkserve.devices.reference import random_inputs as seeded_inputs

NAME = "infer"
HELP = ("run a model on the daemon: print output shapes (and the class of a score vector), "
        "and the top-k classes, boxes or mask of a model with [postprocess]")

#: Outputs up to this many elements have their values in --json.
JSON_VALUES_MAX = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="model name (see vkserve models)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=file.npy",
                        help="input data (.npy, sent as float32); repeat for several inputs")
    parser.add_argument("--image", nargs="+", default=[], metavar="FILE",
                        help="image file(s) (PNG, JPEG, ...) for a model with [preprocess]: the "
                             "daemon resizes and normalises them; one job per file")
    parser.add_argument("--image-input", metavar="NAME",
                        help="the input --image feeds (default: the model's only input not "
                             "given with --input)")
    parser.add_argument("--save-mask", metavar="OUT.png",
                        help="segmentation models: write the mask (pixel value = class index) "
                             "as a PNG (needs Pillow: pip install 'vkserve[images]')")
    parser.add_argument("--random-input", action="store_true",
                        help=RANDOM_INPUT_HELP + " (shapes from the daemon's model list)")
    parser.add_argument("--seed", type=int, default=0, help="seed for --random-input")
    parser.add_argument("--priority", type=int, default=0, help="higher runs first (default 0)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", default=DEFAULT_TIMEOUT,
                        help="deadline for the answer, queueing and execution included "
                             f"(default {DEFAULT_TIMEOUT:g})")
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


def model_entry(client: Client, model: str) -> dict[str, Any]:
    """The daemon's ``list_models`` entry of ``model``."""
    entry = next((m for m in client.models() if isinstance(m, dict) and m.get("name") == model), None)
    if entry is None:
        # what the daemon answers for the model by name: the same error as with --input
        raise NotFound(f"no model '{model}' (see vkserve models)")
    return entry


def random_inputs(client: Client, model: str, have: set[str], seed: int) -> dict[str, np.ndarray]:
    """--random-input: the inputs not in ``have``, as `vkserve run` draws them."""
    shapes = {}
    for name, shape in model_input_shapes(model_entry(client, model)).items():
        if name in have:
            continue
        if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise UsageError(f"no random data for input {name!r}: it takes shapes the client must "
                             f"choose (the daemon lists {shape or 'any shape'}); give data with "
                             f"--input {name}=file.npy")
        shapes[name] = shape
    return seeded_inputs(shapes, seed)


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


def image_input_name(client: Client, args: argparse.Namespace, given: set[str]) -> str:
    """The input --image feeds: --image-input, else the model's only input not given."""
    if args.image_input:
        return str(args.image_input)
    free = [n for n in model_input_shapes(model_entry(client, args.model)) if n not in given]
    if len(free) != 1:
        raise UsageError(f"--image: the model has {len(free)} inputs not given with --input "
                         f"({', '.join(free) or 'none'}); name one with --image-input")
    return free[0]


def main(args: argparse.Namespace) -> int:
    try:
        inputs = load_inputs(args.input)
        if args.save_mask and len(args.image) > 1:
            raise UsageError("--save-mask takes one --image (it writes one mask)")
    except UsageError as exc:
        raise CommandFailed.usage(str(exc)) from None

    def body(client: Client) -> int:
        arrays: dict[str, np.ndarray] = dict(inputs)
        given = set(arrays)
        if args.image:
            image_name = image_input_name(client, args, given)
            given.add(image_name)
        if args.random_input:
            arrays.update(random_inputs(client, args.model, given, args.seed))
        jobs: list[tuple[str | None, dict[str, np.ndarray]]] = [(None, arrays)]
        if args.image:
            jobs = [(path, {**arrays, image_name: image_file(path)}) for path in args.image]
        elif not arrays:
            raise UsageError("no inputs: pass --input NAME=file.npy, --image FILE or --random-input")
        results = []
        for label, job in jobs:
            start = time.perf_counter()
            reply = client.infer_detailed(args.model, job, priority=args.priority,
                                          timeout=args.timeout)
            results.append((label, reply, time.perf_counter() - start))
        if args.save_mask:
            save_mask(results[0][1].meanings, args.save_mask)
        shown = []
        for label, reply, elapsed in results:
            info: dict[str, Any] = {"outputs": describe(reply.outputs), "device": reply.device,
                                    "round_trip_ms": round(elapsed * 1e3, 3)}
            if reply.meanings:
                info["postprocess"] = meanings_json(reply.meanings)
            shown.append({"image": label, **info} if label is not None else info)
        if args.json:  # one object; with --image, one entry per file under "images"
            print(json.dumps({"model": args.model, "images": shown} if args.image
                             else {"model": args.model, **shown[0]}))
            return 0
        for (label, reply, elapsed), info in zip(results, shown):
            if label is not None:
                print(f"{label}:")
            for name, o in info["outputs"].items():
                line = f"{name}  {o['dtype']} {tuple(o['shape'])}"
                if "class" in o:
                    line += f"  class {o['class']} (score {o['score']:.4g})"
                print(line)
            for meaning in reply.meanings:
                print("\n".join(meaning_lines(meaning)))
            print(f"round trip {elapsed * 1e3:.2f} ms")
        if args.save_mask:
            print(f"mask written to {args.save_mask}")
        return 0

    return run_client_command(NAME, args, body)
