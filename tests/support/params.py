"""Param text for single-layer (or few-layer) test nets: Input layers, then the given lines."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path


def param_text(inputs: Iterable[str], lines: Sequence[str]) -> str:
    """ncnn .param text: one ``Input`` per name of ``inputs``, then ``lines``; the header's blob
    count is counted from the lines."""
    body = [f"Input {name} 0 1 {name}" for name in inputs] + list(lines)
    blobs: set[str] = set()
    for line in body:
        tok = line.split()
        nin, nout = int(tok[2]), int(tok[3])
        blobs.update(tok[4:4 + nin + nout])
    return "7767517\n" + f"{len(body)} {len(blobs)}\n" + "\n".join(body) + "\n"


#: three 2048 x 2048 InnerProducts: 16 MiB of fp32 weights each
BIG_FC = """7767517
4 4
Input            data   0 1 data 0=2048
InnerProduct     fc1    1 1 data h1 0=2048 1=1 2=4194304
InnerProduct     fc2    1 1 h1 h2 0=2048 1=1 2=4194304
InnerProduct     fc3    1 1 h2 out 0=2048 1=1 2=4194304
"""


def big_fc_model(folder: Path, seed: int) -> tuple[Path, Path]:
    """`BIG_FC` as big.param and a seeded big.bin in `folder`: for checks that a load holds
    one layer's weights at a time, not the model's."""
    from vkserve.models.weights import write_random_bin

    param = folder / "big.param"
    param.write_text(BIG_FC)
    write_random_bin(param, folder / "big.bin", seed=seed)
    return param, folder / "big.bin"
