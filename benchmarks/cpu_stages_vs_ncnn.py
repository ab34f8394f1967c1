"""Where a model's CPU time goes, stage by stage, against ncnn's bf16 path, in one process.

    python benchmarks/cpu_stages_vs_ncnn.py [--model NAME] [--stages BLOB,...] [--threads T] [--runs N]

ncnn computes only what an extracted blob needs, so the time to extract a stage's last blob,
less the time to extract the previous stage's, is that stage's time in ncnn (bf16 storage,
T threads; the stages' extractions interleaved, round after round). vkserve's is the sum of
its Plan's steps up to that blob's producer (``Plan.profile``), less the previous stage's.
Both take the same seeded random weights and input; printed: each stage's median ms of N runs
and the ratio. Extracting a blob includes converting it out of ncnn's packed layout, so a stage
whose last blob is much smaller than the one before comes out short, even under zero (resnet18's
pool1 after conv1): read the two together.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.timing import interleaved_ms  # noqa: E402

MODELS = ROOT / "tests" / "data" / "models"
#: each stage's last blob: the residual stages of resnet18, the pooled blocks of vgg16
STAGES = {
    "resnet18": "conv1_conv1_relu,pool1,res2b_res2b_relu,res3b_res3b_relu,res4b_res4b_relu,res5b_res5b_relu,fc1000",
    "vgg16": "pool1,pool2,pool3,pool4,pool5,fc8",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18", help="a model of tests/data/models (default: resnet18)")
    ap.add_argument("--stages", help="each stage's last blob, in order (default: resnet18's or vgg16's)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    stages = (args.stages or STAGES.get(args.model, "")).split(",")
    if stages == [""]:
        ap.error(f"--stages is needed for {args.model} (known: {', '.join(STAGES)})")
    os.environ["VKSERVE_CPU_THREADS"] = str(args.threads)

    from vkserve.devices.cpu.executor import Plan
    from vkserve.devices.reference import ncnn_extract, ncnn_mats, ncnn_net, random_inputs
    from vkserve.models.graph import load_model
    from vkserve.models.weights import write_random_bin

    param = MODELS / f"{args.model}.param"
    with tempfile.TemporaryDirectory() as tmp:
        bin_path = Path(tmp) / f"{args.model}.bin"
        write_random_bin(param, bin_path, seed=0)
        plan = Plan(load_model(param, bin_path))
        names = [step.name for step in plan._steps]
        producer = {blob: step.name for step in plan._steps for blob in step.outputs}
        missing = [s for s in stages if s not in producer]
        if missing:
            raise SystemExit(f"{args.model} has no blob {', '.join(missing)}")
        inputs = random_inputs({n: plan.blob_shapes[n] for n in plan.input_names})
        net = ncnn_net(param, bin_path, bf16=True, threads=args.threads)
        mats = ncnn_mats(inputs)
        ncnn_ms = interleaved_ms({s: lambda s=s: ncnn_extract(net, mats, [s]) for s in stages}, args.runs)
        step_ms = {t.name: t.ms for t in plan.profile(inputs, runs=args.runs)}
    print(f"{args.model}, {args.threads} thread(s), median of {args.runs} runs, ms\n")
    print("| stage (last blob) | ncnn bf16 | vkserve | ratio |")
    print("|---|---|---|---|")
    before_ncnn = before_ours = 0.0
    for stage in stages:
        upto = names[: names.index(producer[stage]) + 1]
        ours = sum(step_ms.get(name, 0.0) for name in upto)
        a, b = ncnn_ms[stage] - before_ncnn, ours - before_ours
        ratio = f"{b / a:.2f}" if a > 0 else "-"
        print(f"| {stage} | {a:.3f} | {b:.3f} | {ratio} |")
        before_ncnn, before_ours = ncnn_ms[stage], ours


if __name__ == "__main__":
    main()
