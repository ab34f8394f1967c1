"""Verification of either engine against the ``ncnn`` Python package (CPU, fp32) on the same
input and weights: running ncnn, the tolerances and the comparisons (`vkserve verify`).

Tolerances, per output: cosine similarity >= the minimum and deviation (max abs error / the
reference's max abs) <= a bar, by the engine's storage precision (`TOLERANCE`). `vkserve verify`
judges the bar against ncnn's own reduced precision (`judge`): ncnn also runs its bf16 (CPU
engine) or fp16 (Vulkan engine: its Vulkan path, else its CPU fp16 storage) path on the same
input and weights (`REDUCED_REFERENCE`, in a child process), and ours is ok within
max(bar, 1.5x ncnn's deviation from its own fp32): a fixed bar cannot know how much a model
amplifies rounding (ncnn's bf16 path was measured 2.3 % off its fp32 on resnet50 on an AVX2
CPU; 1.1 % on an AVX512-BF16 one). A reduced run that is itself broken (not finite or its
cosine below the minimum: ncnn's bf16 grouped convolution gives garbage on an AVX512-BF16 CPU,
so alexnet's bf16 run is 60-80 % off) relaxes nothing. Single-layer checks keep fixed bars.

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

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vkserve.devices.progress import Progress
from vkserve.models.graph import Graph
from vkserve.models.weights import write_bin

#: storage precision -> (cosine minimum, max abs error / reference max abs)
TOLERANCE = {"bf16": (0.999, 0.02), "fp32": (0.9999, 0.005), "fp16": (0.999, 0.02)}
DET_IOU_MIN = 0.9
DET_SCORE_TOL = 0.02
DET_MATCH_MIN = 0.9
DETECTION_TYPES = ("Yolov3DetectionOutput", "DetectionOutput", "YoloDetectionOutput")
#: ours may deviate this many times as much as ncnn's own reduced-precision path
REFERENCE_FACTOR = 1.5
#: a child running ncnn's reduced path (`run_ncnn_isolated`) gives up after this many seconds
ISOLATED_TIMEOUT_S = 900


class NcnnError(RuntimeError):
    """The ncnn package could not give a result (load, extract, or its child process died)."""


@dataclass(frozen=True)
class NcnnConfig:
    """One way of running the ncnn package; `packed` False is its plain fp32 layout, the
    reference (no packing, so the fp32 results do not depend on the CPU's vector width)."""

    label: str
    vulkan: bool = False
    bf16: bool = False
    fp16: bool = False
    packed: bool = True


FP32 = NcnnConfig("ncnn cpu fp32", packed=False)
CPU_BF16 = NcnnConfig("ncnn cpu bf16", bf16=True)
VULKAN_FP16 = NcnnConfig("ncnn vulkan fp16", vulkan=True, fp16=True)
CPU_FP16 = NcnnConfig("ncnn cpu fp16", fp16=True)
#: engine precision -> ncnn's own path at that precision, then fallbacks (first that runs)
REDUCED_REFERENCE: dict[str, tuple[NcnnConfig, ...]] = {
    "bf16": (CPU_BF16,), "fp16": (VULKAN_FP16, CPU_FP16), "fp32": ()}


@dataclass
class OutputReport:
    """``deviation``: max_abs_err / ref_max_abs; ``ref_deviation`` / ``ref_cosine``: those of
    ncnn's reduced-precision path against its fp32; ``bar``: the deviation bar used."""

    name: str
    shape: list[int]
    max_abs_err: float | None
    ref_max_abs: float | None
    cosine: float | None
    ok: bool
    deviation: float | None = None
    ref_deviation: float | None = None
    ref_cosine: float | None = None
    bar: float | None = None
    detections: dict[str, int] | None = None


@dataclass
class VerifyReport:
    """``reference``: what ours is compared with; ``reduced_reference``: the ncnn path whose
    deviation from the reference sets the bars (None: fixed bars), with why a fallback ran."""

    model: str
    device: str
    precision: str
    ok: bool
    outputs: list[OutputReport] = field(default_factory=list)
    reference: str = FP32.label
    reduced_reference: str | None = None

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
    keep_blobs: bool = False,
    shape_hints: bool = True,
) -> Any:
    """An ``ncnn.Net`` loaded from files: fp32 by default, fp16 (packed+storage+arithmetic)
    or bf16 storage on request, on the CPU unless `vulkan_device` is given. `reference`
    turns off packing; it or `keep_blobs` turns off lightmode, so that one run can give
    several (intermediate) blobs. `shape_hints` False drops the param's shape hints
    (`without_shape_hints`) for ncnn's Vulkan path."""
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
    if reference or keep_blobs:
        opt.lightmode = False
    opt.num_threads = threads
    net.opt = opt
    if vulkan_device is not None:
        net.set_vulkan_device(vulkan_device)
    if vulkan_device is not None and not shape_hints:
        loaded = net.load_param_mem(without_shape_hints(Path(param_path).read_text()))
    else:
        loaded = net.load_param(os.fspath(param_path))
    if loaded != 0 or net.load_model(os.fspath(bin_path)) != 0:
        raise NcnnError(f"ncnn could not load {param_path} / {bin_path}")
    return net


