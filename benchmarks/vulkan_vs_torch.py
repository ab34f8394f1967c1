"""vkserve's Vulkan engine vs PyTorch with cuDNN and vs ncnn's Vulkan path on the same NVIDIA GPU,
side by side, fp16 and fp32.

    python benchmarks/vulkan_vs_torch.py [--models DIR] [--repeat 50] [--precisions fp16 fp32]
                                         [--no-ncnn] [--nocoop] [--json OUT]

For each model of ncnn's benchmark set that has a torchvision twin, in each precision: PyTorch,
channels-last, batch 1, cuDNN autotuning on, the whole step (input copied host -> device, the
network, output copied device -> host) captured once in a CUDA graph and replayed (fp32 as
PyTorch runs it by default: cuDNN's convolutions may use TF32, the header says whether);
vkserve's Plan.run (copy in, one submit, fence wait, copy out) as it runs by default
(cooperative-matrix kernels where the device offers them and vulkan.coopmat's rule takes them;
with --nocoop also without them, VKSERVE_COOPMAT=0); ncnn's Vulkan path (the `ncnn` package,
fp16 storage + arithmetic or fp32, the same seeded weights as vkserve's). All in one process, so
the engines are compared under the same clocks. Median of `repeat` runs after a warm-up. The
PyTorch networks are twins (same layer shapes), not the same weights: timing only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from functools import partial
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
    "efficientnet_b0": ("efficientnet_b0", {}),
    "mobilenet_v3": ("mobilenet_v3_large", {}),
    "shufflenet_v2": ("shufflenet_v2_x1_0", {}),
    "mobilenet_v2": ("mobilenet_v2", {}),
    "pnnx/convnext_tiny": ("convnext_tiny", {}),
    # torchvision's own, exported with pnnx (tests/data/models/README.md)
    "pnnx/googlenet": ("googlenet", {"aux_logits": False, "init_weights": False}),
    "pnnx/mnasnet": ("mnasnet1_0", {}),
    "pnnx/regnety_400m": ("regnet_y_400mf", {}),
}


def torch_ms(name: str, shape: tuple[int, ...], repeat: int, precision: str) -> float:
    import torch
    import torchvision

    ctor, kwargs = TWINS[name]
    dtype = torch.half if precision == "fp16" else torch.float
    torch.backends.cudnn.benchmark = True
    net = getattr(torchvision.models, ctor)(weights=None, **kwargs).eval().to(dtype).cuda()
    net = net.to(memory_format=torch.channels_last)
    host_in = torch.randn(1, *shape).to(dtype).pin_memory()
    dev_in = torch.empty(1, *shape, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    with torch.no_grad():
        host_out = torch.empty(net(dev_in).shape, dtype=dtype).pin_memory()
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


def vkserve_ms(graph, inputs: dict, device: int, repeat: int, coopmat: str, precision: str) -> tuple[float, int]:
    """Median ms and the number of cooperative-matrix dispatches in the Plan."""
    from vkserve.devices.vulkan.engine import load_plan

    os.environ["VKSERVE_COOPMAT"] = coopmat
    try:
        with tempfile.TemporaryDirectory() as cache_dir:
            loaded = load_plan(graph, device, precision, cache_dir=Path(cache_dir))
            try:
                n_coop = sum(1 for step in loaded.plan.steps if step.shader in ("conv_coopmat", "gemm_coopmat"))
                return median_ms(lambda: loaded.plan.run(inputs), repeat), n_coop
            finally:
                loaded.close()
    finally:
        os.environ.pop("VKSERVE_COOPMAT", None)


def ncnn_ms(name: str, models: Path, graph, inputs: dict, device: int, repeat: int, precision: str,
            bins: Path) -> float:
    """ncnn's Vulkan path on the model with vkserve's seeded weights (written once per model)."""
    from benchmarks.vulkan_vs_ncnn import ncnn_case
    from vkserve.models.weights import write_bin

    bin_path = bins / f"{name.replace('/', '_')}.bin"
    if not bin_path.exists():
        write_bin(graph.layers, bin_path)
    return ncnn_case(models / f"{name}.param", bin_path, inputs, list(graph.output_names),
                     precision == "fp16", device, repeat)["ms"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "tests" / "data" / "models")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--precisions", nargs="+", choices=("fp16", "fp32"), default=["fp16", "fp32"])
    ap.add_argument("--no-ncnn", action="store_true", help="leave ncnn's column out")
    ap.add_argument("--nocoop", action="store_true", help="also vkserve without the tensor cores (VKSERVE_COOPMAT=0)")
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

    if not args.no_ncnn:
        import ncnn

        ncnn.create_gpu_instance()
    caps = discover_devices()[args.device]
    header = {"device": caps.name, "torch": torch.__version__, "cuda_device": torch.cuda.get_device_name(0),
              "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
              "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
              "coop_matrix_shapes": len(caps.cooperative_matrix_shapes), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(header), flush=True)
    rows = []
    bins = Path(tempfile.mkdtemp(prefix="vkbench-"))
    for name in TWINS:
        param = args.models / f"{name}.param"
        if (args.only and name not in args.only) or not param.is_file():
            continue
        graph = load_graph(args.models, name)
        (input_name,) = graph.input_names
        shape = tuple(graph.blob_shapes[input_name])
        inputs = random_inputs({input_name: shape})
        row: dict = {"model": name, "shape": list(shape)}
        for prec in args.precisions:
            cases = [(f"torch_{prec}", partial(torch_ms, name, shape, args.repeat, prec)),
                     (f"vkserve_{prec}", partial(vkserve_ms, graph, inputs, args.device, args.repeat, "auto", prec))]
            if args.nocoop and prec == "fp16":
                cases.append((f"vkserve_nocoop_{prec}",
                              partial(vkserve_ms, graph, inputs, args.device, args.repeat, "0", prec)))
            if not args.no_ncnn:
                cases.append((f"ncnn_{prec}",
                              partial(ncnn_ms, name, args.models, graph, inputs, args.device, args.repeat, prec, bins)))
            for key, fn in cases:
                try:
                    value = fn()
                except Exception as exc:  # report and go on with the other cases
                    row[key] = f"error: {type(exc).__name__}: {exc}"
                    continue
                if isinstance(value, tuple):
                    row[key], row[f"{key}_coop_dispatches"] = round(value[0], 3), value[1]
                else:
                    row[key] = round(value, 3)
            for other in ("torch", "ncnn"):
                if isinstance(row.get(f"vkserve_{prec}"), float) and isinstance(row.get(f"{other}_{prec}"), float):
                    row[f"vs_{other}_{prec}"] = round(row[f"vkserve_{prec}"] / row[f"{other}_{prec}"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if not args.no_ncnn:
        ncnn.destroy_gpu_instance()
    print()
    for prec in args.precisions:
        print(f"| model | PyTorch CUDA graph {prec} ms | vkserve {prec} ms (coopmat dispatches) | ncnn {prec} ms | "
              "vkserve / PyTorch | vkserve / ncnn |" + (" vkserve fp16 without coopmat |" if args.nocoop and prec == "fp16" else ""))
        print("|---|---|---|---|---|---|" + ("---|" if args.nocoop and prec == "fp16" else ""))
        for r in rows:
            extra = f" {r.get('vkserve_nocoop_fp16')} |" if args.nocoop and prec == "fp16" else ""
            print(f"| {r['model']} | {r.get(f'torch_{prec}')} | {r.get(f'vkserve_{prec}')} "
                  f"({r.get(f'vkserve_{prec}_coop_dispatches')}) | {r.get(f'ncnn_{prec}', '-')} | "
                  f"{r.get(f'vs_torch_{prec}', '-')} | {r.get(f'vs_ncnn_{prec}', '-')} |" + extra)
        print()
    if args.json:
        args.json.write_text(json.dumps({**header, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
