"""Work-group (local) size tuning for the Vulkan engine, after Compute Library's CLTuner.

Why: a dispatch's speed can change a lot with how its global size is cut into work groups,
and no rule picks the best cut for every shader, shape and GPU. Like CLTuner (NORMAL mode),
`tune_plan` (engine.tuner) times a list of candidate local sizes for each distinct dispatch of
a Plan and keeps the fastest in a `TuningTable`; Plans built later look the winner up here
(`tuned_dispatches`) and fall back to the layer's default when the table has nothing.

Key of an entry (`TuningKey`): shader id, a hash of the shader source, precision, global
size, the layer's default local size, specialization constants and push constants (the
shapes). The device and driver are not in the key but in the file: one file per device
identity (DeviceIdentity, driver version included; CLTuner's key omits the driver, ours must
not), so a driver update starts a new, empty table. The default local size is in the key so
that a layer author changing a default invalidates entries measured against the old one.

Dispatches are tuned only when the shader leaves its local size to the dispatcher: a shader
that declares `local_size_*` itself, or shares data across the work group (shared memory,
barrier(), subgroup operations), needs its own size for correctness (innerproduct,
pooling_global and softmax reduce across 64 invocations). A Dispatch may also carry a
`fixed_local_size = True` attribute.

Candidates differ from CLTuner in two Vulkan-specific ways: limits come from the device
(maxComputeWorkGroupSize per axis, maxComputeWorkGroupInvocations, at most 65535 groups per
axis) instead of fixed axis caps, and work groups smaller than a subgroup are skipped (they
leave SIMD lanes idle) unless the whole dispatch is smaller. Each axis is also kept at most
the global size along it, which keeps every extra invocation out of range on the axes the
shaders bound-check.

File: `<cache dir>/<pipeline cache name>.tuning` (the pipeline cache's name with the suffix
`.tuning`), JSON: magic, format version, the device identity, entries and a BLAKE2b digest of
the rest. Any doubt (size, parse, magic, version, digest, another device, a malformed entry)
rejects the whole file as a miss with one log line; it is never an error. Saving happens
under a WriterLock on `<file>.lock` and merges with what the file holds, then replaces it
with `vkserve.cache.persist.atomic_write`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import numbers
import os
import re
import stat
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vkserve.cache.cache_file import DeviceIdentity
from vkserve.cache.persist import WriterLock, atomic_write, describe_os_error
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.glsl_extension import declares_local_size, strip_comments
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, Dispatch, Scalar
from vkserve.devices.vulkan.shader_registry import builtin_shader

if TYPE_CHECKING:
    from vkserve.devices.vulkan.device import VulkanDevice

log = logging.getLogger(__name__)

MAGIC = "vkserve-tuning"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 4 * 1024 * 1024
SUFFIX = ".tuning"

LocalSize = tuple[int, int, int]


# -------------------------------------------------------------------------------- keys


@dataclasses.dataclass(frozen=True)
class TuningKey:
    """What a dispatch's best local size depends on, besides the device (see module doc)."""

    shader: str
    source_hash: str  # hex
    precision: str
    global_size: LocalSize
    default_local_size: LocalSize
    spec_constants: tuple[Scalar, ...]
    push_constants: tuple[Scalar, ...]

    @classmethod
    def of(cls, dispatch: Dispatch, precision: Precision) -> TuningKey:
        return cls(dispatch.shader, builtin_shader(dispatch.shader).source_hash.hex(),
                   Precision(precision).value,
                   tuple(int(v) for v in dispatch.global_size),  # type: ignore[arg-type]
                   tuple(int(v) for v in dispatch.local_size),  # type: ignore[arg-type]
                   _plain(dispatch.spec_constants), _plain(dispatch.push_constants))

    def to_json(self) -> dict[str, Any]:
        return {"shader": self.shader, "source_hash": self.source_hash,
                "precision": self.precision, "global_size": list(self.global_size),
                "default_local_size": list(self.default_local_size),
                "spec_constants": list(self.spec_constants),
                "push_constants": list(self.push_constants)}

    def describe(self) -> str:
        return f"{self.shader} global {self.global_size} default {self.default_local_size}"


@dataclasses.dataclass(frozen=True)
class TunedEntry:
    local_size: LocalSize
    default_ms: float
    best_ms: float


def _plain(values: Iterable[Scalar]) -> tuple[Scalar, ...]:
    """Python ints and floats (layers may pass numpy scalars), as JSON stores them back."""
    return tuple(int(v) if isinstance(v, numbers.Integral) else float(v) for v in values)


