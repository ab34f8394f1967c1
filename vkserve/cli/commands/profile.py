"""`vkserve profile`: where a model's time goes, step by step: the GPU time of each dispatch of
its Vulkan Plan (timestamp queries), or the wall time of each CPU Plan step."""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from vkserve.cli.commands._inputs import UsageError
from vkserve.cli.commands.run import add_common_arguments, prepare
from vkserve.cli.output import CommandFailed, print_json
from vkserve.cli.progress import Progress
from vkserve.devices.cpu import threads
from vkserve.devices.cpu.executor import Plan as CpuPlan
from vkserve.devices.cpu.executor import PlanError as CpuPlanError
from vkserve.devices.vulkan.engine import DeviceNotFound, load_plan
from vkserve.devices.vulkan.engine.plan import PlanError
from vkserve.devices.vulkan.engine.profile import profile_plan
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph

NAME = "profile"
HELP = "per-dispatch GPU time of a model on a Vulkan device, or per-layer time on the CPU"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, default="vulkan:0")
    parser.add_argument("--runs", type=int, default=20, help="timed runs (median; default 20)")
    parser.add_argument("--top", type=int, default=15, help="slowest steps to list")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU engine threads (default: $VKSERVE_CPU_THREADS, else the cores "
                             "this process may use)")
    parser.set_defaults(random_input=True)


def main(args: argparse.Namespace) -> int:
    with Progress(NAME, quiet=args.json) as progress:
        try:
            _, graph, inputs = prepare(args)
        except (UsageError, ModelFormatError, ValueError) as e:
            raise CommandFailed.usage(str(e)) from None
        if args.device.is_cpu:
            return _profile_cpu(args, graph, inputs, progress)
        try:
            progress.stage(f"building the Vulkan Plan on {args.device}")
            loaded = load_plan(graph, args.device.index, args.precision or "fp32",
                               {n: a.shape for n, a in inputs.items()}, cache_dir=args.cache_dir,
                               progress=progress)
        except (PlanError, DeviceNotFound, ValueError) as e:
            raise CommandFailed.usage(str(e)) from None
        with loaded:
            progress.stage(f"timing {args.runs} replays of {len(loaded.plan.steps)} dispatches")
            steps, total = profile_plan(loaded.plan, inputs, runs=args.runs)
    shaders = _grouped((s.shader, s.ms) for s in steps)
    if args.json:
        print_json({"model": args.model, **loaded.info(), "gpu_ms": round(total, 4),
                    "steps": [dataclasses.asdict(s) for s in steps],
                    "by_shader": [{"shader": k, "ms": round(ms, 4), "dispatches": n}
                                  for k, ms, n in shaders]})
        return 0
    print(f"{args.model} on {args.device} ({loaded.device.caps.name}), "
          f"{loaded.plan.precision.value}: {total:.3f} ms of GPU time in {len(steps)} dispatches "
          f"({loaded.plan.barrier_count} barriers), median of {args.runs}")
    summary = loaded.plan.summary()
    if any(summary[k] for k in ("folded_residuals", "zero_copy_concats", "folded_permutes", "folded_scales",
                                "folded_activations", "folded_norms")):
        print(f"  recorded as fewer dispatches: {summary['folded_residuals']} residual sums (and their "
              f"ReLU) in the convolution or Gemm before them, {summary['zero_copy_concats']} Concats in place, "
              f"{summary['folded_permutes']} Permutes folded into the layers beside them, "
              f"{summary['folded_scales']} constant scales in a Gemm's weights, "
              f"{summary['folded_activations']} activation layers in the Gemm before them, "
              f"{summary['folded_norms']} LayerNorms in the Gemm after them")
    _print_groups("by shader", shaders, total, "dispatches")
    print(f"\nslowest {args.top} dispatches:")
    for s in sorted(steps, key=lambda s: -s.ms)[:args.top]:
        print(f"  {s.ms:8.3f} ms  #{s.index:<4} {s.label}  groups {s.groups}")
    return 0


def _profile_cpu(args: argparse.Namespace, graph: Graph, inputs: dict[str, np.ndarray],
                 progress: Progress) -> int:
    """Each CPU Plan step's wall time (median of ``--runs``), summed per layer type."""
    if args.threads < 0:
        raise CommandFailed.usage(f"--threads {args.threads}: give a positive count (0: the default)")
    source = threads.configure(args.threads)
    try:
        plan = CpuPlan(graph, {n: a.shape for n, a in inputs.items()})
    except (CpuPlanError, ValueError) as e:
        raise CommandFailed.usage(str(e)) from None
    progress.stage(f"timing {args.runs} runs on the CPU, step by step")
    steps = plan.profile(inputs, runs=args.runs)
    total = sum(s.ms for s in steps)
    types = _grouped((s.type, s.ms) for s in steps)
    if args.json:
        print_json({"model": args.model, "device": "cpu", "precision": "bf16",
                    "threads": threads.THREADS, "step_ms": round(total, 4),
                    "steps": [dataclasses.asdict(s) for s in steps],
                    "by_type": [{"type": k, "ms": round(ms, 4), "steps": n} for k, ms, n in types]})
        return 0
    print(f"{args.model} on the CPU, bf16, {source}: {total:.3f} ms in {len(steps)} steps "
          f"(sum of per-step medians of {args.runs} runs)")
    _print_groups("by layer type", types, total, "steps")
    print(f"\nslowest {args.top} steps:")
    for s in sorted(steps, key=lambda s: -s.ms)[:args.top]:
        fused = f" (+{', '.join(s.fused)})" if s.fused else ""
        print(f"  {s.ms:8.3f} ms  {s.name} ({s.type}){fused}")
    return 0


def _grouped(items: Iterable[tuple[str, float]]) -> list[tuple[str, float, int]]:
    """(key, total ms, count) per key, the largest total first."""
    groups: dict[str, list[float]] = defaultdict(list)
    for key, ms in items:
        groups[key].append(ms)
    return sorted(((k, sum(v), len(v)) for k, v in groups.items()), key=lambda t: -t[1])


def _print_groups(title: str, groups: list[tuple[str, float, int]], total: float, unit: str) -> None:
    print(f"\n{title}:")
    for key, ms, n in groups:
        print(f"  {key:20} {ms:8.3f} ms  {100 * ms / total:5.1f} %  {n:4} {unit}")
