"""How `vkserve infer` shows a reply's meanings (a model's ``[postprocess]``): text lines, JSON,
and a segmentation mask written as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vkserve.cli.commands._inputs import UsageError
from vkserve.client.meaning import Detections, Meaning, SegmentationMask, TopK, meanings_to_wire

__all__ = ["meaning_lines", "meanings_json", "save_mask"]


def _name(index: int, label: str | None) -> str:
    return f"{index} {label}" if label is not None else str(index)


def meaning_lines(meaning: Meaning) -> list[str]:
    if isinstance(meaning, TopK):
        return [f"top {len(meaning.classes)}:"] + [
            f"  {c.score:8.4f}  {_name(c.index, c.label)}" for c in meaning.classes]
    if isinstance(meaning, Detections):
        return [f"{len(meaning.boxes)} box(es):"] + [
            f"  {b.score:8.4f}  {_name(b.index, b.label)}  "
            f"({b.x0:.1f}, {b.y0:.1f}) - ({b.x1:.1f}, {b.y1:.1f})" for b in meaning.boxes]
    classes, counts = np.unique(meaning.mask, return_counts=True)
    share = ", ".join(f"{int(c)}: {n / meaning.mask.size:.1%}" for c, n in zip(classes, counts, strict=True))
    h, w = meaning.mask.shape
    return [f"mask {w}x{h}, classes {share}"]


def meanings_json(meanings: tuple[Meaning, ...]) -> list[dict[str, Any]]:
    """The wire form, with a mask as its shape and the classes it holds (not its pixels)."""
    out = meanings_to_wire(tuple(m for m in meanings if not isinstance(m, SegmentationMask)))
    for m in meanings:
        if isinstance(m, SegmentationMask):
            out.append({"kind": m.kind.value, "shape": list(m.mask.shape),
                        "classes": [int(c) for c in np.unique(m.mask)]})
    return out


def save_mask(meanings: tuple[Meaning, ...], path: str) -> None:
    masks = [m for m in meanings if isinstance(m, SegmentationMask)]
    if len(masks) != 1:
        raise UsageError(f"--save-mask {path}: the reply holds {len(masks)} segmentation "
                         "mask(s), not 1 (is the model's [postprocess] kind \"segmentation\"?)")
    try:
        from PIL import Image
    except ImportError:
        raise UsageError("--save-mask needs Pillow: pip install 'vkserve[images]'") from None
    try:  # uint8 masks as 8-bit grey, uint16 ones (over 256 classes) as 16-bit
        Image.fromarray(masks[0].mask).save(Path(path), format="PNG")
    except (OSError, ValueError) as exc:
        raise UsageError(f"--save-mask {path}: cannot write it: {exc}") from None
