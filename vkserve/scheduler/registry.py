"""The model repository: one folder per model (DESIGN §6, issue 6 part 4).

    <repo>/<name>/model.param    ncnn graph (required)
    <repo>/<name>/model.bin      weights (required unless config.toml says random_weights)
    <repo>/<name>/config.toml    optional:

        precision = "auto"        # auto | fp32 | fp16 | fp16s | fp16sa (Vulkan; the CPU is bf16)
        devices = "auto"          # auto | all | gpu | cpu | [0, 1, "cpu"]
        cpu_fallback = true       # may be loaded on the CPU on demand when its devices fail
        warmup = 1                # warm-up runs per Plan instance before the model is ready
        queue_limit = 64          # queued jobs before OVERLOADED (default: the scheduler's)
        random_weights = false    # seeded random weights instead of model.bin (demos, benchmarks)
        seed = 0                  # seed for random_weights
        [inputs]
        data = [3, 224, 224]      # input shapes in ncnn order (default: the Input layer's)

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
import logging
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import Graph, build_graph, load_model, read_param
from vkserve.scheduler.errors import BadInput

log = logging.getLogger(__name__)

__all__ = ["ModelRepository", "ModelSpec", "PRECISIONS", "DeviceLike"]

Shape = tuple[int, ...]
PRECISIONS = ("auto", "fp32", "fp16", "fp16s", "fp16sa")
DEVICE_MODES = ("auto", "all", "gpu", "cpu")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CONFIG_KEYS = ("inputs", "precision", "devices", "cpu_fallback", "warmup", "queue_limit",
               "random_weights", "seed")


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
    inputs: Mapping[str, Shape] = dataclasses.field(default_factory=dict)
    outputs: Mapping[str, Shape] = dataclasses.field(default_factory=dict)
    precision: str = "auto"
    devices: str | tuple[int | str, ...] = "auto"
    cpu_fallback: bool = True
    warmup: int | None = None  # None: the scheduler's default
    queue_limit: int | None = None  # None: the scheduler's default
    seed: int = 0
    error: str | None = None

    def load_graph(self) -> Graph:
        """Parse the .param and read the weights (blocking: call it in a worker thread)."""
        if self.error is not None:
            raise BadInput(self.error)
        return load_model(self.param_path, self.bin_path, dict(self.inputs) or None, seed=self.seed)

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
        if not param.is_file():
            raise BadInput(f"{name}/model.param: missing (every model folder needs one)")
        graph = _graph_shapes(param, settings["inputs"], name)
        bin_path: Path | None = folder / "model.bin"
        if settings.pop("random_weights"):
            bin_path = None
        elif not bin_path.is_file():
            raise BadInput(f"{name}/model.bin: missing (or set random_weights = true in "
                           f"{name}/config.toml)")
    except BadInput as exc:
        return dataclasses.replace(base, error=exc.message)
    return ModelSpec(
        name=name,
        path=folder,
        param_path=param,
        bin_path=bin_path,
        inputs={n: graph.blob_shapes[n] for n in graph.input_names},
        outputs={n: graph.blob_shapes[n] for n in graph.output_names},
        precision=settings["precision"],
        devices=settings["devices"],
        cpu_fallback=settings["cpu_fallback"],
        warmup=settings["warmup"],
        queue_limit=settings["queue_limit"],
        seed=settings["seed"],
    )


def _graph_shapes(param: Path, inputs: dict[str, Shape], name: str) -> Graph:
    """The graph without weights: enough for input/output names and shapes."""
    try:
        layers = read_param(param)
    except ModelFormatError as exc:
        raise BadInput(f"{name}/{exc}") from None
    declared = {b for layer in layers if layer.type == "Input" for b in layer.outputs}
    unknown = sorted(set(inputs) - declared)
    if unknown:
        raise BadInput(f"{name}/config.toml: [inputs] names {', '.join(map(repr, unknown))}, "
                       f"not inputs of model.param (its inputs: {', '.join(sorted(declared))})")
    try:
        return build_graph(layers, param.name, inputs or None)
    except ModelFormatError as exc:
        hint = "" if inputs else f" (give input shapes in {name}/config.toml [inputs])"
        raise BadInput(f"{name}/{exc}{hint}") from None


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
    shapes: dict[str, Shape] = {}
    for blob, shape in inputs.items():
        ok = (isinstance(shape, list) and 1 <= len(shape) <= 4
              and all(type(n) is int and n > 0 for n in shape))
        if not ok:
            raise BadInput(f"{where}: key 'inputs.{blob}': expected 1 to 4 positive integers "
                           f"like [3, 224, 224], got {shape!r}")
        shapes[blob] = tuple(shape)
    out["inputs"] = shapes

    precision = raw.get("precision", "auto")
    if precision not in PRECISIONS:
        raise bad("precision", f"one of {', '.join(PRECISIONS)}")
    out["precision"] = precision

    devices = raw.get("devices", "auto")
    if isinstance(devices, str):
        if devices not in DEVICE_MODES:
            raise bad("devices", f"one of {', '.join(DEVICE_MODES)} or a list like [0, \"cpu\"]")
        out["devices"] = devices
    elif isinstance(devices, list) and devices and all(
            (type(d) is int and d >= 0) or d == "cpu" for d in devices):
        out["devices"] = tuple(devices)
    else:
        raise bad("devices", "auto, all, gpu, cpu or a non-empty list of device indices and \"cpu\"")

    for key, default in (("cpu_fallback", True), ("random_weights", False)):
        value = raw.get(key, default)
        if not isinstance(value, bool):
            raise bad(key, "true or false")
        out[key] = value

    for key, low, default in (("warmup", 0, None), ("queue_limit", 1, None), ("seed", 0, 0)):
        value = raw.get(key, default)
        if value is not None and (type(value) is not int or value < low):
            raise bad(key, f"an integer >= {low}")
        out[key] = value
    return out
