"""The model repository: one folder per model (DESIGN §6, issue 6 part 4).

    <repo>/<name>/model.param    ncnn graph (required; or one NAME.ncnn.param + .bin as pnnx
                                 names them, see ``vkserve.models.files``)
    <repo>/<name>/model.bin      weights (required unless config.toml says random_weights)
    <repo>/<name>/config.toml    optional:

        precision = "auto"        # auto | fp32 | fp16 | fp16s | fp16sa (Vulkan; the CPU is bf16)
        devices = "auto"          # auto | all | gpu | cpu | [0, "vulkan:1", "cpu"]
        cpu_fallback = true       # may be loaded on the CPU on demand when its devices fail
        warmup = 1                # warm-up runs per Plan instance before the model is ready
        queue_limit = 64          # queued jobs before OVERLOADED (default: the scheduler's)
        random_weights = false    # seeded random weights instead of model.bin (demos, benchmarks)
        seed = 0                  # seed for random_weights
        plan_cache_shapes = 8     # Plans kept per device for distinct input shapes (LRU)
        plan_cache_mb = 1024      # and the device memory they may hold, MiB
        max_batch_size = 8        # queued jobs of one input shape run together (1: never)
        preferred_batch_sizes = []  # batch sizes to cut to when more jobs wait (Triton's)
        max_queue_delay_ms = 0.0  # how long a short batch may wait to fill (0: never waits)
        [inputs]
        data = [3, 224, 224]      # input shape in ncnn order, built and warmed at load
        [inputs.img]              # or a table: several shapes and bounds (see scheduler.shapes)
        shapes = [[3, 320, 320], [3, 640, 640]]
        min = [3, 32, 32]         # a dimension outside min/max is BAD_REQUEST
        max = [3, 1280, 1280]
        [preprocess]              # images in; [postprocess]: classes, boxes, masks out
        [postprocess]             # (every key: vkserve.processing.config)

An input whose Input layer declares no shape (pnnx writes none) needs no entry: any shape is
accepted and built on first use (``vkserve.scheduler.shapes`` has the rules).

``devices = "auto"`` loads the model on every Vulkan device, or on the CPU when there is none
(Triton's KIND_AUTO). Scanning parses every ``model.param`` and ``config.toml`` but not the
weights. A broken folder never stops the scan: its ``ModelSpec`` carries ``error`` (a message
that names the file, line or key) and the other models load as usual. Unknown config keys are
errors, so a typo does not silently fall back to a default.

``ModelRepository.fingerprint`` is what a rescan compares to decide that a model changed: the
scanned spec and a SHA-256 of each file's *content* (model.param, model.bin, config.toml), so
a plain ``touch`` (or a copy of identical files) is no change. Digests are cached per file
under its (device, inode, size, mtime, ctime), so an untouched file is not read again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from vkserve.devices.names import CPU, DeviceNameError, parse_device
from vkserve.models.binfile import read_bin
from vkserve.models.errors import ModelFormatError
from vkserve.models.files import model_files
from vkserve.models.graph import Layer, build_graph, read_param
from vkserve.models.randinit import random_weights
from vkserve.processing.config import Postprocess, Preprocess, parse_postprocess, parse_preprocess
from vkserve.processing.errors import ProcessingError
from vkserve.scheduler.errors import BadInput
from vkserve.scheduler.shapes import InputSpec, ShapeKey, check_bounds

log = logging.getLogger(__name__)

__all__ = ["ModelRepository", "ModelSpec", "PRECISIONS", "DeviceLike"]

Shape = tuple[int, ...]
PRECISIONS = ("auto", "fp32", "fp16", "fp16s", "fp16sa")
DEVICE_MODES = ("auto", "all", "gpu", "cpu")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CONFIG_KEYS = ("inputs", "precision", "devices", "cpu_fallback", "warmup", "queue_limit",
               "random_weights", "seed", "plan_cache_shapes", "plan_cache_mb", "max_batch_size",
               "preferred_batch_sizes", "max_queue_delay_ms", "preprocess", "postprocess")
INPUT_KEYS = ("shapes", "min", "max")


class DeviceLike(Protocol):
    """What device selection needs to know of a device (DeviceHandle satisfies it)."""

    @property
    def index(self) -> int: ...

    @property
    def is_cpu(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model folder as scanned. ``error`` set means the folder is unusable; the other
    fields then hold whatever could be read (the name always)."""

    name: str
    path: Path
    param_path: Path
    bin_path: Path | None = None
    inputs: Mapping[str, InputSpec] = dataclasses.field(default_factory=dict)
    #: output name -> shape as metadata shows it (-1: varies with the input; []: unknown)
    outputs: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    #: input shapes built and warmed at load (one key per combination config.toml names)
    prebuilt: tuple[ShapeKey, ...] = ()
    precision: str = "auto"
    devices: str | tuple[int | str, ...] = "auto"
    cpu_fallback: bool = True
    warmup: int | None = None  # None: the scheduler's default
    queue_limit: int | None = None  # None: the scheduler's default
    seed: int = 0
    plan_cache_shapes: int = 8
    plan_cache_mb: int = 1024
    max_batch_size: int = 8
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ms: float = 0.0
    preprocess: Preprocess | None = None  # [preprocess]: the model takes images
    postprocess: Postprocess | None = None  # [postprocess]: replies carry meanings
    error: str | None = None

    def load_layers(self) -> list[Layer]:
        """Parse the .param and read the weights (blocking: call it in a worker thread); a
        Graph per input shape is built from these (``vkserve.scheduler.plans``)."""
        if self.error is not None:
            raise BadInput(self.error)
        layers = read_param(self.param_path)
        if self.bin_path is None:
            for layer, weights in zip(layers, random_weights(layers, self.seed)):
                layer.weights = weights
        else:
            read_bin(layers, self.bin_path)
        return layers

    def initial_devices(self, devices: Sequence[DeviceLike]) -> list[DeviceLike]:
        """Devices the model loads on at start (see the module doc for the modes)."""
        gpus = [d for d in devices if not d.is_cpu]
        cpus = [d for d in devices if d.is_cpu]
        if self.devices == "auto":
            return list(gpus or cpus)
        if self.devices == "all":
            return list(devices)
        if self.devices == "gpu":
            return gpus
        if self.devices == "cpu":
            return cpus
        return [d for d in devices if self._listed(d)]

    def allows(self, device: DeviceLike, *, fallback: bool = False) -> bool:
        """May the model run on ``device``? With ``fallback`` the CPU is allowed when
        ``cpu_fallback`` is set (on-demand loads after a device failure)."""
        if fallback and self.cpu_fallback and device.is_cpu:
            return True
        if self.devices in ("auto", "all"):
            return True
        if self.devices == "gpu":
            return not device.is_cpu
        if self.devices == "cpu":
            return device.is_cpu
        return self._listed(device)

    def _listed(self, device: DeviceLike) -> bool:
        assert isinstance(self.devices, tuple)
        return device.index in self.devices or (device.is_cpu and "cpu" in self.devices)