def without_shape_hints(param_text: str) -> str:
    """A .param without its shape hints (``-23330=...``). ncnn's Vulkan path specializes its
    shaders on them and computes garbage for any other input shape (mobilenet.param hints
    224x224; run at 64x64 on lavapipe its first convolution gives NaN, fp32 and fp16); without
    them it specializes on nothing and is right for every shape."""
    return "\n".join(" ".join(t for t in line.split() if not t.startswith("-23330="))
                     for line in param_text.splitlines()) + "\n"


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
    config: NcnnConfig = FP32,
    vulkan_device: int = 0,
) -> dict[str, np.ndarray]:
    """Run ncnn as `config` says (default: on the CPU in plain fp32, no packing). `inputs` may
    also name intermediate blobs: ncnn then takes them as given."""
    net = ncnn_net(param_path, bin_path, vulkan_device=vulkan_device if config.vulkan else None,
                   fp16=config.fp16, bf16=config.bf16, reference=not config.packed,
                   keep_blobs=True, shape_hints=False)
    mats = ncnn_mats(inputs)
    result = {name: np.array(out, dtype=np.float32)
              for name, out in ncnn_extract(net, mats, outputs).items()}
    # ncnn's allocators must outlive every Mat they handed out
    mats.clear()
    net.clear()
    return result


