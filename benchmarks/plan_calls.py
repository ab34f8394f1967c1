"""A CPU Plan's steps as calls made once against made each run, side by side.

    python benchmarks/plan_calls.py [--threads T] [--rounds N] [--only NAME,...]

For each test model (random weights): a Plan, which makes each storing step's compiled call
(``Kernel.store_call``) and each copying step's copies (``Kernel.view_copies``) once and
repeats them, and its sibling made to run every step through ``_run_step`` each run (the views,
the epilogue, the task counts made again, as before the calls were kept), run alternating in
this process on the same input, T threads; printed: the median of N runs each, ms, their
ratio, how many steps have a call, and whether the outputs are the same bits.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.timing import interleaved_ms  # noqa: E402

MODELS = ROOT / "tests" / "data" / "models"
SMALL = "shufflenet_v2,mobilenet_v2,mobilenet_v3,efficientnet_b0,squeezenet,mobilenet,nanodet_m"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--only", default=SMALL, help=f"comma-separated model names (default: {SMALL})")
    args = ap.parse_args()
    os.environ["VKSERVE_CPU_THREADS"] = str(args.threads)
    import numpy as np

    from vkserve.devices.cpu.executor import Plan
    from vkserve.models.graph import load_model

    print(f"{args.threads} thread(s); median of {args.rounds} runs each, ms\n")
    print("| model | calls made once | made each run | ratio | steps with a call | same bits |")
    print("|---|---|---|---|---|---|")
    for name in args.only.split(","):
        plan = Plan(load_model(MODELS / f"{name}.param", None))
        each = plan.sibling()
        each._bind = lambda count, p=each: [  # type: ignore[method-assign]
            (None, step) for step in p._program_for(count)]
        rng = np.random.default_rng(1)
        x = {n: rng.uniform(-1, 1, plan.blob_shapes[n]).astype(np.float32) for n in plan.input_names}
        for _ in range(5):
            got, want = plan.run(x), each.run(x)
        same = all(np.array_equal(got[k], want[k]) for k in want)
        ms = interleaved_ms({"once": partial(plan.run, x), "each": partial(each.run, x)}, args.rounds, warmup=0)
        calls = max(sum(call is not None for call, _ in bound) for bound in plan._bound.values())
        a, b = ms["once"], ms["each"]
        print(f"| {name} | {a:.3f} | {b:.3f} | {b / a:.3f}x | {calls} of {len(plan._program)} | "
              f"{'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
