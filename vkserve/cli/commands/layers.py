"""`vkserve layers`: the ncnn layer types vkserve knows, and which engine runs each."""

from __future__ import annotations

import argparse
import json

NAME = "layers"
HELP = "list the supported ncnn layer types and the engines (cpu, vulkan) that run each"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print {type: [engines]} as JSON")
    out.add_argument("--markdown", action="store_true", help="print the README's table")


def engines_by_type() -> dict[str, list[str]]:
    """Every layer type the model format accepts -> the engines that run it (sorted by name).
    The engines are imported here, not at module level: every `vkserve` command imports this."""
    from vkserve.devices.cpu.kernels import REGISTRY as CPU_KERNELS  # noqa: PLC0415
    from vkserve.devices.vulkan.engine.plan import supported_layer_types  # noqa: PLC0415
    from vkserve.models.layers import LAYER_TYPES  # noqa: PLC0415

    vulkan = supported_layer_types()
    return {t: [e for e, ok in (("cpu", t in CPU_KERNELS), ("vulkan", t in vulkan)) if ok]
            for t in sorted(LAYER_TYPES, key=str.lower)}


def markdown(table: dict[str, list[str]]) -> str:
    rows = ["| layer | cpu | vulkan |", "|---|---|---|"]
    rows += [f"| {t} | {'yes' if 'cpu' in e else '-'} | {'yes' if 'vulkan' in e else '-'} |"
             for t, e in table.items()]
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    table = engines_by_type()
    if args.json:
        print(json.dumps(table, indent=2))
    elif args.markdown:
        print(markdown(table))
    else:
        width = max(map(len, table))
        for t, engines in table.items():
            print(f"{t:<{width}}  {' '.join(engines) or '(parsed, no engine)'}")
    return 0