def run_ncnn_isolated(
    param_path: str | os.PathLike[str],
    bin_path: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    config: NcnnConfig = FP32,
    vulkan_device: int = 0,
) -> dict[str, np.ndarray]:
    """`run_ncnn` in a child process (this module as ``__main__``): a crash of ncnn's reduced
    paths (bf16 DeconvolutionDepthWise with group 2 of 6 channels segfaults on an AVX512-BF16
    CPU) or of a Vulkan driver cannot take the caller down, and ncnn's Vulkan instance stays
    out of the caller's. Raises NcnnError saying how the child failed."""
    with tempfile.TemporaryDirectory(prefix="vkserve-ncnn-") as tmp:
        job = {"param": os.fspath(param_path), "bin": os.fspath(bin_path),
               "inputs": list(inputs), "outputs": list(outputs), "config": asdict(config),
               "vulkan_device": vulkan_device}
        Path(tmp, "job.json").write_text(json.dumps(job))
        np.savez(Path(tmp, "inputs.npz"), *inputs.values())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            proc = subprocess.run([sys.executable, "-m", __name__, tmp], env=env,
                                  capture_output=True, timeout=ISOLATED_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise NcnnError(f"{config.label} ran past {ISOLATED_TIMEOUT_S} s") from None
        error = Path(tmp, "error.txt")
        if proc.returncode != 0:
            why = (error.read_text() if error.exists() else
                   f"crashed ({signal.Signals(-proc.returncode).name})" if proc.returncode < 0
                   else f"exited {proc.returncode}")
            raise NcnnError(f"{config.label}: {why}")
        with np.load(Path(tmp, "outputs.npz")) as saved:
            return {name: saved[f"arr_{i}"] for i, name in enumerate(outputs)}


def _isolated_child(tmp: str) -> int:
    """The child of `run_ncnn_isolated`: exit 0 with outputs.npz, or 1 with error.txt."""
    job = json.loads(Path(tmp, "job.json").read_text())
    config = NcnnConfig(**job["config"])
    try:
        import ncnn

        if config.vulkan and ncnn.get_gpu_count() <= job["vulkan_device"]:
            raise NcnnError(f"ncnn sees no Vulkan device {job['vulkan_device']}")
        with np.load(Path(tmp, "inputs.npz")) as saved:
            inputs = {name: saved[f"arr_{i}"] for i, name in enumerate(job["inputs"])}
        out = run_ncnn(job["param"], job["bin"], inputs, job["outputs"], config,
                       job["vulkan_device"])
    except NcnnError as e:
        Path(tmp, "error.txt").write_text(str(e))
        return 1
    np.savez(Path(tmp, "outputs.npz"), *(out[n] for n in job["outputs"]))
    return 0


def run_reduced_reference(
    precision: str,
    param_path: str | os.PathLike[str],
    bin_path: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    vulkan_device: int = 0,
) -> tuple[str, dict[str, np.ndarray]] | None:
    """ncnn's own path at an engine's `precision` (`REDUCED_REFERENCE`), first that runs:
    its label (saying why earlier ones did not run) and outputs; None when there is no such
    path (fp32) or none ran. Each runs isolated (`run_ncnn_isolated`); ncnn's Vulkan device
    `vulkan_device` is assumed to be ours of that index (both enumerate in order)."""
    failures: list[str] = []
    for config in REDUCED_REFERENCE[precision]:
        try:
            result = run_ncnn_isolated(param_path, bin_path, inputs, outputs, config,
                                       vulkan_device)
        except NcnnError as e:
            failures.append(str(e))
            continue
        return (f"{config.label} ({'; '.join(failures)})" if failures else config.label), result
    return None


def judge(deviation: float, ref_deviation: float | None, bar: float) -> tuple[float, bool]:
    """The deviation bar an output is held to and whether ``deviation`` is within it: the
    fixed ``bar``, or `REFERENCE_FACTOR` x ncnn's own reduced-precision deviation when larger
    (None: no usable reduced run)."""
    used = bar if ref_deviation is None else max(bar, REFERENCE_FACTOR * ref_deviation)
    return used, deviation <= used


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
        raise NcnnError(f"ncnn extract failed for: {', '.join(failed)}")
    return result


def _metrics(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float, float, bool] | None:
    """max abs error, reference max abs, cosine similarity and all-finite of two tensors of
    one size (None for different sizes)."""
    if ours.size != ref.size:
        return None
    a = ours.astype(np.float64).ravel()
    b = ref.astype(np.float64).ravel()
    err = float(np.abs(a - b).max(initial=0.0))
    ref_max = float(np.abs(b).max(initial=0.0))
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cosine = float(a @ b / (na * nb)) if na > 0 and nb > 0 else float(na == nb)
    return err, ref_max, cosine, bool(np.isfinite(a).all())


def _deviation(err: float, ref_max: float) -> float:
    return err / ref_max if ref_max > 0 else (0.0 if err == 0 else float("inf"))


def compare(name: str, ours: np.ndarray, ref: np.ndarray, precision: str = "bf16",
            reduced: np.ndarray | None = None) -> OutputReport:
    """max abs error, reference max abs, cosine similarity and deviation of two tensors of one
    shape, judged by the tolerance of ``precision``, its deviation bar relaxed by `judge` when
    ``reduced`` (ncnn's own run at that precision) is given and itself keeps the cosine."""
    shape = list(ref.shape)
    cosine_min, bar = TOLERANCE[precision]
    mine = _metrics(ours, ref)
    if mine is None:
        return OutputReport(name, shape, None, float(np.abs(ref).max(initial=0.0)), None, False,
                            bar=bar)
    err, ref_max, cosine, finite = mine
    theirs = None if reduced is None else _metrics(reduced, ref)
    ref_deviation = ref_cosine = None
    if theirs is not None and theirs[3]:  # a finite reduced run of the same size
        ref_deviation, ref_cosine = _deviation(theirs[0], theirs[1]), theirs[2]
    usable = ref_deviation if ref_cosine is not None and ref_cosine >= cosine_min else None
    deviation = _deviation(err, ref_max)
    used, within = judge(deviation, usable, bar)
    return OutputReport(name, shape, err, ref_max, cosine, finite and cosine >= cosine_min and within,
                        deviation, ref_deviation, ref_cosine, used)


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
    report = compare(name, ours, ref)
    report.ok = matched >= DET_MATCH_MIN * max(len(ours), len(ref))
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
    *,
    reduced: bool,
    vulkan_device: int = 0,
    progress: Progress | None = None,
) -> VerifyReport:
    """Compare ``run(names) -> (outputs, device, precision)``, an engine's run of ``graph`` on
    ``inputs`` (the names of `tensors_to_compare`), with ncnn's fp32 under
    ``TOLERANCE[tolerance]``; ``reduced``: judged against ncnn's own run at that precision
    (`run_reduced_reference`), as `vkserve verify` does. That costs child processes (too slow
    for the thousands of single-layer checks, which go without), so the fp32 reference runs
    in one too: an ncnn crash (deeplabv3_mbv3, see tests/devices/test_pnnx_models.py) becomes
    an NcnnError. ``bin_path`` None writes the graph's own weights to a temporary .bin so both
    sides see identical numbers. ``progress`` hears of each stage."""

    def stage(text: str) -> None:
        if progress is not None:
            progress.stage(text)

    names, det_outputs = tensors_to_compare(graph)
    ours, device, precision = run(names)
    with tempfile.TemporaryDirectory(prefix="vkserve-verify-") as tmp:
        if bin_path is None:
            bin_path = os.path.join(tmp, "model.bin")
            write_bin(graph.layers, bin_path)
        stage("running the ncnn fp32 reference")
        ref = (run_ncnn_isolated if reduced else run_ncnn)(param_path, bin_path, inputs, names)
        if reduced and REDUCED_REFERENCE.get(tolerance):
            stage(f"running ncnn's own {tolerance} path for the bars")
        found = run_reduced_reference(tolerance, param_path, bin_path, inputs, names,
                                      vulkan_device) if reduced else None
    label, reduced_out = found if found is not None else (None, {})
    reports = [compare_detections(n, ours[n], ref[n]) if n in det_outputs
               else compare(n, ours[n], ref[n], tolerance, reduced_out.get(n)) for n in names]
    return VerifyReport(model=os.path.basename(os.fspath(param_path)), device=device,
                        precision=precision, ok=all(r.ok for r in reports), outputs=reports,
                        reduced_reference=label)


if __name__ == "__main__":
    sys.exit(_isolated_child(sys.argv[1]))
