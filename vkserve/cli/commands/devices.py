"""`vkserve devices`: list every device and its capabilities."""

from __future__ import annotations

import argparse

from vkserve.cli.output import print_json
from vkserve.devices.capabilities import DeviceCaps
from vkserve.devices.discovery import discover_devices
from vkserve.devices.names import device_name

NAME = "devices"
HELP = "list the Vulkan GPUs and the CPU with their capabilities"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list of devices")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _row(d: DeviceCaps) -> dict[str, str]:
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    local = [h for h in d.heaps if h.device_local] or list(d.heaps)
    return {
        "device": device_name(d.kind, d.index),
        "kind": d.kind.value,
        "name": d.name,
        "type": d.type,
        "vendor:device": f"{d.vendor_id:04x}:{d.device_id:04x}" if d.vendor_id else "-",
        "api": d.summary()["api_version"] or "-",
        "driver": (f"{d.driver_name} {d.driver_info}".strip() or str(d.driver_version))
        if d.kind.value == "vulkan" else "-",
        "fp16 s/a": f"{yes(d.fp16_storage)}/{yes(d.fp16_arithmetic)}",
        "int8": yes(d.int8_storage),
        "subgroup": f"{d.subgroup_size}{' +arith' if d.subgroup_arithmetic else ''}",
        "memory": ", ".join(_gib(h.size) for h in local) or "-",
        "modes": ",".join(p.value for p in d.supported_precisions()),
    }


def format_table(devices: list[DeviceCaps]) -> str:
    rows = [_row(d) for d in devices]
    cols = list(rows[0])
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(width[c]) for c in cols)]
    lines += ["  ".join(r[c].ljust(width[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def main(args: argparse.Namespace) -> int:
    devices = discover_devices()
    if args.json:
        # "device" replaces discovery's "index" (the CPU's would be the number after the GPUs')
        print_json([{"device": device_name(d.kind, d.index),
                     **{k: v for k, v in d.summary().items() if k != "index"}} for d in devices],
                   indent=2)
    else:
        print(format_table(devices))
        for d in devices:
            if d.kind.value == "vulkan":
                print(f"{device_name(d.kind, d.index)}: pipelineCacheUUID {d.pipeline_cache_uuid.hex()}, "
                      f"driver version {d.driver_version:#x}, cooperative matrix "
                      f"{'yes' if d.cooperative_matrix else 'no'}")
    return 0
