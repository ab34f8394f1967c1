"""`vkserve models`: the daemon's models (name, inputs with shapes, devices, state)."""

from __future__ import annotations

import argparse
from typing import Any

from vkserve.cli.commands._client import add_address_arguments, print_tree, run_client_command
from vkserve.cli.commands.infer import model_input_shapes
from vkserve.cli.output import print_json
from vkserve.client import Client

NAME = "models"
HELP = "list the daemon's models with their inputs, devices and state"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON list")
    add_address_arguments(parser)


def _fmt_devices(value: Any, names: dict[int, str]) -> str:
    """The daemon's device numbers as device names (cpu, vulkan:N)."""
    if not isinstance(value, list) or not value:
        return "-"
    return ", ".join(names.get(v, str(v)) if isinstance(v, int) else str(v) for v in value)


def _loading(model: dict[str, Any]) -> list[str]:
    """What the model's loading placements are building (``progress``), if they say."""
    return [str(p["progress"]) for p in model.get("placements") or []
            if isinstance(p, dict) and p.get("progress")]


def _fmt_shape(shape: list[int] | None) -> str:
    """``(3, 224, 224)``; ``?`` for a dimension that varies; ``any shape`` when open."""
    if not shape:
        return "(any shape)"
    return "(" + ", ".join("?" if d == -1 else str(d) for d in shape) + ")"


def _built_shapes(model: dict[str, Any]) -> str:
    """Input shapes with Plans built on some device (a dynamic model builds one set per shape)."""
    shapes: list[str] = []
    for placement in model.get("placements") or []:
        if isinstance(placement, dict):
            shapes += [s for s in placement.get("shapes") or [] if s not in shapes]
    return "; ".join(shapes) or "-"


def format_models(models: list[dict[str, Any]], names: dict[int, str]) -> str:
    """The table of ``vkserve models``; ``names``: the daemon's device numbers -> names."""
    if not models:
        return "no models"
    rows = [("name", "state", "inputs", "shapes built", "devices")]
    for m in models:
        shapes = model_input_shapes(m)
        inputs = ", ".join(f"{n} {_fmt_shape(s)}" for n, s in shapes.items()) or "-"
        state = str(m.get("state", "-"))
        if m.get("error"):
            state += f" ({m['error']})"
        elif _loading(m):
            state += f" ({'; '.join(_loading(m))})"
        rows.append((str(m.get("name", "?")), state, inputs, _built_shapes(m),
                     _fmt_devices(m.get("devices"), names)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows
    )


def main(args: argparse.Namespace) -> int:
    def body(client: Client) -> int:
        models = client.models()
        if args.json:
            print_json(models, indent=2)
        else:
            devices = client.status().get("devices") or []
            print(format_models(models, {d["index"]: d["device"] for d in devices}))
            if args.verbose:
                print_tree(models)
        return 0

    return run_client_command(NAME, args, body)
