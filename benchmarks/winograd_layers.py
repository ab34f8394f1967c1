"""Per layer: Winograd F(2x2, 3x3) and F(4x4, 3x3) (conv_winograd) against the kernel each
3x3 stride-1 convolution takes without them, GPU time side by side.

    python benchmarks/winograd_layers.py [--models DIR] [--only vgg16 resnet18 ...]
        [--precisions fp16 fp32] [--tiles 2 4] [--runs 20] [--device 0] [--json OUT]

For each model and precision the Plan is profiled (`coopmat_layers.profiled`: per-dispatch GPU
timestamps, median of `runs` replays) with VKSERVE_WINOGRAD=0 and each of `--tiles` in one
process, twice each, alternating (the host's clocks move between Plans), and every convolution
that took conv_winograd is listed with its input and output channels, output size, the kernel
it runs otherwise (conv_gemm or conv_coopmat: VKSERVE_COOPMAT's rule) and the times (each the
lower of its two Plans; a layer's passes summed): the data for `vulkan.winograd.winograd_tile`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.coopmat_layers import graph_and_inputs, profiled  # noqa: E402


def conv_shapes(graph) -> dict[str, tuple[int, int, int, int]]:
    """Convolution label prefix -> (in channels, out channels, out h, out w)."""
    out = {}
    for layer in graph.layers:
        if layer.type == "Convolution":
            oc, oh, ow = graph.blob_shapes[layer.outputs[0]]
            out[f"{layer.name} ({layer.type})"] = (graph.blob_shapes[layer.inputs[0]][0], oc, oh, ow)
    return out


def best_of(runs: list[dict[str, tuple[set[str], float]]]) -> dict[str, tuple[set[str], float]]:
    return {label: (runs[0][label][0], min(r[label][1] for r in runs)) for label in runs[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "tests" / "data" / "models")
    ap.add_argument("--only", nargs="*", default=["vgg16", "resnet18", "resnet50"])
    ap.add_argument("--precisions", nargs="*", default=["fp16", "fp32"])
    ap.add_argument("--tiles", nargs="*", default=["2", "4"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    rows = []
    for name in args.only:
        graph, inputs = graph_and_inputs(args.models, name)
        shapes = conv_shapes(graph)
        for precision in args.precisions:
            modes = ["0", *args.tiles]
            runs: dict[str, list] = {mode: [] for mode in modes}
            for _ in range(2):
                for mode in modes:
                    runs[mode].append(profiled(graph, inputs, args.device, {"VKSERVE_WINOGRAD": mode},
                                               args.runs, precision))
            base = best_of(runs["0"])
            tiled = {mode: best_of(runs[mode]) for mode in args.tiles}
            for label, (shaders, _) in tiled[args.tiles[0]].items():
                if "winograd_output" not in shaders or label not in base:
                    continue
                cin, cout, oh, ow = shapes[label]
                rows.append({"model": name, "precision": precision, "layer": label, "in": cin, "out": cout,
                             "h": oh, "w": ow, "other": "/".join(sorted(base[label][0])),
                             "other_ms": round(base[label][1], 4),
                             **{f"F{m}_ms": round(tiled[m][label][1], 4) for m in args.tiles},
                             "gemm": "/".join(sorted(shaders - {"winograd_input", "winograd_output"}))})
                print(json.dumps(rows[-1]), flush=True)
            rows.append({"model": name, "precision": precision, "layer": "(whole model, GPU)",
                         "other_ms": round(sum(v[1] for v in base.values()), 4),
                         **{f"F{m}_ms": round(sum(v[1] for v in tiled[m].values()), 4) for m in args.tiles}})
            print(json.dumps(rows[-1]), flush=True)
    print("| model | precision | layer | in -> out, output | other kernel | other ms | "
          + " | ".join(f"F({m}, 3) ms (ratio)" for m in args.tiles) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(args.tiles))
    for r in rows:
        shape = f"{r['in']} -> {r['out']}, {r['h']}x{r['w']}" if "in" in r else ""
        cells = " | ".join(f"{r[f'F{m}_ms']} ({r[f'F{m}_ms'] / max(r['other_ms'], 1e-9):.2f})" for m in args.tiles)
        print(f"| {r['model']} | {r['precision']} | {r['layer']} | {shape} | {r.get('other', '')} | "
              f"{r['other_ms']} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
