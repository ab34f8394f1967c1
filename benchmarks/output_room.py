"""Large outputs written into a client's room by the engine, against the copy it replaced.

    python benchmarks/output_room.py [--devices cpu,vulkan] [--sizes 128,256,512] [--rounds 30]

One 1x1 convolution (3 -> 8 channels on S x S: an output of 8 x S x S fp32, a segmentation
map's size at S = 512) run in process, the two ways alternating in one loop:
- ``copied``: the engine returns a new fp32 array, then it is copied into the region (what the
  daemon did before ``vkserve.devices.output_room``);
- ``room``: the engine writes the output straight into the room (out of staging on a GPU, fp16
  cast on the way; widened from bf16 on the CPU).
Prints the median of the whole (run + outputs in the region) and of the copy-out stage.
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.vulkan_engine import graph_of  # noqa: E402
from vkserve.devices.cpu.executor import Plan as CpuPlan  # noqa: E402
from vkserve.devices.output_room import OutputRoom  # noqa: E402


def run_on(devices: list[str], shape: tuple[int, int, int], rounds: int) -> list[tuple[str, dict]]:
    """Each device's figures for one input shape (a Plan per device, closed after)."""
    graph = graph_of(["Convolution conv 1 1 data out 0=8 1=1 5=1 6=24"], {"data": shape})
    x = np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)
    rows: list[tuple[str, dict]] = []
    if "cpu" in devices:
        rows.append(("cpu (bf16)", measure(CpuPlan(graph), x, rounds)))
    if "vulkan" in devices:
        from vkserve.devices.capabilities import DeviceKind  # noqa: PLC0415
        from vkserve.devices.discovery import discover_devices  # noqa: PLC0415 (optional engine)
        from vkserve.devices.vulkan.engine import load_plan  # noqa: PLC0415

        for caps in (d for d in discover_devices() if d.kind is DeviceKind.VULKAN):
            loaded = load_plan(graph, caps.index, "fp16")
            try:
                rows.append((f"{caps.name} (fp16)", measure(loaded.plan, x, rounds)))
            finally:
                loaded.close()
    return rows


def measure(plan: Any, x: np.ndarray, rounds: int) -> dict[str, tuple[float, float]]:
    size = 8 * x.shape[1] * x.shape[2] * 4
    region = mmap.mmap(-1, size)
    view = np.frombuffer(region, np.float32).reshape(8, x.shape[1], x.shape[2])
    feed = {"data": x}
    for _ in range(3):
        plan.run_batch_timed([feed])
    times: dict[str, list[tuple[float, float]]] = {"copied": [], "room": []}
    for r in range(rounds):
        for way in (("copied", "room") if r % 2 else ("room", "copied")):
            t = time.perf_counter()
            if way == "copied":
                (out,), stages = plan.run_batch_timed([feed])
                np.copyto(view, out["out"])
                copy_out = stages.copy_out + time.perf_counter() - t - stages.copy_in - stages.run - stages.copy_out
            else:
                room = OutputRoom(memoryview(region))
                (out,), stages = plan.run_batch_timed([feed], rooms=[room])
                room.complete(out)
                copy_out = stages.copy_out
                assert np.shares_memory(out["out"], view)
            times[way].append((time.perf_counter() - t, copy_out))
    del view
    return {way: (statistics.median(t for t, _ in got), statistics.median(c for _, c in got))
            for way, got in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="cpu,vulkan")
    ap.add_argument("--sizes", default="128,256,512")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    print("| device | output | copied: whole / copy-out ms | room: whole / copy-out ms | whole, room / copied |")
    print("|---|---|---|---|---|")
    for s in (int(v) for v in args.sizes.split(",")):
        for name, got in run_on(args.devices.split(","), (3, s, s), args.rounds):
            (cw, cc), (rw, rc) = got["copied"], got["room"]
            print(f"| {name} | 8 x {s} x {s} ({8 * s * s * 4 / 2 ** 20:.1f} MiB) | {1e3 * cw:.3f} / {1e3 * cc:.3f} "
                  f"| {1e3 * rw:.3f} / {1e3 * rc:.3f} | {rw / cw:.2f} |", flush=True)

if __name__ == "__main__":
    main()
