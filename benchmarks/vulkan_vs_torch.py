"""vkserve's Vulkan engine (fp16) vs PyTorch with cuDNN on the same NVIDIA GPU, side by side.

    python benchmarks/vulkan_vs_torch.py [--models DIR] [--repeat 50] [--json OUT]

For each model of ncnn's benchmark set that has a torchvision twin: PyTorch fp16, channels-last,
batch 1, cuDNN autotuning on, the whole step (input copied host -> device, the network, output
copied device -> host) captured once in a CUDA graph and replayed; vkserve's fp16 Plan.run
(copy in, one submit, fence wait, copy out) as it runs by default (cooperative-matrix convolutions
where the device offers them and vulkan.coopmat's rule takes them) and, in the same process,
without them (VKSERVE_COOPMAT=0), so the kernels are compared under the same clocks. Median of `repeat` runs after a warm-up.
The networks are twins (same layer shapes), not the same weights: timing only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.timing import median_ms  # noqa: E402

# ncnn benchmark model -> (torchvision constructor name, its keyword arguments)
TWINS = {
    "vgg16": ("vgg16", {}),
    "resnet18": ("resnet18", {}),
    "resnet50": ("resnet50", {}),
    "alexnet": ("alexnet", {}),
    "squeezenet": ("squeezenet1_1", {}),
    "googlenet": ("googlenet", {"aux_logits": False, "init_weights": False}),
    "efficientnet_b0": ("efficientnet_b0", {}),
    "mobilenet_v3": ("mobilenet_v3_large", {}),
    "shufflenet_v2": ("shufflenet_v2_x1_0", {}),
    "mobilenet_v2": ("mobilenet_v2", {}),
    "pnnx/convnext_tiny": ("convnext_tiny", {}),
}


def torch_ms(name: str, shape: tuple[int, ...], repeat: int) -> float:
    import torch
    import torchvision

    ctor, kwargs = TWINS[name]
    torch.backends.cudnn.benchmark = True
    net = getattr(torchvision.models, ctor)(weights=None, **kwargs).eval().half().cuda()
    net = net.to(memory_format=torch.channels_last)
    host_in = torch.randn(1, *shape).half().pin_memory()
    dev_in = torch.empty(1, *shape, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    with torch.no_grad():
        host_out = torch.empty(net(dev_in).shape, dtype=torch.half).pin_memory()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # cuDNN picks its algorithms before the capture
                dev_in.copy_(host_in, non_blocking=True)
                host_out.copy_(net(dev_in), non_blocking=True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dev_in.copy_(host_in, non_blocking=True)
            host_out.copy_(net(dev_in), non_blocking=True)

    def step() -> None:
        graph.replay()
        torch.cuda.synchronize()

    return median_ms(step, repeat)


def vkserve_ms(graph, inputs: dict, device: int, repeat: int, coopmat: str) -> tuple[float, int]:
    """Median ms and the number of cooperative-matrix dispatches in the Plan."""
    import tempfile

    from vkserve.devices.vulkan.engine import load_plan

    os.environ["VKSERVE_COOPMAT"] = coopmat
    try:
        with tempfile.TemporaryDirectory() as cache_dir:
            loaded = load_plan(graph, device, "fp16", cache_dir=Path(cache_dir))
            try:
                n_coop = sum(1 for step in loaded.plan.steps if step.shader in ("conv_coopmat", "gemm_coopmat"))
                return median_ms(lambda: loaded.plan.run(inputs), repeat), n_coop
            finally:
                loaded.close()
    finally:
        os.environ.pop("VKSERVE_COOPMAT", None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "tests" / "data" / "models")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--coop-tile", help="force conv_coopmat's tile on every layer: FM,FN or FM,FN,KSPLIT "
                    "(benchmarks/coopmat_layers.py; default: the layer's choice)")
    args = ap.parse_args()
    if args.coop_tile:
        from benchmarks.coopmat_layers import force_tile

        force_tile(args.coop_tile)

    import torch

    from benchmarks.coopmat_layers import load_graph
    from vkserve.devices.discovery import discover_devices
    from vkserve.devices.reference import random_inputs

    caps = discover_devices()[args.device]
    header = {"device": caps.name, "torch": torch.__version__, "cuda_device": torch.cuda.get_device_name(0),
              "coop_matrix_shapes": len(caps.cooperative_matrix_shapes), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(header), flush=True)
    rows = []
    for name in TWINS:
        param = args.models / f"{name}.param"
        if (args.only and name not in args.only) or not param.is_file():
            continue
        graph = load_graph(args.models, name)
        (input_name,) = graph.input_names
        shape = tuple(graph.blob_shapes[input_name])
        inputs = random_inputs({input_name: shape})
        row: dict = {"model": name, "shape": list(shape)}
        for key, fn in (("torch_ms", lambda: torch_ms(name, shape, args.repeat)),
                        ("vkserve_ms", lambda: vkserve_ms(graph, inputs, args.device, args.repeat, "auto")),
                        ("vkserve_nocoop_ms", lambda: vkserve_ms(graph, inputs, args.device, args.repeat, "0"))):
            try:
                value = fn()
            except Exception as exc:  # report and go on with the other cases
                row[key] = f"error: {type(exc).__name__}: {exc}"
                continue
            if isinstance(value, tuple):
                row[key], row[key.replace("_ms", "_coop_dispatches")] = round(value[0], 3), value[1]
            else:
                row[key] = round(value, 3)
        if isinstance(row.get("vkserve_ms"), float) and isinstance(row.get("torch_ms"), float):
            row["ratio"] = round(row["vkserve_ms"] / row["torch_ms"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print("| model | PyTorch CUDA graph fp16 ms | vkserve fp16 ms (coopmat dispatches) | vkserve fp16 ms "
          "without coopmat | vkserve / PyTorch |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r.get('torch_ms')} | {r.get('vkserve_ms')} ({r.get('vkserve_coop_dispatches')}) | "
              f"{r.get('vkserve_nocoop_ms')} | {r.get('ratio', '-')} |")
    if args.json:
        args.json.write_text(json.dumps({**header, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
