"""Verification of either engine against the ``ncnn`` Python package (CPU, fp32) on the same
input and weights: running ncnn, the tolerances and the comparisons (`vkserve verify`).

Tolerances, per output: cosine similarity >= the minimum and max abs error <= a fraction of
the reference's max abs, by the engine's storage precision (`TOLERANCE`):

- bf16 (CPU engine, issue 4): 0.999 and 2 %. bf16 keeps 8 mantissa bits (RNE error <= 2^-9
  relative per store); every blob and weight matrix is stored in bf16 (biases stay fp32, as
  in ncnn's bf16 path), so the error grows with depth. Measured with seeded random weights
  (seed 0): most models stay under 1.3 %; the worst is nanodet_m's box-regression head at
  1.76 %. With fp32 storage the same kernels match ncnn to ~1e-6, so a semantics bug shows
  up far above the bar.
- fp32 (Vulkan engine, issue 5): 0.9999 and 0.5 %; fp16 (Vulkan): 0.999 and 2 %.

Detection outputs (Yolov3DetectionOutput) have a data-dependent row count and scores near
the confidence threshold may flip under bf16, so they are compared by box matching: a
reference detection matches one of ours with the same label, IoU >= 0.9 and a score within
0.02; the output is ok when at least 90 % of the larger detection list is matched
(with random weights hundreds of overlapping boxes sit near the NMS threshold, so a few flips
cascade; on ncnn's own fp32 feeding tensors the kernel matches ncnn row for row). The
tensors feeding the detection layer are compared with the ordinary metrics as extra outputs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from vkserve.models.graph import Graph
from vkserve.models.weights import write_bin

#: storage precision -> (cosine minimum, max abs error / reference max abs)
TOLERANCE = {"bf16": (0.999, 0.02), "fp32": (0.9999, 0.005), "fp16": (0.999, 0.02)}
DET_IOU_MIN = 0.9
DET_SCORE_TOL = 0.02
DET_MATCH_MIN = 0.9
DETECTION_TYPES = ("Yolov3DetectionOutput",)


@dataclass
class OutputReport:
    name: str
    shape: list[int]
    max_abs_err: float | None
    ref_max_abs: float | None
    cosine: float | None
    ok: bool
    detections: dict[str, int] | None = None


@dataclass
class VerifyReport:
    model: str
    device: str
    precision: str
    ok: bool
    outputs: list[OutputReport] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for o in d["outputs"]:
            if o["detections"] is None:
                del o["detections"]
        return d


def ncnn_net(
    param_path: str | os.PathLike[str],
    bin_path: str | os.PathLike[str],
    *,
    vulkan_device: int | None = None,
    fp16: bool = False,
    bf16: bool = False,
    threads: int = 1,
    reference: bool = False,
) -> Any:
    """An ``ncnn.Net`` loaded from files: fp32 by default, fp16 (packed+storage+arithmetic)
    or bf16 storage on request, on the CPU unless `vulkan_device` is given. `reference`
    turns off packing and lightmode so intermediate blobs stay readable."""
    import ncnn  # test/verify/benchmark dependency only

    net = ncnn.Net()
    opt = net.opt
    opt.use_vulkan_compute = vulkan_device is not None
    opt.use_bf16_storage = bf16
    opt.use_bf16_packed = bf16
    opt.use_fp16_storage = fp16
    opt.use_fp16_packed = fp16
    opt.use_fp16_arithmetic = fp16
    opt.use_int8_inference = False
    if reference:
        opt.use_packing_layout = False
        opt.lightmode = False
    opt.num_threads = threads
    net.opt = opt
    if vulkan_device is not None:
        net.set_vulkan_device(vulkan_device)
    if net.load_param(os.fspath(param_path)) != 0 or net.load_model(os.fspath(bin_path)) != 0:
        raise RuntimeError(f"ncnn could not load {param_path} / {bin_path}")
    return net


def ncnn_mats(inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """ncnn Mats of float32 inputs. clone(): a Mat wrapping numpy memory has an unaligned
    channel step (w*h), which some ncnn layers (Crop, Slice, Interp ...) mis-read; a clone
    gets ncnn's own aligned layout."""
    import ncnn

    return {k: ncnn.Mat(np.ascontiguousarray(v, dtype=np.float32)).clone()
            for k, v in inputs.items()}


def run_ncnn(
    param_path: str | os.PathLike[str],
    bin_path: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
) -> dict[str, np.ndarray]:
    """Run ncnn on the CPU in plain fp32 (no bf16/fp16 storage, no packing)."""
    net = ncnn_net(param_path, bin_path, reference=True)
    mats = ncnn_mats(inputs)
    result = {name: np.array(out, dtype=np.float32)
              for name, out in ncnn_extract(net, mats, outputs).items()}
    # ncnn's allocators must outlive every Mat they handed out
    mats.clear()
    net.clear()
    return result


