"""`vkserve verify`: run the same input through vkserve and through the ``ncnn`` package
(CPU, fp32) and compare every output; ncnn's own bf16/fp16 run beside it sets how far ours may
deviate (tolerances and the rule in ``vkserve.devices.reference``)."""

from __future__ import annotations

import argparse

from vkserve.cli.commands._inputs import UsageError
from vkserve.cli.commands.run import add_common_arguments, prepare
from vkserve.cli.output import CommandFailed, print_json
from vkserve.cli.progress import Progress
from vkserve.devices.cpu.executor import PlanError
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.devices.reference import NcnnError
from vkserve.devices.vulkan.engine import DeviceNotFound
from vkserve.devices.vulkan.engine.plan import PlanError as VulkanPlanError
from vkserve.devices.vulkan.engine.verify import verify_vulkan
from vkserve.models.errors import ModelFormatError

NAME = "verify"
HELP = ("compare a model's outputs on vkserve with the ncnn package (CPU fp32), beside ncnn's own "
        "bf16/fp16 run; non-zero exit if off")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.3f}%"


def main(args: argparse.Namespace) -> int:
    args.random_input = True
    try:
        files, graph, inputs = prepare(args)
        with Progress(NAME, quiet=args.json) as progress:
            if args.device.is_cpu:
                report = verify_cpu(graph, files.param, files.bin, inputs, seed=args.seed,
                                    reduced=True, progress=progress)
            else:
                report = verify_vulkan(graph, files.param, files.bin, inputs, args.device.index,
                                       args.precision or "fp32", args.cache_dir, reduced=True,
                                       progress=progress)
            progress.done(f"compared {len(report.outputs)} output(s): "
                          f"{'ok' if report.ok else 'MISMATCH'}")
    except (UsageError, ModelFormatError, PlanError, VulkanPlanError, DeviceNotFound, NcnnError) as e:
        raise CommandFailed.usage(str(e)) from None
    if args.json:
        print_json(report.to_json())
    else:
        print(f"{report.model}: device {report.device}, precision {report.precision}")
        print(f"reference {report.reference}; reduced-precision reference "
              f"{report.reduced_reference or 'none (fixed bars)'}")
        print(f"  {'output':<24} {'shape':<18} {'max_abs_err':>12} {'cosine':>10} {'deviation':>10} "
              f"{'ref_dev':>10} {'ref_cosine':>10} {'bar':>10}  ok")
        for o in report.outputs:
            print(f"  {o.name:<24} {str(tuple(o.shape)):<18} {_fmt(o.max_abs_err, '.3e'):>12} "
                  f"{_fmt(o.cosine, '.6f'):>10} {_pct(o.deviation):>10} {_pct(o.ref_deviation):>10} "
                  f"{_fmt(o.ref_cosine, '.6f'):>10} {_pct(o.bar):>10}  {'yes' if o.ok else 'NO'}")
            if o.detections is not None:
                d = o.detections
                print(f"  {'':<24} detections: {d['matched']} matched of {d['reference']} (ncnn) "
                      f"/ {d['ours']} (vkserve)")
        print("OK" if report.ok else "MISMATCH")
    return 0 if report.ok else 1
