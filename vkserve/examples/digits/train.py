"""Train the `digits` example: a tiny CNN on scikit-learn's bundled 8x8 digits, in numpy.

    .venv/bin/pip install scikit-learn      # for training only; not a vkserve dependency
    .venv/bin/python vkserve/examples/digits/train.py [--epochs 40] [--seed 0] [--no-verify]

Writes, next to this file: ``model.param`` / ``model.bin`` (ncnn format, fp32 weights),
``samples/<k>.npy`` (one test-set digit of class k, shape (1, 8, 8), float32 raw pixel values
0..16) and ``samples/expected.json`` (the exported model's class and probabilities for each
sample), and prints the test accuracy. Then the exported files are run on the whole test set
with the ``ncnn`` package and with vkserve's CPU engine; both must give the numpy model's
predictions (exit status 1 otherwise).

The network (ncnn blob shapes are c,h,w):

    data (1,8,8) -> Convolution 3x3 pad 1, 8 maps -> ReLU -> Pooling max 2x2/2 -> (8,4,4)
    -> InnerProduct 32 -> ReLU -> InnerProduct 10 -> Softmax -> prob (10,)

The input is the dataset's raw pixels (0..16); the 1/16 scaling used in training is folded
into the first convolution's weights on export.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CONV_MAPS = 8
HIDDEN = 32
CLASSES = 10
SCALE = 16.0  # pixel values are 0..16


@dataclass
class Params:
    conv_w: np.ndarray  # (CONV_MAPS, 1, 3, 3)
    conv_b: np.ndarray  # (CONV_MAPS,)
    fc1_w: np.ndarray  # (HIDDEN, CONV_MAPS*4*4), input flattened in c,h,w order
    fc1_b: np.ndarray
    fc2_w: np.ndarray  # (CLASSES, HIDDEN)
    fc2_b: np.ndarray

    def arrays(self) -> list[np.ndarray]:
        return [self.conv_w, self.conv_b, self.fc1_w, self.fc1_b, self.fc2_w, self.fc2_b]


def init_params(rng: np.random.Generator) -> Params:
    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    flat = CONV_MAPS * 4 * 4
    return Params(
        he((CONV_MAPS, 1, 3, 3), 9), np.zeros(CONV_MAPS, np.float32),
        he((HIDDEN, flat), flat), np.zeros(HIDDEN, np.float32),
        he((CLASSES, HIDDEN), HIDDEN), np.zeros(CLASSES, np.float32),
    )


def im2col(x: np.ndarray) -> np.ndarray:
    """(N, 1, 8, 8) -> (N, 9, 64): the 3x3 neighbourhood (zero padded) of every pixel."""
    xp = np.pad(x[:, 0], ((0, 0), (1, 1), (1, 1)))
    cols = [xp[:, dy : dy + 8, dx : dx + 8].reshape(len(x), 64) for dy in range(3) for dx in range(3)]
    return np.stack(cols, axis=1)


def forward(p: Params, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Probabilities (N, 10) for x (N, 1, 8, 8) scaled to 0..1, plus what backward needs."""
    n = len(x)
    cols = im2col(x)
    conv = np.einsum("ok,nkp->nop", p.conv_w.reshape(CONV_MAPS, 9), cols) + p.conv_b[None, :, None]
    relu1 = np.maximum(conv, 0).reshape(n, CONV_MAPS, 8, 8)
    win = relu1.reshape(n, CONV_MAPS, 4, 2, 4, 2)
    pool = win.max(axis=(3, 5))
    flat = pool.reshape(n, -1)
    fc1 = flat @ p.fc1_w.T + p.fc1_b
    relu2 = np.maximum(fc1, 0)
    logits = relu2 @ p.fc2_w.T + p.fc2_b
    z = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    cache = dict(cols=cols, relu1=relu1, win=win, pool=pool, flat=flat, fc1=fc1, relu2=relu2)
    return prob, cache