def ncnn_extract(net: Any, mats: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
    """One ncnn inference: feed `mats`, extract `outputs` (ncnn Mats); raise naming failures."""
    ex = net.create_extractor()
    for name, mat in mats.items():
        ex.input(name, mat)
    result: dict[str, Any] = {}
    failed: list[str] = []
    for name in outputs:
        ret, out = ex.extract(name)
        if ret != 0:
            failed.append(f"{name} ({ret})")
        else:
            result[name] = out
    if failed:
        raise RuntimeError(f"ncnn extract failed for: {', '.join(failed)}")
    return result


def compare(name: str, ours: np.ndarray, ref: np.ndarray, precision: str = "bf16") -> OutputReport:
    """max abs error, reference max abs and cosine similarity of two tensors of one shape,
    judged by the tolerance of ``precision``."""
    shape = list(ref.shape)
    if ours.size != ref.size:
        return OutputReport(name, shape, None, float(np.abs(ref).max(initial=0.0)), None, False)
    a = ours.astype(np.float64).ravel()
    b = ref.astype(np.float64).ravel()
    err = float(np.abs(a - b).max(initial=0.0))
    ref_max = float(np.abs(b).max(initial=0.0))
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cosine = float(a @ b / (na * nb)) if na > 0 and nb > 0 else float(na == nb)
    cosine_min, rel_max = TOLERANCE[precision]
    ok = bool(np.isfinite(a).all()) and cosine >= cosine_min and err <= rel_max * ref_max
    return OutputReport(name, shape, err, ref_max, cosine, ok)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of (n, 4) and (m, 4) boxes given as xmin, ymin, xmax, ymax."""
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nan_to_num(inter / (area_a[:, None] + area_b[None, :] - inter))


def match_detections(ours: np.ndarray, ref: np.ndarray) -> int:
    """How many reference rows (label, score, box) have a distinct match among ours."""
    ours = ours.reshape(-1, 6)
    ref = ref.reshape(-1, 6)
    if len(ours) == 0 or len(ref) == 0:
        return 0
    iou = box_iou(ref[:, 2:6], ours[:, 2:6])
    ok = (
        (ref[:, None, 0] == ours[None, :, 0])
        & (np.abs(ref[:, None, 1] - ours[None, :, 1]) <= DET_SCORE_TOL)
        & (iou >= DET_IOU_MIN)
    )
    taken = np.zeros(len(ours), dtype=bool)
    matched = 0
    for i in np.argsort(-ref[:, 1], kind="stable"):
        candidates = np.flatnonzero(ok[i] & ~taken)
        if candidates.size:
            taken[candidates[np.argmax(iou[i, candidates])]] = True
            matched += 1
    return matched


def compare_detections(name: str, ours: np.ndarray, ref: np.ndarray) -> OutputReport:
    ours, ref = ours.reshape(-1, 6), ref.reshape(-1, 6)
    matched = match_detections(ours, ref)
    ok = matched >= DET_MATCH_MIN * max(len(ours), len(ref))
    report = compare(name, ours, ref) if ours.shape == ref.shape else OutputReport(
        name, list(ref.shape), None, float(np.abs(ref).max(initial=0.0)), None, False
    )
    report.ok = ok
    report.detections = {"matched": matched, "reference": len(ref), "ours": len(ours)}
    return report


def random_inputs(shapes: Mapping[str, Sequence[int]], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs, uniform in [-1, 1)."""
    rng = np.random.default_rng(seed)
    return {n: rng.uniform(-1.0, 1.0, size=tuple(s)).astype(np.float32) for n, s in shapes.items()}


def tensors_to_compare(graph: Graph) -> tuple[list[str], set[str]]:
    """The graph's outputs plus the tensors feeding a final detection or Softmax layer, and
    which outputs are detections (compared by box matching).

    The feeding tensors matter: detections are data-dependent, and a Softmax over random
    weights is nearly uniform, which would hide errors in the logits behind it.
    """
    finals = [lay for lay in graph.layers
              if lay.type in DETECTION_TYPES
              or (lay.type == "Softmax" and set(lay.outputs) & set(graph.output_names))]
    feeding = [b for lay in finals for b in lay.inputs if b not in graph.output_names]
    det_outputs = {b for lay in finals if lay.type in DETECTION_TYPES for b in lay.outputs}
    return list(graph.output_names) + list(dict.fromkeys(feeding)), det_outputs


def verify_outputs(
    graph: Graph,
    param_path: str | os.PathLike[str],
    bin_path: str | os.PathLike[str] | None,
    inputs: Mapping[str, np.ndarray],
    tolerance: str,
    run: Callable[[list[str]], tuple[dict[str, np.ndarray], str, str]],
) -> VerifyReport:
    """Compare ``run(names) -> (outputs, device, precision)``, an engine's run of ``graph`` on
    ``inputs`` (the names of `tensors_to_compare`), with ncnn's under ``TOLERANCE[tolerance]``;
    ``bin_path`` None writes the graph's own weights to a temporary .bin so both sides see
    identical numbers."""
    names, det_outputs = tensors_to_compare(graph)
    ours, device, precision = run(names)
    with tempfile.TemporaryDirectory(prefix="vkserve-verify-") as tmp:
        if bin_path is None:
            bin_path = os.path.join(tmp, "model.bin")
            write_bin(graph.layers, bin_path)
        ref = run_ncnn(param_path, bin_path, inputs, names)
    reports = [compare_detections(n, ours[n], ref[n]) if n in det_outputs
               else compare(n, ours[n], ref[n], tolerance) for n in names]
    return VerifyReport(model=os.path.basename(os.fspath(param_path)), device=device,
                        precision=precision, ok=all(r.ok for r in reports), outputs=reports)
