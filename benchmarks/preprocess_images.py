"""What a model's [preprocess] costs per image in the daemon's worker thread, beside ncnn's
``from_pixels_resize`` + ``substract_mean_normalize`` on the same pixels (the reference).

    python benchmarks/preprocess_images.py [--repeat N] [--json OUT]

For each source size (VGA, 1080p) into a 224x224 BGR input with mean/norm: a decoded uint8
array, the same picture as PNG and as JPEG bytes (decoded by Pillow first), each the median of
``--repeat`` runs of ``vkserve.processing.preprocess.prepare_inputs``; and ncnn on the array.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.timing import median_ms  # noqa: E402
from vkserve.processing.config import PixelFormat, Preprocess  # noqa: E402
from vkserve.processing.preprocess import prepare_inputs  # noqa: E402

SIZES = {"640x480": (480, 640), "1920x1080": (1080, 1920)}
TARGET = (224, 224)
MEAN = (104.0, 117.0, 123.0)
NORM = (0.017, 0.017, 0.017)


def picture(h: int, w: int) -> np.ndarray:
    """Smooth gradients and a little noise: compresses like a photo, not like noise."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (h + w)], 2)
    return np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)


def encoded(pixels: np.ndarray, fmt: str) -> np.ndarray:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return np.frombuffer(buf.getvalue(), np.uint8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import ncnn

    pre = Preprocess("data", PixelFormat.BGR, TARGET, mean=MEAN, norm=NORM)
    rows = []
    for name, (h, w) in SIZES.items():
        pixels = picture(h, w)
        sources = {"array": pixels, "png": encoded(pixels, "PNG"), "jpeg": encoded(pixels, "JPEG")}
        row: dict[str, object] = {"source": name}
        for kind, value in sources.items():
            row[f"{kind}_ms"] = round(median_ms(
                lambda v=value: prepare_inputs(pre, {"data": v}, "bench"), args.repeat), 3)

        def reference() -> None:
            mat = ncnn.Mat.from_pixels_resize(pixels, ncnn.Mat.PixelType.PIXEL_RGB2BGR, w, h,
                                              TARGET[1], TARGET[0])
            mat.substract_mean_normalize(list(MEAN), list(NORM))

        row["ncnn_array_ms"] = round(median_ms(reference, args.repeat), 3)
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
