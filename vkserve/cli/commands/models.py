"""`vkserve models`: the daemon's models (name, inputs with shapes, devices, state)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vkserve.cli.commands._client import add_address_arguments, print_tree, run_client_command
from vkserve.cli.commands.infer import model_input_shapes
from vkserve.client import Client

NAME = "models"
HELP = "list the daemon's models with their inputs, devices and state"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON list")
    add_address_arguments(parser)


def _fmt_devices(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} ({v})" if not isinstance(v, (dict, list)) else str(k) for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(str(v.get("name", v)) if isinstance(v, dict) else str(v) for v in value)
    return "-" if value is None else str(value)


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


def format_models(models: list[dict[str, Any]]) -> str:
    if not models:
        return "no models"
    rows = [("name", "state", "inputs", "shapes built", "devices")]
    for m in models:
        shapes = model_input_shapes(m)
        inputs = ", ".join(f"{n} {_fmt_shape(s)}" for n, s in shapes.items()) or "-"
        state = str(m.get("state", "-"))
        if m.get("error"):
            state += f" ({m['error']})"
        rows.append((str(m.get("name", "?")), state, inputs, _built_shapes(m), _fmt_devices(m.get("devices"))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows
    )


def main(args: argparse.Namespace) -> int:
    def body(client: Client) -> int:
        models = client.models()
        if args.json:
            print(json.dumps(models, indent=2, default=str))
        else:
            print(format_models(models))
            if args.verbose:
                print_tree(models)
        return 0

    return run_client_command(NAME, args, body)