# Shaders that share data across the work group depend on its size for correctness.
_WORKGROUP_SHARING = re.compile(r"\bshared\b|\bbarrier\s*\(|\bsubgroup\w*\s*\(|GL_KHR_shader_subgroup")


@functools.cache
def shader_fixes_local_size(shader_id: str) -> bool:
    """True when the shader's local size must not be changed (see module doc)."""
    source = builtin_shader(shader_id).source
    return declares_local_size(source) or bool(_WORKGROUP_SHARING.search(strip_comments(source)))


def tunable(dispatch: Dispatch) -> bool:
    return not (getattr(dispatch, "fixed_local_size", False)
                or shader_fixes_local_size(dispatch.shader))


# -------------------------------------------------------------------------------- candidates


@dataclasses.dataclass(frozen=True)
class WorkGroupLimits:
    """The device limits a local size must respect."""

    max_invocations: int = 128  # Vulkan's guaranteed minimums
    max_size: LocalSize = (128, 128, 64)
    max_groups: LocalSize = (MAX_GROUPS, MAX_GROUPS, MAX_GROUPS)
    subgroup_size: int = 1

    @classmethod
    def of_device(cls, device: VulkanDevice) -> WorkGroupLimits:
        """Read from VkPhysicalDeviceLimits (DeviceCaps keeps only the scalar ones)."""
        ctx = device.ctx
        limits = ctx.vk.vkGetPhysicalDeviceProperties(ctx.physical_device).limits
        size = tuple(int(v) for v in limits.maxComputeWorkGroupSize)
        count = tuple(min(int(v), MAX_GROUPS) for v in limits.maxComputeWorkGroupCount)
        return cls(int(limits.maxComputeWorkGroupInvocations), size, count,  # type: ignore[arg-type]
                   max(1, int(device.caps.subgroup_size)))

    def allows(self, global_size: Sequence[int], local: Sequence[int]) -> bool:
        return (len(local) == 3 and all(isinstance(v, int) and v >= 1 for v in local)
                and math.prod(local) <= self.max_invocations
                and all(v <= m for v, m in zip(local, self.max_size))
                and all(-(-g // v) <= m for g, v, m in zip(global_size, local, self.max_groups)))


def _axis_values(n: int, cap: int, mode: str, loose: bool) -> list[int]:
    top = max(1, min(n, cap))
    if mode == "rapid":
        return [1 << k for k in range(top.bit_length()) if 1 << k <= top]
    return [1] + [i for i in range(2, top + 1)
                  if i & (i - 1) == 0 or n % i == 0 or (loose and n % i <= 1)]


def candidates(global_size: Sequence[int], limits: WorkGroupLimits,
               mode: str = "normal") -> list[LocalSize]:
    """Local sizes to try for a dispatch of `global_size` (see the module doc).

    normal: CLTuner's NORMAL lists per axis (1, powers of two, divisors of the global size;
    x and y also near-divisors when gws z > 16) within the device limits. rapid: powers of
    two only and at most 256 invocations, for a quick pass.
    """
    if mode not in ("normal", "rapid"):
        raise ValueError(f"tuning mode {mode!r}: expected normal or rapid")
    gx, gy, gz = (max(1, int(v)) for v in global_size)
    loose = gz > 16
    axes = [_axis_values(gx, limits.max_size[0], mode, loose),
            _axis_values(gy, limits.max_size[1], mode, loose),
            _axis_values(gz, limits.max_size[2], mode, False)]
    reach = math.prod(min(g, m) for g, m in zip((gx, gy, gz), limits.max_size))
    floor = min(limits.subgroup_size, reach, limits.max_invocations)
    ceiling = min(limits.max_invocations, 256) if mode == "rapid" else limits.max_invocations
    out = []
    for x in axes[0]:
        for y in axes[1]:
            for z in axes[2]:
                if floor <= x * y * z <= ceiling and limits.allows((gx, gy, gz), (x, y, z)):
                    out.append((x, y, z))
    return out


# -------------------------------------------------------------------------------- the table


class TuningFileRejected(Exception):
    """The tuning file must not be used; the message says why (for the log)."""


def tuning_path(cache_dir: str | os.PathLike[str], identity: DeviceIdentity) -> Path:
    """The pipeline cache's file name with `.tuning` instead of `.cache`."""
    return Path(cache_dir) / (Path(identity.file_name()).stem + SUFFIX)


def _identity_json(identity: DeviceIdentity) -> dict[str, Any]:
    return {"vendor_id": identity.vendor_id, "device_id": identity.device_id,
            "api_version": identity.api_version, "driver_version": identity.driver_version,
            "driver_id": identity.driver_id, "device_name": identity.device_name,
            "driver_name": identity.driver_name,
            "pipeline_cache_uuid": identity.pipeline_cache_uuid.hex()}


def _digest(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def _int3(value: Any, what: str) -> LocalSize:
    if (not isinstance(value, list) or len(value) != 3
            or not all(type(v) is int and 1 <= v <= 1 << 31 for v in value)):
        raise TuningFileRejected(f"{what}: expected three positive integers")
    return (value[0], value[1], value[2])


def _scalars(value: Any, what: str) -> tuple[Scalar, ...]:
    if not isinstance(value, list) or not all(type(v) in (int, float) for v in value):
        raise TuningFileRejected(f"{what}: expected a list of numbers")
    return tuple(value)


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise TuningFileRejected(f"{what}: expected a string")
    return value


def _ms(value: Any, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise TuningFileRejected(f"{what}: expected a time in ms")
    return float(value)


class TuningTable:
    """Best local sizes of one device identity; thread-safe lookups and updates."""

    def __init__(self, identity: DeviceIdentity,
                 entries: Mapping[TuningKey, TunedEntry] | None = None) -> None:
        self.identity = identity
        self.entries: dict[TuningKey, TunedEntry] = dict(entries or {})
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: TuningKey) -> TunedEntry | None:
        with self._lock:
            return self.entries.get(key)

    def put(self, key: TuningKey, entry: TunedEntry) -> None:
        with self._lock:
            self.entries[key] = entry

    def lookup(self, dispatch: Dispatch, precision: Precision) -> LocalSize | None:
        """The tuned local size of a tunable dispatch, or None (use the default)."""
        if not self.entries or not tunable(dispatch):
            return None
        entry = self.get(TuningKey.of(dispatch, precision))
        return entry.local_size if entry is not None else None

    # -- encoding ----------------------------------------------------------------------------

    def encode(self) -> bytes:
        with self._lock:
            items = sorted(self.entries.items(), key=lambda kv: json.dumps(kv[0].to_json()))
        body = {"magic": MAGIC, "format_version": FORMAT_VERSION,
                "device": _identity_json(self.identity),
                "entries": [{**key.to_json(), "local_size": list(e.local_size),
                             "default_ms": e.default_ms, "best_ms": e.best_ms}
                            for key, e in items]}
        # Compact, one entry per line: small, and still readable and diffable.
        head = {k: v for k, v in body.items() if k != "entries"}
        lines = [json.dumps(e, separators=(",", ":")) for e in body["entries"]]
        text = (json.dumps(head, separators=(", ", ": "))[:-1] + ',\n "entries": [\n  '
                + ",\n  ".join(lines) + '\n ],\n "digest": "' + _digest(body) + '"}\n')
        return text.encode()

    @classmethod
    def decode(cls, data: bytes, identity: DeviceIdentity) -> TuningTable:
        """Strict: raises TuningFileRejected on anything doubtful (all-or-nothing)."""
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise TuningFileRejected(f"not JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("magic") != MAGIC:
            raise TuningFileRejected("bad magic (not a vkserve tuning file)")
        if doc.get("format_version") != FORMAT_VERSION:
            raise TuningFileRejected(f"format version {doc.get('format_version')!r}, "
                                     f"expected {FORMAT_VERSION}")
        if set(doc) != {"magic", "format_version", "device", "entries", "digest"}:
            raise TuningFileRejected("unexpected top-level fields")
        body = {k: v for k, v in doc.items() if k != "digest"}
        if doc["digest"] != _digest(body):
            raise TuningFileRejected("digest mismatch (damaged file)")
        if doc["device"] != _identity_json(identity):
            raise TuningFileRejected("written for another device or driver")
        if not isinstance(doc["entries"], list):
            raise TuningFileRejected("entries: expected a list")
        entries: dict[TuningKey, TunedEntry] = {}
        for n, item in enumerate(doc["entries"]):
            what = f"entry {n}"
            if not isinstance(item, dict):
                raise TuningFileRejected(f"{what}: expected an object")
            try:
                key = TuningKey(
                    _str(item["shader"], what), _str(item["source_hash"], what),
                    _str(item["precision"], what), _int3(item["global_size"], what),
                    _int3(item["default_local_size"], what),
                    _scalars(item["spec_constants"], what), _scalars(item["push_constants"], what))
                entry = TunedEntry(_int3(item["local_size"], what),
                                   _ms(item["default_ms"], what), _ms(item["best_ms"], what))
            except KeyError as e:
                raise TuningFileRejected(f"{what}: missing field {e}") from None
            if key in entries:
                raise TuningFileRejected(f"{what}: duplicate key")
            entries[key] = entry
        return cls(identity, entries)

    # -- files -------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike[str], identity: DeviceIdentity,
             on_error: Callable[[OSError], None] | None = None) -> TuningTable | None:
        """The table in `path`, or None: missing (DEBUG) or rejected (one WARNING); an
        OSError other than a missing file (unreadable, not rejected) also goes to `on_error`."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise TuningFileRejected("not a regular file")
                if st.st_size > MAX_FILE_BYTES:
                    raise TuningFileRejected(f"size {st.st_size} exceeds the "
                                             f"{MAX_FILE_BYTES}-byte limit")
                data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise TuningFileRejected("grew past the size limit while being read")
            return cls.decode(data, identity)
        except FileNotFoundError:
            log.debug("no tuning file at %s", path)
            return None
        except TuningFileRejected as e:
            reason = str(e)
        except OSError as e:
            if on_error is not None:
                on_error(e)
            reason = f"cannot read: {describe_os_error(e)}"
        log.warning("ignoring tuning file %s: %s", path, reason)
        return None

    def save(self, path: str | os.PathLike[str]) -> bool:
        """Merge into the file at `path` (our entries win) and replace it atomically, holding
        `<path>.lock`; False (logged) when another process holds the lock or the file system
        fails (a WARNING naming the path and the errno: the table stays in memory)."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning("tuning file %s: cannot create its folder: %s; not saved", path,
                        describe_os_error(e))
            return False
        with WriterLock(path) as lock:
            if not lock.acquire():
                log.info("tuning file %s: %s; not saved", path,
                         "another process is its writer" if lock.error is None
                         else f"cannot lock: {describe_os_error(lock.error)}")
                return False
            merged = TuningTable.load(path, self.identity) or TuningTable(self.identity)
            with self._lock:
                merged.entries.update(self.entries)
            try:
                atomic_write(path, merged.encode())
            except OSError as e:
                log.warning("tuning file %s: cannot save: %s; not saved", path,
                            describe_os_error(e))
                return False
        with self._lock:
            for key, entry in merged.entries.items():
                self.entries.setdefault(key, entry)
        log.info("tuning file %s: saved %d entries", path, len(merged))
        return True


# Tables of open devices, loaded once per VulkanDevice from its cache folder.
_tables: weakref.WeakKeyDictionary[Any, TuningTable | None] = weakref.WeakKeyDictionary()
_tables_lock = threading.Lock()


def device_tuning_path(device: VulkanDevice) -> Path | None:
    """The tuning file beside the device's pipeline cache (None: in-memory cache)."""
    cache_path = device.pipelines.path
    if cache_path is None:
        return None
    return tuning_path(cache_path.parent, DeviceIdentity.from_caps(device.caps))


def table_for(device: VulkanDevice) -> TuningTable | None:
    """The device's tuning table (read from its file on first use), or None."""
    with _tables_lock:
        if device in _tables:
            return _tables[device]
    path = device_tuning_path(device)
    table = TuningTable.load(path, DeviceIdentity.from_caps(device.caps),
                             on_error=lambda e: device.pipelines.count_error("tuning")
                             ) if path else None
    if table is not None:
        log.info("tuning file %s: %d tuned dispatches", path, len(table))
    with _tables_lock:
        return _tables.setdefault(device, table)


def set_table(device: VulkanDevice, table: TuningTable | None) -> None:
    """Make `table` the one Plans on `device` use from now on (after tuning)."""
    with _tables_lock:
        _tables[device] = table


def tuned_dispatches(device: VulkanDevice, precision: Precision,
                     dispatches: Sequence[Dispatch]) -> list[Dispatch]:
    """`dispatches` with tuned local sizes where the device's table has one that still fits
    the device; the same objects otherwise (the Plan's lookup)."""
    table = table_for(device)
    if table is None or not len(table):
        return list(dispatches)
    limits = limits_for(device)
    out = []
    for d in dispatches:
        local = table.lookup(d, precision)
        if local is not None and local != tuple(d.local_size) and limits.allows(d.global_size, local):
            d = dataclasses.replace(d, local_size=local)
        out.append(d)
    return out


_limits: weakref.WeakKeyDictionary[Any, WorkGroupLimits] = weakref.WeakKeyDictionary()


def limits_for(device: VulkanDevice) -> WorkGroupLimits:
    with _tables_lock:
        found = _limits.get(device)
    if found is None:
        found = WorkGroupLimits.of_device(device)
        with _tables_lock:
            _limits[device] = found
    return found
