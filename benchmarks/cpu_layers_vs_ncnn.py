"""Where a model's CPU time goes against ncnn, layer by layer: each of its convolutions (and
other layers of the types asked for) run alone, as a one-layer model, on both engines.

    python benchmarks/cpu_layers_vs_ncnn.py --model resnet50 [--threads N] [--rounds R]
        [--repeat K] [--types Convolution,ConvolutionDepthWise,InnerProduct] [--limit N]
        [--shape NAME=d0,d1,...] [--json OUT]

A layer becomes an Input of its input blob's shape and the layer's own line (its parameters,
its fused activation among them; the layers after it left out); layers of the same type, input
shape and parameters are measured once and counted. The one-layer models then run through
``cpu_vs_ncnn.py`` (seeded random weights, the same for both engines, interleaved rounds, the
median of R x K runs; a run includes narrowing the fp32 input, as ncnn's does), and the table
gives each kind's times, its ratio, and its count times its time: where the model loses. Unlike
``cpu_stages_vs_ncnn.py`` (prefixes of the model: ncnn's blobs extracted at stage ends), nothing
here is a difference of two timings, so a layer's row does not carry its neighbours' noise; a
layer measured alone runs with cold input and a warm cache that a model's run does not give it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from vkserve.cli.commands._inputs import parse_shapes  # noqa: E402
from vkserve.models.graph import load_model  # noqa: E402

MODELS = HERE.parent / "tests" / "data" / "models"
TYPES = "Convolution,ConvolutionDepthWise,InnerProduct"


@dataclasses.dataclass
class LayerKind:
    """One-layer model: a layer's type, input shape and parameters, and the layers sharing them."""

    type: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    params: str
    names: list[str] = dataclasses.field(default_factory=list)

    def param_text(self) -> str:
        """The ncnn .param of an Input of ``in_shape`` (ncnn's w, h, c) and the layer."""
        dims = " ".join(f"{i}={d}" for i, d in enumerate(reversed(self.in_shape)))
        return f"7767517\n2 2\nInput data 0 1 data {dims}\n{self.type} op 1 1 data out {self.params}\n"


def layer_kinds(param: Path, types: set[str], shapes: dict[str, tuple[int, ...]]) -> list[LayerKind]:
    """The model's layers of ``types`` with one input and one output, by kind, in file order."""
    graph = load_model(param, None, shapes or None)
    lines = param.read_text().splitlines()
    kinds: dict[tuple[str, tuple[int, ...], str], LayerKind] = {}
    for layer in graph.layers:
        if layer.type not in types or len(layer.inputs) != 1 or len(layer.outputs) != 1:
            continue
        tokens = lines[layer.line - 1].split()
        params = " ".join(tokens[4 + len(layer.inputs) + len(layer.outputs):])
        in_shape = tuple(graph.blob_shapes[layer.inputs[0]])
        key = (layer.type, in_shape, params)
        if key not in kinds:
            kinds[key] = LayerKind(layer.type, in_shape, tuple(graph.blob_shapes[layer.outputs[0]]), params)
        kinds[key].names.append(layer.name)
    return list(kinds.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50", help="a model of tests/data/models (default: resnet50), "
                                                       "or a .param file")
    ap.add_argument("--types", default=TYPES, help=f"layer types to measure (default: {TYPES})")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--limit", type=int, help="measure the first N kinds only")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=d0,d1,...",
                    help="an input's shape where the .param declares none")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    param = Path(args.model) if args.model.endswith(".param") else MODELS / f"{args.model}.param"
    if not param.is_file():
        ap.error(f"no model {param}")
    kinds = layer_kinds(param, set(args.types.split(",")), parse_shapes(args.shape))[:args.limit]
    if not kinds:
        ap.error(f"{param.name} has no layer of the types {args.types}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i, kind in enumerate(kinds):
            (folder / f"L{i:03d}.param").write_text(kind.param_text())
        out = folder / "times.json"
        done = subprocess.run([sys.executable, str(HERE / "cpu_vs_ncnn.py"), "--models", str(folder),
                               "--threads", str(args.threads), "--rounds", str(args.rounds),
                               "--repeat", str(args.repeat), "--json", str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"cpu_vs_ncnn.py failed ({done.returncode}):\n{done.stderr[-3000:]}")
        report = json.loads(out.read_text())
    times = {row["model"]: row for row in report["rows"]}
    rows = []
    for i, kind in enumerate(kinds):
        t = times[f"L{i:03d}"]
        rows.append({"layers": kind.names, "type": kind.type, "in": list(kind.in_shape), "out": list(kind.out_shape),
                     "params": kind.params, "vkserve_ms": t["vkserve_bf16_ms"], "ncnn_bf16_ms": t["ncnn_bf16_ms"],
                     "ncnn_fp32_ms": t["ncnn_fp32_ms"]})
    print(f"{param.stem}, one-layer models, {args.threads} thread(s), median of {args.rounds * args.repeat} runs; "
          f"{report['machine']}\n")
    print("| layers (count) | type | in -> out | vkserve ms | ncnn bf16 ms | ratio | count x (vkserve - ncnn) ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        count = len(r["layers"])
        name = r["layers"][0] + (f" (x{count})" if count > 1 else "")
        shapes = f"{'x'.join(map(str, r['in']))} -> {'x'.join(map(str, r['out']))}"
        print(f"| {name} | {r['type']} | {shapes} | {r['vkserve_ms']} | {r['ncnn_bf16_ms']} | "
              f"{r['vkserve_ms'] / r['ncnn_bf16_ms']:.2f}x | {count * (r['vkserve_ms'] - r['ncnn_bf16_ms']):+.3f} |")
    ours = sum(len(r["layers"]) * r["vkserve_ms"] for r in rows)
    theirs = sum(len(r["layers"]) * r["ncnn_bf16_ms"] for r in rows)
    print(f"\nall measured layers, each times its count: vkserve {ours:.2f} ms, ncnn bf16 {theirs:.2f} ms "
          f"({ours / theirs:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps({"model": param.stem, "threads": args.threads, "machine": report["machine"],
                                         "cpu_flags": report["cpu_flags"], "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
