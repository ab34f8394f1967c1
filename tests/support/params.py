"""Param text for single-layer (or few-layer) test nets: Input layers, then the given lines."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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
