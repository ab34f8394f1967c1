"""vkserve's Vulkan engine vs ncnn's Vulkan path, per model, side by side in one process.

    python benchmarks/vulkan_vs_ncnn.py [--models DIR] [--repeat 20] [--device 0] [--json OUT]

Models: DIR/*.param and DIR/pnnx/*.param (pnnx exports, run at --pnnx-shape).

For each model: ncnn (the `ncnn` package) fp32 and fp16 (storage + arithmetic) load time and
median latency;
vkserve fp32 and fp16 cold load (empty pipeline-cache folder), warm load (the file the cold
load saved, new device context) and median latency of `Plan.run` (copy in, one submit,
fence wait, copy out). Both load the same seeded random weights (one .bin written per model:
ncnn's own benchmark uses empty weights, which would make data-dependent layers such as
detection output do different work) and run the same random input; batch 1. NVIDIA's own shader disk cache
is switched off (__GL_SHADER_DISK_CACHE=0) so cold means cold for both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("__GL_SHADER_DISK_CACHE", "0")


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.timing import median_ms  # noqa: E402


def ncnn_case(param: Path, bin_path: Path, inputs: dict, outputs: list[str], fp16: bool,
              device: int, repeat: int) -> dict:
    from vkserve.devices.reference import ncnn_extract, ncnn_mats, ncnn_net

    t0 = time.perf_counter()
    net = ncnn_net(param, bin_path, vulkan_device=device, fp16=fp16)
    load = time.perf_counter() - t0
    mats = ncnn_mats(inputs)
    ms = median_ms(lambda: ncnn_extract(net, mats, outputs), repeat)
    mats.clear()  # release the Mats before the net that allocated them
    net.clear()
    return {"load_s": round(load, 3), "ms": round(ms, 3)}


def vkserve_case(graph, inputs: dict, precision: str, device: int, repeat: int) -> dict:
    from vkserve.devices.vulkan.engine import load_plan

    with tempfile.TemporaryDirectory() as cache_dir:
        cold = load_plan(graph, device, precision, cache_dir=Path(cache_dir))
        cold_s, cold_compiles = cold.load_seconds, cold.glsl_compiles
        cold.close()  # saves the cache file
        warm = load_plan(graph, device, precision, cache_dir=Path(cache_dir))
        try:
            ms = median_ms(lambda: warm.plan.run(inputs), repeat)
            return {"cold_load_s": round(cold_s, 3), "cold_glsl_compiles": cold_compiles,
                    "warm_load_s": round(warm.load_seconds, 3),
                    "warm_glsl_compiles": warm.glsl_compiles, "ms": round(ms, 3),
                    "arena_bytes": warm.plan.summary().get("arena_bytes")}
        finally:
            warm.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "tests" / "data" / "models")
    ap.add_argument("--only", nargs="*", help="model names (default: all)")
    ap.add_argument("--skip", nargs="*", default=[], help="model names to leave out")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--pnnx-shape", type=lambda v: tuple(int(d) for d in v.split(",")), default=(3, 224, 224),
                    help="input shape of models whose Input declares none (default 3,224,224)")
    args = ap.parse_args()
    import ncnn

    from vkserve.devices.discovery import discover_devices
    from vkserve.devices.reference import random_inputs
    from vkserve.models.graph import load_model, read_param
    from vkserve.models.weights import write_bin

    ncnn.create_gpu_instance()
    caps = discover_devices()[args.device]
    header = {"device": caps.name, "driver": f"{caps.driver_name} {caps.driver_info}",
              "date": time.strftime("%Y-%m-%d"), "repeat": args.repeat}
    print(json.dumps(header), flush=True)
    rows = []
    tmp = tempfile.mkdtemp(prefix="vkbench-")
    for param in sorted(args.models.glob("*.param")) + sorted(args.models.glob("pnnx/*.param")):
        if (args.only and param.stem not in args.only) or param.stem in args.skip:
            continue
        # pnnx exports declare no input shape: the torchvision models' 3x224x224 (deeplab's
        # export fixed its Interp sizes for 256x256)
        size = (3, 256, 256) if param.stem == "deeplabv3_mbv3" else args.pnnx_shape
        shapes = {b: size for layer in read_param(param) if layer.type == "Input"
                  and layer.params.declared_shape() is None for b in layer.outputs}
        graph = load_model(param, None, shapes or None, seed=0)
        bin_path = Path(tmp) / f"{param.stem}.bin"
        write_bin(graph.layers, bin_path)
        inputs = random_inputs({n: graph.blob_shapes[n] for n in graph.input_names})
        outputs = list(graph.output_names)
        row: dict = {"model": param.stem}
        for precision in ("fp32", "fp16"):
            try:
                row[f"ncnn_{precision}"] = ncnn_case(param, bin_path, inputs, outputs,
                                                     precision == "fp16", args.device,
                                                     args.repeat)
            except Exception as exc:  # report and go on with the other cases
                row[f"ncnn_{precision}"] = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                row[f"vkserve_{precision}"] = vkserve_case(graph, inputs, precision,
                                                           args.device, args.repeat)
            except Exception as exc:  # report and go on with the other cases
                row[f"vkserve_{precision}"] = {"error": f"{type(exc).__name__}: {exc}"}
            ours, theirs = row[f"vkserve_{precision}"], row[f"ncnn_{precision}"]
            if "ms" in ours and "ms" in theirs:
                row[f"ratio_{precision}"] = round(ours["ms"] / theirs["ms"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    ncnn.destroy_gpu_instance()
    print()
    print("| model | ncnn fp32 ms | vkserve fp32 ms | ratio | ncnn fp16 ms | vkserve fp16 ms | "
          "ratio | ncnn fp16 load s | vkserve fp16 cold / warm load s |")
    print("|---|---|---|---|---|---|---|---|---|")

    def get(r, case, key):
        return r.get(case, {}).get(key, "err")

    for r in rows:
        print(f"| {r['model']} | {get(r, 'ncnn_fp32', 'ms')} | {get(r, 'vkserve_fp32', 'ms')} | "
              f"{r.get('ratio_fp32', '-')} | {get(r, 'ncnn_fp16', 'ms')} | "
              f"{get(r, 'vkserve_fp16', 'ms')} | {r.get('ratio_fp16', '-')} | "
              f"{get(r, 'ncnn_fp16', 'load_s')} | {get(r, 'vkserve_fp16', 'cold_load_s')} / "
              f"{get(r, 'vkserve_fp16', 'warm_load_s')} |")
    if args.json:
        args.json.write_text(json.dumps({**header, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
