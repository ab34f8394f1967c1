"""Train the `shapes` example: a small CNN that names the shape in a 32x32 colour picture.

Needs torch, pnnx and Pillow, in a venv of its own (never vkserve's .venv, never CI):

    python3 -m venv /tmp/trainenv && /tmp/trainenv/bin/pip install torch==2.13.0 pnnx pillow numpy
    /tmp/trainenv/bin/python tools/train_shapes.py [--epochs 8] [--seed 0] [--out DIR]

The data set is generated with Pillow by ``shapes_data.py`` (nothing is downloaded); the
training and test sets come from different seeds. The network (ncnn blob shapes are c,h,w):

    in0 (3,32,32) -> [Convolution 3x3 pad 1 -> ReLU -> Pooling max 2x2/2] x3 (16, 32, 32 maps)
      -> (32,4,4) -> InnerProduct 64 -> ReLU -> InnerProduct 5 -> Softmax -> out0 (5,)

Input pixels are RGB 0..255 mapped to (pixel - 127.5) / 127.5, which the model folder's
``[preprocess]`` states (mean 127.5, norm 1/127.5). pnnx exports the trained network to
``model.param`` / ``model.bin`` (fp32 weights) in ``--out`` (default: vkserve/examples/shapes/)
with ``labels.txt``, ``samples/<label>.png`` (the first test picture of each class that the
model gets right) and ``training.json`` (accuracy, seeds, sizes).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pnnx
import torch
from PIL import Image
from shapes_data import CLASSES, MEAN, NORM, SIZE, make_set
from torch import nn

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "vkserve" / "examples" / "shapes"


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 NHWC RGB -> float NCHW with the model's (pixel - MEAN) * NORM."""
    return torch.from_numpy((images.astype(np.float32) - MEAN) * NORM).permute(0, 3, 1, 2).contiguous()


class ShapesNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for maps in (16, 32, 32):
            layers += [nn.Conv2d(channels, maps, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            channels = maps
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(channels * 4 * 4, 64), nn.ReLU(),
                                        nn.Linear(64, len(CLASSES)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits; ``Exported`` adds the softmax."""
        return self.classifier(self.features(x))


class Exported(nn.Module):
    def __init__(self, net: ShapesNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(x), dim=1)


def train(net: ShapesNet, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * math.ceil(len(x) / 64))
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(x), generator=gen)
        total = 0.0
        for start in range(0, len(x), 64):
            idx = order[start:start + 64]
            opt.zero_grad()
            loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch + 1}/{epochs}: loss {total / len(x):.4f}", flush=True)


def export(model: Exported, out: Path) -> None:
    """pnnx writes its files next to the TorchScript file; keep model.param/.bin only."""
    with tempfile.TemporaryDirectory() as tmp:
        pt = Path(tmp) / "shapes.pt"
        pnnx.export(model, str(pt), (torch.zeros(1, 3, SIZE, SIZE),), fp16=False)
        shutil.copyfile(Path(tmp) / "shapes.ncnn.param", out / "model.param")
        shutil.copyfile(Path(tmp) / "shapes.ncnn.bin", out / "model.bin")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0, help="weights and batch order")
    ap.add_argument("--train-size", type=int, default=12000)
    ap.add_argument("--test-size", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_seed, test_seed = 1000 + args.seed, 2000 + args.seed
    train_images, train_labels = make_set(args.train_size, train_seed)
    test_images, test_labels = make_set(args.test_size, test_seed)
    net = ShapesNet()
    train(net, to_tensor(train_images), torch.from_numpy(train_labels), args.epochs, args.seed)
    model = Exported(net).eval()
    with torch.no_grad():
        prob = model(to_tensor(test_images)).numpy()
    predicted = prob.argmax(1)
    accuracy = float((predicted == test_labels).mean())
    print(f"test accuracy {accuracy:.4f} ({int((predicted == test_labels).sum())} of {len(test_labels)})")

    args.out.mkdir(parents=True, exist_ok=True)
    export(model, args.out)
    (args.out / "labels.txt").write_text("".join(f"{c}\n" for c in CLASSES), encoding="utf-8")
    samples = args.out / "samples"
    samples.mkdir(exist_ok=True)
    for k, name in enumerate(CLASSES):
        i = int(np.flatnonzero((test_labels == k) & (predicted == k))[0])
        Image.fromarray(test_images[i]).save(samples / f"{name}.png")
    confusion = np.zeros((len(CLASSES), len(CLASSES)), int)
    np.add.at(confusion, (test_labels, predicted), 1)
    report = {"test_accuracy": round(accuracy, 4), "test_size": args.test_size,
              "train_size": args.train_size, "epochs": args.epochs, "seed": args.seed,
              "train_seed": train_seed, "test_seed": test_seed, "classes": list(CLASSES),
              "confusion": confusion.tolist(), "torch": torch.__version__, "pnnx": pnnx.__version__}
    lines = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in report.items())
    (args.out / "training.json").write_text("{\n" + lines + "\n}\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
