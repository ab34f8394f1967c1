"""Descriptor writes: update templates vs vkUpdateDescriptorSets, per Vulkan device.

    python benchmarks/descriptor_templates.py [--device N] [--sets 2000] [--bindings 2,4,8]
                                               [--runs 5] [--json OUT]

Times `DescriptorPool.allocate` (allocate one set and write its storage-buffer bindings)
for `--sets` sets, with templates and without, alternating runs; prints the median
microseconds per set of each and their ratio. This is the cost a Plan pays per dispatch
when it records (descriptor sets are written once per Plan, then replayed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from vkserve.devices.capabilities import DeviceKind, Precision
from vkserve.devices.discovery import discover_devices
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.context import MemoryKind, VulkanContext
from vkserve.devices.vulkan.descriptors import DescriptorPool
from vkserve.devices.vulkan.pipeline import ComputePipeline


def shader(bindings: int) -> str:
    decls = "".join(f"layout (binding = {i}) buffer b{i} {{ float d{i}[]; }};\n"
                    for i in range(bindings))
    body = "".join(f"    d{i}[g] += 1.0;\n" for i in range(bindings))
    return (f"#version 450\nlayout (local_size_x = 64) in;\n{decls}"
            f"void main() {{\n    uint g = gl_GlobalInvocationID.x;\n{body}}}\n")


def time_sets(ctx: VulkanContext, pipeline: ComputePipeline, buffers: list, sets: int,
              templates: bool) -> float:
    """Seconds per set written."""
    pool = DescriptorPool(ctx, sets, sets * len(buffers), use_templates=templates)
    try:
        t0 = time.perf_counter()
        for _ in range(sets):
            pool.allocate(pipeline.set_layout, buffers)
        return (time.perf_counter() - t0) / sets
    finally:
        pool.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--sets", type=int, default=2000)
    ap.add_argument("--bindings", default="2,4,8")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    gpus = [d for d in discover_devices() if d.kind is DeviceKind.VULKAN]
    caps = next(d for d in gpus if d.index == args.device)
    ctx = VulkanContext(caps)
    rows = []
    try:
        for n in (int(x) for x in args.bindings.split(",")):
            spirv = compile_glsl(shader(n), caps=caps, precision=Precision.FP32)
            pipeline = ComputePipeline(ctx, spirv, n, local_size=(64, 1, 1))
            buf = ctx.create_buffer(256 * n, MemoryKind.DEVICE)
            buffers = [(buf, 256 * i, 256) for i in range(n)]
            timings: dict[bool, list[float]] = {True: [], False: []}
            try:
                time_sets(ctx, pipeline, buffers, 50, True)  # warm-up both paths
                time_sets(ctx, pipeline, buffers, 50, False)
                for _ in range(args.runs):
                    for templates in (True, False):
                        timings[templates].append(
                            time_sets(ctx, pipeline, buffers, args.sets, templates))
            finally:
                pipeline.destroy()
                buf.destroy()
            t, w = (statistics.median(timings[k]) * 1e6 for k in (True, False))
            rows.append({"device": caps.name, "bindings": n, "template_us_per_set": round(t, 2),
                         "writes_us_per_set": round(w, 2), "template_vs_writes": round(t / w, 3)})
            print(f"{caps.name}: {n} bindings: template {t:.2f} us/set, "
                  f"vkUpdateDescriptorSets {w:.2f} us/set, ratio {t / w:.3f}")
    finally:
        ctx.destroy()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
