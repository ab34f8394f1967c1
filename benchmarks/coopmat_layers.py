"""Per layer: the FMA shaders against the cooperative-matrix ones, GPU time side by side.

    python benchmarks/coopmat_layers.py [--models DIR] [--only resnet50 vgg16] [--runs 20]
        [--tiles auto 1,1 2,2 2,2,1 ...] [--json OUT]

For each model, the fp16 Plan is profiled in one process (`profile_plan`: per-dispatch GPU
timestamps, median of `runs` replays) with VKSERVE_COOPMAT=0, then with =1 once per tile
setting (`auto`: the layer's own choice; `FM,FN`: that tile with K split by the layer's rule;
`FM,FN,KSPLIT`: that tile and split, 1 = not split; `FM,FN,gT`: K split by the layer's rule
aiming at T work groups instead of compute_util.COOP_TARGET_GROUPS), and every convolution that took
conv_coopmat is listed beside its conv_gemm time with its GEMM shape (M output channels per
group, N output pixels, K = input channels per group x kernel taps, groups) and its tile
(a split layer's two dispatches summed), and so is every Gemm / MatMul / MultiHeadAttention
layer with a product on gemm_coopmat (against gemm.comp; M x N x K for a Gemm): the data for a
per-layer choice between the kernels and tiles. Needs a device with VK_KHR_cooperative_matrix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def profiled(graph, inputs: dict, device: int, env: dict[str, str], runs: int,
             precision: str = "fp16") -> dict[str, tuple[set[str], float]]:
    """Layer label -> (its shaders, GPU ms of its dispatches) of one Plan, built with the
    environment variables `env` set (the kernel switches: VKSERVE_COOPMAT, VKSERVE_WINOGRAD)."""
    from vkserve.devices.vulkan.engine import load_plan
    from vkserve.devices.vulkan.engine.profile import profile_plan

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory() as cache_dir:
            loaded = load_plan(graph, device, precision, cache_dir=Path(cache_dir))
            try:
                steps, _ = profile_plan(loaded.plan, inputs, runs=runs)
            finally:
                loaded.close()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    out: dict[str, tuple[set[str], float]] = {}
    for s in steps:
        label = s.label.rsplit(" ", 1)[0]
        shaders, ms = out.get(label, (set(), 0.0))
        out[label] = (shaders | {s.shader}, ms + s.ms)
    return out


ORIGINAL: dict = {}  # the layer's own choose_coop_tile, kept while settings replace it


def force_tile(setting: str) -> None:
    """Make every conv_coopmat layer take `setting` (see the module's docstring)."""
    from vkserve.devices.vulkan.layers import compute_util, conv

    own = ORIGINAL.setdefault("choose", conv.choose_coop_tile)
    if setting == "auto":
        conv.choose_coop_tile = own
        return
    own_target = ORIGINAL.setdefault("target", compute_util.COOP_TARGET_GROUPS)
    fm, fn, *split = setting.split(",")
    target = int(split[0][1:]) if split and split[0].startswith("g") else own_target

    def choose(m: int, n: int, steps: int, groups: int):
        if split and not split[0].startswith("g"):
            per = -(-steps // int(split[0]))
            return conv.CoopTile(int(fm), int(fn), -(-steps // per), per)
        tiles = -(-m // (32 * int(fm))) * -(-n // (64 * int(fn))) * groups
        compute_util.COOP_TARGET_GROUPS = target
        try:
            return conv.CoopTile(int(fm), int(fn), *compute_util.split_k(tiles, steps))
        finally:
            compute_util.COOP_TARGET_GROUPS = own_target

    conv.choose_coop_tile = choose


def load_graph(models: Path, name: str):
    """The model `name` (a .param under `models`, e.g. ``pnnx/convnext_tiny``) with seeded random
    weights; a pnnx export's shapeless input is given 3 x 224 x 224 (the size its twin takes)."""
    from vkserve.models.graph import load_model, read_param

    layers = read_param(models / f"{name}.param")
    shapes = {lr.outputs[0]: (3, 224, 224) for lr in layers
              if lr.type == "Input" and lr.params.declared_shape() is None} or None
    return load_model(models / f"{name}.param", None, shapes, seed=0)


def graph_and_inputs(models: Path, name: str):
    """`load_graph`'s model and seeded random inputs for it."""
    from vkserve.devices.reference import random_inputs

    graph = load_graph(models, name)
    return graph, random_inputs({n: graph.blob_shapes[n] for n in graph.input_names})


def gemm_shapes(graph) -> dict[str, tuple[int, int, int, int]]:
    """Convolution and Gemm layer label prefix -> (M, N, K, groups)."""
    out = {}
    for layer in graph.layers:
        if layer.type == "Gemm":
            m, n, k, _ = layer.params.dims([graph.blob_shapes[b] for b in layer.inputs])
            out[f"{layer.name} ({layer.type})"] = (m, n, k, 1)
        if layer.type not in ("Convolution", "ConvolutionDepthWise"):
            continue
        c = graph.blob_shapes[layer.inputs[0]][0]
        oc, oh, ow = graph.blob_shapes[layer.outputs[0]]
        g = layer.params.group_count()
        out[f"{layer.name} ({layer.type})"] = (oc // g, oh * ow, c // g * layer.params.kernel_h * layer.params.kernel_w, g)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "tests" / "data" / "models")
    ap.add_argument("--only", nargs="*", default=["resnet50", "vgg16", "mobilenet_v2"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tiles", nargs="*", default=["auto"])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    rows = []
    for name in args.only:
        graph, inputs = graph_and_inputs(args.models, name)
        fma = profiled(graph, inputs, args.device, {"VKSERVE_COOPMAT": "0"}, args.runs)
        coop = {}
        for setting in args.tiles:
            force_tile(setting)
            coop[setting] = profiled(graph, inputs, args.device, {"VKSERVE_COOPMAT": "1"}, args.runs)
        force_tile("auto")
        shapes = gemm_shapes(graph)
        totals = {"model": name, "layer": "(whole model, GPU)", "fma_ms": round(sum(v[1] for v in fma.values()), 4)}
        for setting, layers in coop.items():
            totals[setting] = round(sum(v[1] for v in layers.values()), 4)
        for label, (shaders, _) in coop[args.tiles[0]].items():
            if not shaders & {"conv_coopmat", "gemm_coopmat"} or label not in fma:
                continue
            m, n, k, g = shapes.get(label, ("", "", "", ""))
            rows.append({"model": name, "layer": label, "m": m, "n": n, "k": k, "groups": g,
                         "fma_ms": round(fma[label][1], 4),
                         **{setting: round(layers[label][1], 4) for setting, layers in coop.items()}})
            print(json.dumps(rows[-1]), flush=True)
        rows.append(totals)
        print(json.dumps(totals), flush=True)
    print("| model | layer | M | N | K | groups | FMA shaders ms | " + " | ".join(f"coopmat {t} ms" for t in args.tiles) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(args.tiles))
    for r in rows:
        print(f"| {r['model']} | {r['layer']} | {r.get('m', '')} | {r.get('n', '')} | {r.get('k', '')} | "
              f"{r.get('groups', '')} | {r['fma_ms']} | " + " | ".join(str(r[t]) for t in args.tiles) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
