"""The CPU engine's depthwise kernels side by side, one layer at a time, on this host.

    python benchmarks/depthwise_layers.py [--repeat N] [--threads T]

For each of the mobile models' depthwise shapes (3x3 and 5x5, stride 1 and 2, ReLU6 fused)
the planes kernel (``jit.depthwise``), the row runs (``jit.dwrows``) and the channel blocks
(``jit.dwblocks``) run alternating in this process on the same bf16 input, the channels split
into T tasks; printed: the median of N calls each, ms, whether the outputs are the same bits,
and which kernel ``kernels.conv.Convolution``'s rule gives the layer on this host: this
measures what the rule is built on.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import interleaved_ms  # noqa: E402

#: (channels, map, kernel, stride)
SHAPES = [(384, 14, 3, 1), (576, 14, 3, 1), (960, 7, 3, 1), (192, 28, 3, 1), (144, 56, 3, 1), (32, 112, 3, 1),
          (96, 112, 3, 1), (64, 20, 3, 1), (672, 14, 5, 1), (120, 20, 5, 1), (240, 28, 5, 1), (1152, 7, 5, 1),
          (32, 112, 3, 2), (96, 112, 3, 2), (144, 56, 3, 2), (240, 56, 5, 2), (256, 28, 3, 2), (512, 14, 3, 2),
          (240, 28, 5, 2), (672, 14, 5, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ["VKSERVE_CPU_THREADS"] = str(args.threads)
    import numpy as np

    from vkserve.devices.cpu import jit
    from vkserve.devices.cpu.bf16 import to_bf16

    rng = np.random.default_rng(0)
    clip = jit.epilogue_ops(3, (0.0, 6.0))
    print(f"vectors: {jit.VECTORS.vector_bits} bits; tasks: {args.threads}; median of {args.repeat} calls, ms")
    for c, hw, k, st in SHAPES:
        p = k // 2
        o = (hw + 2 * p - k) // st + 1
        x = to_bf16(rng.standard_normal((c, hw, hw)).astype(np.float32))
        w16 = to_bf16(rng.standard_normal((c, k * k)).astype(np.float32))
        bias = rng.standard_normal(c).astype(np.float32)
        geo = jit.geometry(c, 1, 1, k, k, st, st, 1, 1, p, p, o, o)
        padv = np.float32(0.0)
        outs: dict[str, np.ndarray] = {}
        runs: dict[str, Callable[[np.ndarray], object]] = {
            "planes": lambda out: jit.depthwise(x, x.reshape(c, -1), w16, bias, clip, padv, geo, args.threads, out),
            "rows": lambda out: jit.dwrows.depthwise_rows(x, w16, bias, clip, padv, geo, args.threads, out)}
        pw, pb = jit.dwblocks.pack_weights(w16, c, k * k), jit.dwblocks.pack_bias(bias)
        runs["blocks"] = lambda out: jit.dwblocks.depthwise_blocks(x, x.reshape(c, -1), pw, pb, clip, padv, geo,
                                                                  args.threads, out)
        blocks = jit.dwblocks.worthwhile(k, k, st, st, 1, 1, 1, (p, p, p, p), o)
        chosen = "rows" if jit.dwrows.worthwhile(k, k, st, st, 1, 1, o) else "blocks" if blocks else "planes"
        with jit.launch():
            for name, run in runs.items():
                outs[name] = np.empty((c, o * o), np.uint16)
                run(outs[name])
            ms = interleaved_ms({name: functools.partial(run, outs[name]) for name, run in runs.items()},
                                args.repeat, warmup=0)
        same = all(np.array_equal(outs["planes"], out) for out in outs.values())
        cells = "  ".join(f"{name} {t:.4f}" for name, t in ms.items())
        print(f"{c} x {hw} x {hw} {k}x{k} stride {st}: {cells}  same bits: {same}  (the rule: {chosen})", flush=True)


if __name__ == "__main__":
    main()