def backward(p: Params, prob: np.ndarray, y: np.ndarray, c: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Gradients of the mean cross-entropy, in Params.arrays() order."""
    n = len(y)
    d_logits = prob.copy()
    d_logits[np.arange(n), y] -= 1.0
    d_logits /= n
    g_fc2_w = d_logits.T @ c["relu2"]
    g_fc2_b = d_logits.sum(axis=0)
    d_fc1 = (d_logits @ p.fc2_w) * (c["fc1"] > 0)
    g_fc1_w = d_fc1.T @ c["flat"]
    g_fc1_b = d_fc1.sum(axis=0)
    d_pool = (d_fc1 @ p.fc1_w).reshape(c["pool"].shape)
    mask = c["win"] == c["pool"][:, :, :, None, :, None]
    d_win = mask * d_pool[:, :, :, None, :, None]
    d_relu1 = d_win.reshape(c["relu1"].shape)
    d_conv = (d_relu1 * (c["relu1"] > 0)).reshape(n, CONV_MAPS, 64)
    g_conv_w = np.einsum("nop,nkp->ok", d_conv, c["cols"]).reshape(p.conv_w.shape)
    g_conv_b = d_conv.sum(axis=(0, 2))
    return [g_conv_w, g_conv_b, g_fc1_w, g_fc1_b, g_fc2_w, g_fc2_b]


def train(x: np.ndarray, y: np.ndarray, epochs: int, seed: int) -> Params:
    """Adam, batch 32, learning rate 3e-3 with cosine decay, small L2."""
    rng = np.random.default_rng(seed)
    p = init_params(rng)
    params = p.arrays()
    m = [np.zeros_like(a) for a in params]
    v = [np.zeros_like(a) for a in params]
    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 1e-4
    step = 0
    steps_total = epochs * ((len(x) + 31) // 32)
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), 32):
            idx = order[start : start + 32]
            prob, cache = forward(p, x[idx])
            grads = backward(p, prob, y[idx], cache)
            step += 1
            lr = 3e-3 * 0.5 * (1 + np.cos(np.pi * step / steps_total))
            for a, g, mi, vi in zip(params, grads, m, v):
                g = g + wd * a
                mi *= b1
                mi += (1 - b1) * g
                vi *= b2
                vi += (1 - b2) * g * g
                mhat = mi / (1 - b1**step)
                vhat = vi / (1 - b2**step)
                a -= (lr * mhat / (np.sqrt(vhat) + eps)).astype(np.float32)
        if (epoch + 1) % 10 == 0:
            prob, _ = forward(p, x)
            loss = -np.log(prob[np.arange(len(y)), y] + 1e-12).mean()
            print(f"epoch {epoch + 1:3d}  train loss {loss:.4f}  train acc {(prob.argmax(1) == y).mean():.4f}")
    return p


PARAM_TEXT = f"""7767517
8 8
Input            data   0 1 data 0=8 1=8 2=1
Convolution      conv1  1 1 data conv1 0={CONV_MAPS} 1=3 4=1 5=1 6={CONV_MAPS * 9}
ReLU             relu1  1 1 conv1 relu1
Pooling          pool1  1 1 relu1 pool1 0=0 1=2 2=2
InnerProduct     fc1    1 1 pool1 fc1 0={HIDDEN} 1=1 2={HIDDEN * CONV_MAPS * 16}
ReLU             relu2  1 1 fc1 relu2
InnerProduct     fc2    1 1 relu2 fc2 0={CLASSES} 1=1 2={CLASSES * HIDDEN}
Softmax          prob   1 1 fc2 prob
"""


def export(p: Params, out_dir: Path) -> None:
    """model.param + model.bin: per layer, the weight (4-byte fp32 tag 0, then float32 data in
    ncnn's order: conv (out, in, kh, kw), inner product (out, in)) and then the bias (untagged)."""
    conv_w = p.conv_w / SCALE  # the model takes raw 0..16 pixels
    chunks = []
    for w, b in ((conv_w, p.conv_b), (p.fc1_w, p.fc1_b), (p.fc2_w, p.fc2_b)):
        chunks.append(struct.pack("<I", 0))
        chunks.append(np.ascontiguousarray(w, dtype="<f4").tobytes())
        chunks.append(np.ascontiguousarray(b, dtype="<f4").tobytes())
    (out_dir / "model.param").write_text(PARAM_TEXT)
    (out_dir / "model.bin").write_bytes(b"".join(chunks))


def run_ncnn(out_dir: Path, images: np.ndarray) -> np.ndarray:
    """Probabilities from the exported files through the ncnn package (fp32, CPU)."""
    import ncnn  # verification only

    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    net.opt.num_threads = 1
    if net.load_param(str(out_dir / "model.param")) or net.load_model(str(out_dir / "model.bin")):
        raise RuntimeError("ncnn could not load the exported model")
    rows = []
    for img in images:
        ex = net.create_extractor()
        ex.input("data", ncnn.Mat(np.ascontiguousarray(img, dtype=np.float32)))
        ret, out = ex.extract("prob")
        if ret != 0:
            raise RuntimeError(f"ncnn extract failed ({ret})")
        rows.append(np.array(out, dtype=np.float32).reshape(-1))
        del ex
    net.clear()
    return np.stack(rows)


def run_vkserve_cpu(out_dir: Path, images: np.ndarray) -> np.ndarray:
    """Probabilities from the exported files through vkserve's bf16 CPU engine."""
    sys.path.insert(0, str(HERE.parents[2]))
    from vkserve.devices.cpu.executor import Plan
    from vkserve.models.graph import load_model

    plan = Plan(load_model(out_dir / "model.param", out_dir / "model.bin"))
    return np.stack([plan.run({"data": img})["prob"].reshape(-1) for img in images])


def save_png(path: Path, img: np.ndarray) -> None:
    """The sample as the 8-bit grey image ``config.toml``'s [preprocess] reads back (pixel =
    value * 255 / 16; norm = 16 / 255 undoes it to within half a level)."""
    from PIL import Image  # Pillow: a test extra, and `vkserve[images]`

    Image.fromarray(np.round(img[0] * (255 / 16)).astype(np.uint8)).save(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--no-verify", action="store_true", help="skip the ncnn check")
    args = ap.parse_args(argv)

    from sklearn.datasets import load_digits  # training only

    digits = load_digits()
    images = digits.images.astype(np.float32)[:, None]  # (N, 1, 8, 8), 0..16
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(1234).permutation(len(labels))
    n_test = len(labels) // 5
    test, tr = order[:n_test], order[n_test:]

    p = train(images[tr] / SCALE, labels[tr], args.epochs, args.seed)
    prob_test, _ = forward(p, images[test] / SCALE)
    pred_test = prob_test.argmax(1)
    acc = float((pred_test == labels[test]).mean())
    print(f"test accuracy {acc:.4f} ({int((pred_test == labels[test]).sum())}/{len(test)})")

    args.out.mkdir(parents=True, exist_ok=True)
    export(p, args.out)
    samples = args.out / "samples"
    samples.mkdir(exist_ok=True)
    expected = {}
    for k in range(CLASSES):
        # the first test-set digit of class k that the model classifies correctly
        i = next(j for j, t in enumerate(test) if labels[t] == k and pred_test[j] == k)
        img = images[test[i]]
        np.save(samples / f"{k}.npy", img)
        save_png(samples / f"{k}.png", img)
        expected[str(k)] = {
            "label": k,
            "dataset_index": int(test[i]),
            "class": int(pred_test[i]),
            "prob": [round(float(v), 6) for v in prob_test[i]],
        }
    (samples / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    summary = {"test_accuracy": round(acc, 4), "test_size": int(len(test)), "epochs": args.epochs,
               "seed": args.seed, "split_seed": 1234}
    (args.out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")

    if not args.no_verify:
        ref = run_ncnn(args.out, images[test])
        same = ref.argmax(1) == pred_test
        err = float(np.abs(ref - prob_test).max())
        print(f"ncnn: {int(same.sum())}/{len(test)} predictions equal the numpy model's, "
              f"max |prob diff| {err:.2e}")
        ours = run_vkserve_cpu(args.out, images[test])
        same_cpu = ours.argmax(1) == pred_test
        print(f"vkserve CPU engine (bf16): {int(same_cpu.sum())}/{len(test)} predictions equal, "
              f"max |prob diff| {float(np.abs(ours - prob_test).max()):.2e}")
        if not (same.all() and same_cpu.all()):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
