"""`vkserve profile`: GPU time of each dispatch of a model's Vulkan Plan (timestamp queries)."""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict

from vkserve.cli.commands._inputs import UsageError
from vkserve.cli.commands.run import add_common_arguments, prepare
from vkserve.cli.output import CommandFailed, print_json
from vkserve.cli.progress import Progress
from vkserve.devices.vulkan.engine import DeviceNotFound, load_plan
from vkserve.devices.vulkan.engine.plan import PlanError
from vkserve.devices.vulkan.engine.profile import profile_plan
from vkserve.models.errors import ModelFormatError

NAME = "profile"
HELP = "per-dispatch GPU time of a model on a Vulkan device"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, cpu=False)
    parser.add_argument("--runs", type=int, default=20, help="timed replays (median; default 20)")
    parser.add_argument("--top", type=int, default=15, help="slowest dispatches to list")
    parser.set_defaults(random_input=True)


def main(args: argparse.Namespace) -> int:
    with Progress(NAME, quiet=args.json) as progress:
        try:
            _, graph, inputs = prepare(args)
            progress.stage(f"building the Vulkan Plan on {args.device}")
            loaded = load_plan(graph, args.device.index, args.precision or "fp32",
                               {n: a.shape for n, a in inputs.items()}, cache_dir=args.cache_dir,
                               progress=progress)
        except (UsageError, ModelFormatError, PlanError, DeviceNotFound, ValueError) as e:
            raise CommandFailed.usage(str(e)) from None
        with loaded:
            progress.stage(f"timing {args.runs} replays of {len(loaded.plan.steps)} dispatches")
            steps, total = profile_plan(loaded.plan, inputs, runs=args.runs)
    by_shader: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        by_shader[s.shader].append(s.ms)
    shaders = sorted(((k, sum(v), len(v)) for k, v in by_shader.items()), key=lambda t: -t[1])
    if args.json:
        print_json({"model": args.model, **loaded.info(), "gpu_ms": round(total, 4),
                    "steps": [dataclasses.asdict(s) for s in steps],
                    "by_shader": [{"shader": k, "ms": round(ms, 4), "dispatches": n}
                                  for k, ms, n in shaders]})
        return 0
    print(f"{args.model} on {args.device} ({loaded.device.caps.name}), "
          f"{loaded.plan.precision.value}: {total:.3f} ms of GPU time in {len(steps)} dispatches "
          f"({loaded.plan.barrier_count} barriers), median of {args.runs}")
    print("\nby shader:")
    for shader, ms, n in shaders:
        print(f"  {shader:20} {ms:8.3f} ms  {100 * ms / total:5.1f} %  {n:4} dispatches")
    print(f"\nslowest {args.top} dispatches:")
    for s in sorted(steps, key=lambda s: -s.ms)[:args.top]:
        print(f"  {s.ms:8.3f} ms  #{s.index:<4} {s.label}  groups {s.groups}")
    return 0
