"""`vkserve tune`: time candidate work-group sizes for each dispatch of a model's Vulkan Plan
and keep the fastest in the device's tuning file (vkserve.devices.vulkan.engine.tuner, .tuning).

The model's GPU time is measured before (layer defaults) and after (a Plan rebuilt with the
tuned table, as `vkserve run` would build it), and the two Plans' outputs are compared, so a
tuned size that broke a shader would show here rather than in production. Both Plans are
profiled after tuning, alternately, over several rounds: profiling "before" first and "after"
last measured clock states, not local sizes (on an H100 the GPU idled down while candidate
pipelines compiled, and "after" read 2.5x slower than a fair comparison).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

import numpy as np

from vkserve.cache.cache_file import DeviceIdentity
from vkserve.cache.persist import default_cache_dir
from vkserve.cli.commands._inputs import UsageError
from vkserve.cli.commands.run import add_common_arguments, prepare
from vkserve.cli.output import CommandFailed, print_json
from vkserve.cli.progress import Progress
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.engine import DeviceNotFound, find_vulkan_device
from vkserve.devices.vulkan.engine.plan import Plan, PlanError, engine_precision
from vkserve.devices.vulkan.engine.profile import profile_plan
from vkserve.devices.vulkan.engine.tuner import DispatchResult, summarize, tune_plan
from vkserve.devices.vulkan.engine.tuning import (
    TuningTable,
    device_tuning_path,
    set_table,
    table_for,
    tunable,
)
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph

NAME = "tune"
HELP = "tune work-group sizes of a model's dispatches on a Vulkan device; save the tuning file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, cpu=False)
    parser.add_argument("--mode", choices=("normal", "rapid"), default="normal",
                        help="candidate list: normal (CLTuner's NORMAL within the device "
                             "limits; default) or rapid (powers of two up to 256 invocations)")
    parser.add_argument("--runs", type=int, default=5,
                        help="timed runs per candidate (median; default 5)")
    parser.add_argument("--margin", type=float, default=0.03,
                        help="a candidate must beat the default by this fraction (default 0.03)")
    parser.add_argument("--profile-runs", type=int, default=20,
                        help="replays for the model's before/after GPU time (default 20)")
    parser.add_argument("--no-save", action="store_true", help="do not write the tuning file")
    parser.set_defaults(random_input=True)


def _row(r: DispatchResult) -> dict[str, Any]:
    out = dataclasses.asdict(r)
    out.update(default_ms=round(r.default_ms, 5), best_ms=round(r.best_ms, 5),
               improved=r.improved)
    return out


def _compare(base: Plan, tuned: Plan, inputs: dict[str, np.ndarray],
             runs: int, rounds: int = 3) -> tuple[float, float]:
    """Median model GPU time of each plan, profiled alternately (see the module doc)."""
    before, after = [], []
    for _ in range(rounds):
        before.append(profile_plan(base, inputs, runs=runs, warmup=10)[1])
        after.append(profile_plan(tuned, inputs, runs=runs, warmup=10)[1])
    return statistics.median(before), statistics.median(after)


def main(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.margin < 0 or args.profile_runs < 1:
        raise CommandFailed.usage("--runs and --profile-runs >= 1, --margin >= 0")
    try:
        _, graph, inputs = prepare(args)
        caps = find_vulkan_device(args.device.index)
        mode = engine_precision(caps, args.precision or "fp32")
    except (UsageError, ModelFormatError, PlanError, DeviceNotFound, ValueError) as e:
        raise CommandFailed.usage(str(e)) from None
    with Progress(NAME, quiet=args.json) as progress:
        return _tune(args, graph, inputs, caps, mode, progress)


def _tune(args: argparse.Namespace, graph: Graph, inputs: dict[str, np.ndarray], caps: DeviceCaps,
          mode: Precision, progress: Progress) -> int:
    from vkserve.devices.vulkan.device import VulkanDevice  # noqa: PLC0415 (Vulkan stays optional)

    shapes = {n: a.shape for n, a in inputs.items()}
    cache_dir = args.cache_dir or default_cache_dir()
    # Tuning builds hundreds of candidate pipelines, which stay alive in the device's
    # PipelineCache until it closes: on an H100, 600 live pipelines made every Plan on the
    # device 3.7x slower. So tuning gets a device of its own, closed without saving (the
    # candidates stay out of the cache file too), and the comparison a fresh one.
    tuner = VulkanDevice(caps, cache_dir)
    try:
        progress.stage(f"building the Vulkan Plan on {args.device}")
        try:
            base = Plan(tuner, graph, shapes, mode, tuned=False, progress=progress)
        except PlanError as e:
            raise CommandFailed.usage(str(e)) from None
        with base:
            fixed = sum(1 for s in base.steps if s.dispatch is not None and not tunable(s.dispatch))
            table = table_for(tuner) or TuningTable(DeviceIdentity.from_caps(caps))
            progress.stage(f"timing candidate work-group sizes ({args.mode} mode)")
            results = tune_plan(base, inputs, table, mode=args.mode, runs=args.runs,
                                margin=args.margin, progress=progress)
        path = device_tuning_path(tuner)
    finally:
        tuner.close(save=False)
    saved = bool(path) and not args.no_save and table.save(path)  # type: ignore[arg-type]
    progress.stage("comparing the default and the tuned Plan (outputs, GPU time)")
    device = VulkanDevice(caps, cache_dir)
    try:
        set_table(device, table)  # also when not saved (--no-save, another writer)
        with Plan(device, graph, shapes, mode, tuned=False) as base, \
                Plan(device, graph, shapes, mode) as tuned:
            expected = base.run(inputs)
            got = tuned.run(inputs)
            tuned_count = tuned.tuned_count
            before, after = _compare(base, tuned, inputs, args.profile_runs)
    finally:
        device.close(save=True)
    diff = max((float(np.max(np.abs(got[k] - expected[k]))) if expected[k].size else 0.0
                for k in expected), default=0.0)
    totals = summarize(results)
    progress.done(f"{totals['dispatches_measured']} distinct dispatches measured, "
                  f"{totals['dispatches_improved']} improved")
    if args.json:
        # dispatches_measured/_improved count distinct dispatches (tuner.summarize);
        # dispatches_using_tuned_size/_with_fixed_local_size count the Plan's dispatches
        print_json({"model": args.model, "device": str(args.device),
                    "device_name": caps.name, "driver_version": caps.driver_version,
                    "precision": mode.value, "mode": args.mode,
                    "tuning_file": str(path) if path else None, "saved": saved,
                    "before_ms": round(before, 5), "after_ms": round(after, 5),
                    "dispatches_using_tuned_size": tuned_count, "max_abs_diff": diff,
                    "dispatches_with_fixed_local_size": fixed,
                    **{k: round(v, 5) if isinstance(v, float) else v for k, v in totals.items()},
                    "dispatches": [_row(r) for r in results]})
        return 0
    print(f"{args.model} on {args.device} ({caps.name}), {mode.value}, {args.mode} mode: "
          f"{totals['dispatches_measured']} distinct dispatches measured, "
          f"{totals['dispatches_improved']} improved, "
          f"{fixed} dispatches keep the local size their shader fixes")
    for r in results:
        mark = "*" if r.improved else " "
        print(f" {mark} #{r.step:<4} {r.label:40.40} global {str(r.global_size):18} "
              f"{str(r.default_local_size):13} {r.default_ms:8.4f} ms -> "
              f"{str(r.best_local_size):13} {r.best_ms:8.4f} ms  ({r.candidates} tried, "
              f"x{r.occurrences})")
    print(f"model GPU time: {before:.4f} ms before, {after:.4f} ms after "
          f"({tuned_count} dispatches with tuned sizes; outputs differ by at most {diff:.3g})")
    if path is None:
        print("no cache folder: tuning file not saved")
    else:
        print(f"tuning file {path}: {'saved' if saved else 'NOT saved'}")
    return 0