class ModelRepository:
    """A folder of model folders; ``scan()`` reads them all, ``spec(name)`` re-reads one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # file -> (its stat key, SHA-256 of its content): untouched files are not re-read
        self._digests: dict[Path, tuple[tuple[int, ...], str]] = {}

    def fingerprint(self, spec: ModelSpec) -> tuple[Any, ...]:
        """Blocking: the spec and the content digest of each of the folder's files (None for
        an absent one); equal fingerprints mean the same model (see the module doc)."""
        files = (spec.param_path, spec.bin_path, spec.path / "config.toml")
        return (spec, *(None if f is None else self._digest(f) for f in files))

    def _digest(self, path: Path) -> str | None:
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        cached = self._digests.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        h = hashlib.sha256()
        try:
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except OSError as exc:  # unreadable: differs from any content, so a rescan reloads
            return f"unreadable: {exc}"
        self._digests[path] = (key, h.hexdigest())
        return h.hexdigest()

    def scan(self) -> dict[str, ModelSpec]:
        """Every model folder, by name (sorted); broken ones carry ``error``."""
        if not self.path.is_dir():
            raise BadInput(f"model repository {self.path}: not a directory")
        specs: dict[str, ModelSpec] = {}
        for entry in sorted(self.path.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            spec = read_model_folder(entry)
            if spec.error:
                log.warning("model %s: %s", spec.name, spec.error)
            specs[spec.name] = spec
        return specs

    def names(self) -> list[str]:
        return list(self.scan())

    def spec(self, name: str) -> ModelSpec | None:
        """Re-read one model folder (``load_model`` picks up edits), or None if absent."""
        if not NAME_RE.match(name):
            return None
        folder = self.path / name
        if not folder.is_dir():
            return None
        return read_model_folder(folder)


def read_model_folder(folder: Path) -> ModelSpec:
    """Read ``folder`` into a ModelSpec; problems become ``ModelSpec.error``, never raise."""
    name = folder.name
    param = folder / "model.param"
    base = ModelSpec(name=name, path=folder, param_path=param)
    if not NAME_RE.match(name):
        return dataclasses.replace(
            base, error=f"{name}: model folder names must match {NAME_RE.pattern}")
    try:
        settings = _read_config(folder / "config.toml", name)
        try:
            files = model_files(folder)
        except ModelFormatError as exc:
            raise BadInput(str(exc)) from None
        param = files.param
        inputs, prebuilt, outputs = _model_shapes(param, settings["inputs"], name)
        where = f"{name}/config.toml"
        preprocess = postprocess = None
        if settings["preprocess"] is not None:
            preprocess = parse_preprocess(where, settings["preprocess"],
                                          {blob: s.dims() for blob, s in inputs.items()})
        if settings["postprocess"] is not None:
            postprocess = parse_postprocess(where, settings["postprocess"], folder, outputs)
        bin_path: Path | None = files.weights
        if settings.pop("random_weights"):
            bin_path = None
        elif not files.weights.is_file():
            raise BadInput(f"{name}/{files.weights.name}: missing (or set random_weights = true in "
                           f"{name}/config.toml)")
    except BadInput as exc:
        return dataclasses.replace(base, error=exc.message)
    except ProcessingError as exc:  # [preprocess] / [postprocess]
        return dataclasses.replace(base, error=str(exc))
    return ModelSpec(
        name=name,
        path=folder,
        param_path=param,
        bin_path=bin_path,
        inputs=inputs,
        outputs=outputs,
        prebuilt=prebuilt,
        precision=settings["precision"],
        devices=settings["devices"],
        cpu_fallback=settings["cpu_fallback"],
        warmup=settings["warmup"],
        queue_limit=settings["queue_limit"],
        seed=settings["seed"],
        plan_cache_shapes=settings["plan_cache_shapes"],
        plan_cache_mb=settings["plan_cache_mb"],
        max_batch_size=settings["max_batch_size"],
        preferred_batch_sizes=settings["preferred_batch_sizes"],
        max_queue_delay_ms=settings["max_queue_delay_ms"],
        preprocess=preprocess,
        postprocess=postprocess,
    )


def _model_shapes(param: Path, configured: dict[str, InputSpec], name: str
                  ) -> tuple[dict[str, InputSpec], tuple[ShapeKey, ...], dict[str, tuple[int, ...]]]:
    """The inputs (declared shapes merged with config.toml's), the shape keys to build at
    load, and the outputs' metadata shapes, from the graph without weights."""
    try:
        layers = read_param(param)
    except ModelFormatError as exc:
        raise BadInput(f"{name}/{exc}") from None
    declared = {b: layer.params.declared_shape() for layer in layers if layer.type == "Input"
                for b in layer.outputs}
    unknown = sorted(set(configured) - set(declared))
    if unknown:
        raise BadInput(f"{name}/config.toml: [inputs] names {', '.join(map(repr, unknown))}, "
                       f"not inputs of model.param (its inputs: {', '.join(sorted(declared))})")
    inputs: dict[str, InputSpec] = {}
    for blob, shape in declared.items():
        given = configured.get(blob, InputSpec())
        dynamic = shape is None or given.min is not None or given.max is not None
        shapes = given.shapes or ((shape,) if shape is not None else ())
        if not dynamic and len(shapes) > 1:
            raise BadInput(f"{name}/config.toml: inputs.{blob}: model.param fixes this input's "
                           "shape, so it takes one shape (give min/max to make it dynamic)")
        spec = dataclasses.replace(given, shapes=shapes, dynamic=dynamic)
        problem = check_bounds(f"{name}/config.toml: inputs.{blob}", spec)
        if problem:
            raise BadInput(problem)
        inputs[blob] = spec
    prebuilt: tuple[ShapeKey, ...] = ()
    if all(s.shapes for s in inputs.values()):
        prebuilt = tuple(itertools.product(*(s.shapes for s in inputs.values())))
    consumed = {b for layer in layers for b in layer.inputs}
    output_names = [b for layer in layers for b in layer.outputs if b not in consumed]
    shapes_seen: dict[str, set[tuple[int, ...]]] = {b: set() for b in output_names}
    for key in prebuilt:
        try:
            graph = build_graph(layers, param.name, dict(zip(inputs, key)))
        except ModelFormatError as exc:
            raise BadInput(f"{name}/{exc} (for input shapes {dict(zip(inputs, key))})") from None
        for b in output_names:
            shapes_seen[b].add(graph.blob_shapes[b])
    outputs = {b: _merged_dims(seen) for b, seen in shapes_seen.items()}
    return inputs, prebuilt, outputs


def _merged_dims(shapes: set[tuple[int, ...]]) -> tuple[int, ...]:
    """One metadata shape for several: -1 where they differ; () when none or ranks differ."""
    if not shapes or len({len(s) for s in shapes}) != 1:
        return ()
    return tuple(dims[0] if len(set(dims)) == 1 else -1 for dims in zip(*shapes))


def _read_config(path: Path, name: str) -> dict[str, Any]:
    where = f"{name}/config.toml"
    raw: dict[str, Any] = {}
    if path.exists():
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"{where}: cannot read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise BadInput(f"{where}: invalid TOML: {exc}") from None
    unknown = sorted(set(raw) - set(CONFIG_KEYS))
    if unknown:
        raise BadInput(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                       f"(known: {', '.join(CONFIG_KEYS)})")

    def bad(key: str, expected: str) -> BadInput:
        return BadInput(f"{where}: key '{key}': expected {expected}, got {raw[key]!r}")

    out: dict[str, Any] = {}
    inputs = raw.get("inputs", {})
    if not isinstance(inputs, dict):
        raise bad("inputs", "a table like [inputs] data = [3, 224, 224]")
    out["inputs"] = {blob: _input_setting(f"{where}: key 'inputs.{blob}'", value)
                     for blob, value in inputs.items()}

    precision = raw.get("precision", "auto")
    if precision not in PRECISIONS:
        raise bad("precision", f"one of {', '.join(PRECISIONS)}")
    out["precision"] = precision

    devices = raw.get("devices", "auto")
    if isinstance(devices, str):
        if devices not in DEVICE_MODES:
            raise bad("devices", f"one of {', '.join(DEVICE_MODES)} or a list like [0, \"cpu\"]")
        out["devices"] = devices
    elif isinstance(devices, list) and devices and all(_device_item(d) is not None for d in devices):
        out["devices"] = tuple(_device_item(d) for d in devices)
    else:
        raise bad("devices", "auto, all, gpu, cpu or a non-empty list of devices: Vulkan indices, "
                             "\"vulkan:N\" and \"cpu\"")

    for key, default in (("cpu_fallback", True), ("random_weights", False)):
        value = raw.get(key, default)
        if not isinstance(value, bool):
            raise bad(key, "true or false")
        out[key] = value

    for key, low, default in (("warmup", 0, None), ("queue_limit", 1, None), ("seed", 0, 0),
                              ("plan_cache_shapes", 1, 8), ("plan_cache_mb", 1, 1024),
                              ("max_batch_size", 1, 8)):
        value = raw.get(key, default)
        if value is not None and (type(value) is not int or value < low):
            raise bad(key, f"an integer >= {low}")
        out[key] = value

    preferred = raw.get("preferred_batch_sizes", [])
    if not (isinstance(preferred, list) and all(
            type(n) is int and 1 <= n <= out["max_batch_size"] for n in preferred)):
        raise bad("preferred_batch_sizes",
                  f"a list of batch sizes from 1 to max_batch_size ({out['max_batch_size']})")
    out["preferred_batch_sizes"] = tuple(sorted(set(preferred)))
    delay = raw.get("max_queue_delay_ms", 0.0)
    if type(delay) not in (int, float) or not 0 <= delay <= 10_000:
        raise bad("max_queue_delay_ms", "milliseconds from 0 to 10000")
    out["max_queue_delay_ms"] = float(delay)
    out["preprocess"] = raw.get("preprocess")  # validated against the model's inputs later
    out["postprocess"] = raw.get("postprocess")
    return out


def _device_item(item: object) -> int | str | None:
    """A ``devices`` list entry as the scheduler takes it (an index, or "cpu"): an index, or a
    device name (``"cpu"``, ``"vulkan:N"``, vkserve.devices.names); None when it is neither."""
    if type(item) is int:
        return item if item >= 0 else None
    if not isinstance(item, str):
        return None
    try:
        name = parse_device(item)
    except DeviceNameError:
        return None
    return CPU if name.is_cpu else name.index


def _shape_setting(where: str, value: object) -> Shape:
    if (isinstance(value, list) and 1 <= len(value) <= 4
            and all(type(n) is int and n > 0 for n in value)):
        return tuple(value)
    raise BadInput(f"{where}: expected 1 to 4 positive integers like [3, 224, 224], got {value!r}")


def _input_setting(where: str, value: object) -> InputSpec:
    """``data = [3, 224, 224]`` or a table ``{shapes = [[...], ...], min = [...], max = [...]}``."""
    if not isinstance(value, dict):
        return InputSpec(shapes=(_shape_setting(where, value),))
    unknown = sorted(set(value) - set(INPUT_KEYS))
    if unknown:
        raise BadInput(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                       f"(known: {', '.join(INPUT_KEYS)})")
    shapes = value.get("shapes", [])
    if not isinstance(shapes, list):
        raise BadInput(f"{where}.shapes: expected a list of shapes like [[3, 224, 224]], got {shapes!r}")
    return InputSpec(
        shapes=tuple(_shape_setting(f"{where}.shapes", s) for s in shapes),
        min=None if "min" not in value else _shape_setting(f"{where}.min", value["min"]),
        max=None if "max" not in value else _shape_setting(f"{where}.max", value["max"]))
