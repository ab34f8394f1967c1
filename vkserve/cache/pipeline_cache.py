"""PipelineCache: the three tiers of DESIGN §5 for one device.

1. live artifacts (pipelines with their layouts), keyed by a digest of the full
   request; never on disk;
2. SPIR-V, keyed by (shader id, option bits, hash of the shader's source);
3. the driver's VkPipelineCache blob, merged from disk at open and saved back.

A request may also carry a raw SPIR-V module (`SpirvModule`): it skips tier 2 (the
caller holds the code) but its pipeline is a tier-1 artifact keyed by the module's hash
and is created through the driver cache (tier 3) like every other.

The cache is device-agnostic: a `PipelineBackend` (devices/vulkan supplies one)
compiles GLSL, creates pipelines and owns the driver cache object, so `cache/`
depends on nothing above it. Thread safety: the cache's lock guards only its
tables; compiles and pipeline creations run outside it, so different keys build
in parallel, and a key requested by several threads at once is built once
(the others wait for that build's result or exception).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from vkserve.cache.cache_file import DeviceIdentity, SpirvKey, encode_cache_file, source_hash
from vkserve.cache.persist import WriterLock, atomic_write, describe_os_error, read_cache_file

log = logging.getLogger(__name__)

T = TypeVar("T")
SpecValue = int | float


@dataclasses.dataclass(frozen=True)
class ShaderSource:
    """A shader's stable id (built-ins: the .comp file's stem) and its GLSL text."""

    shader_id: str
    source: str

    @property
    def source_hash(self) -> bytes:
        return source_hash(self.source.encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class SpirvModule:
    """A compiled SPIR-V module handed over as is (no GLSL): an id for logs and its words."""

    shader_id: str
    code: bytes

    @property
    def source_hash(self) -> bytes:
        """The module's hash: the cache key of its pipelines."""
        return source_hash(self.code)


@dataclasses.dataclass(frozen=True)
class PipelineRequest:
    shader: ShaderSource | SpirvModule
    option_bits: int  # 0 for a SpirvModule (its code is final)
    local_size: tuple[int, int, int] = (64, 1, 1)
    spec_constants: tuple[SpecValue, ...] = ()

    def digest(self, subgroup_size: int) -> bytes:
        """The tier-1 key: everything the compiled pipeline depends on."""
        h = hashlib.blake2b(digest_size=16)
        h.update(self.shader.shader_id.encode() + b"\0" + self.shader.source_hash)
        h.update(struct.pack("<Q3II", self.option_bits, *self.local_size, subgroup_size))
        for v in self.spec_constants:
            h.update(struct.pack("<cf", b"f", v) if isinstance(v, float)
                     else struct.pack("<cq", b"i", v))
        return h.digest()

    @property
    def spirv_key(self) -> SpirvKey:
        return SpirvKey(self.shader.shader_id, self.option_bits, self.shader.source_hash)



class Artifact(Protocol):
    def destroy(self) -> None: ...


class PipelineBackend(Protocol):
    """What a device provides to its PipelineCache."""

    identity: DeviceIdentity
    subgroup_size: int

    def compile(self, shader: ShaderSource, option_bits: int) -> bytes: ...

    def create_pipeline(self, spirv: bytes, request: PipelineRequest) -> Artifact: ...

    def open_driver_cache(self, initial_data: bytes) -> None:
        """Create the driver cache from saved data; raise if the driver refuses it."""

    def driver_cache_data(self) -> bytes: ...

    def close_driver_cache(self) -> None: ...


@dataclasses.dataclass
class CacheStats:
    pipeline_hits: int = 0
    pipeline_misses: int = 0
    spirv_hits: int = 0
    glsl_compiles: int = 0  # SPIR-V tier misses
    driver_blob_loaded_bytes: int = 0
    driver_blob_saved_bytes: int = 0
    compile_seconds: float = 0.0  # GLSL -> SPIR-V
    pipeline_seconds: float = 0.0  # vkCreateComputePipelines (uses the driver cache)
    # Failed file operations (each also a WARNING); the cache then works in memory only.
    create_errors: int = 0  # creating the cache folder
    lock_errors: int = 0  # opening or locking `<file>.lock` (not: another process holds it)
    load_errors: int = 0  # reading the cache file (a rejected file is a miss, not an error)
    save_errors: int = 0  # writing the cache file
    tuning_errors: int = 0  # reading the tuning file beside it
    # The driver is on the list of broken pipeline caches: its cache is not used (1 or 0).
    driver_bypass_errors: int = 0

    #: `op` label of `vkserve_pipeline_cache_errors_total` -> field.
    ERROR_FIELDS: ClassVar[dict[str, str]] = {
        "create": "create_errors", "lock": "lock_errors", "load": "load_errors",
        "save": "save_errors", "tuning": "tuning_errors", "driver_bypass": "driver_bypass_errors"}

    def errors(self) -> dict[str, int]:
        """Failed file operations by op (create, lock, load, save, tuning), and
        driver_bypass."""
        return {op: getattr(self, name) for op, name in self.ERROR_FIELDS.items()}

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class PipelineCache:
    """One device's pipeline cache, persisted to `<directory>/<identity file name>`.

    With `directory=None` nothing is read or written (an in-memory cache).

    The file is an optimisation: no error of the file system (creating the folder, taking
    the lock, reading, saving) ever fails the cache. Each is one WARNING naming the path and
    the errno, and counted in `stats` (`CacheStats.errors()`); the cache then works in
    memory, and the next `save` tries again (a fixed folder or freed disk is used then).
    """

    def __init__(self, backend: PipelineBackend, directory: Path | None) -> None:
        self.backend = backend
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._pipelines: dict[bytes, Artifact] = {}
        self._spirv: dict[SpirvKey, bytes] = {}
        self._inflight: dict[Hashable, Future[Any]] = {}
        self._dirty = False
        self.path = None if directory is None else Path(directory) / backend.identity.file_name()
        self._writer: WriterLock | None = None
        self._retry_writer = False  # the folder or lock failed with an error: save retries
        self._writer_lock = threading.Lock()  # one _open_writer at a time
        blob = b""
        if self.path is not None:
            self._writer = WriterLock(self.path)
            if self._open_writer():
                contents = read_cache_file(self.path, backend.identity,
                                           on_error=lambda exc: self.count_error("load"))
                if contents is not None:
                    self._spirv.update(contents.spirv)
                    blob = contents.driver_blob
                    log.info("pipeline cache %s: loaded %d SPIR-V modules and %d bytes of "
                             "driver cache", self.path, len(contents.spirv), len(blob))
                elif self._present(self.path):  # rejected: replace it at the next save
                    self._dirty = True
        self._saved_blob = blob  # what the file holds; a save is due when the driver's differs
        try:
            backend.open_driver_cache(blob)
            self.stats.driver_blob_loaded_bytes = len(blob)
        except Exception as exc:  # the driver refused data that passed our checks: a miss
            if not blob:
                raise
            log.warning("pipeline cache %s: the driver rejected the saved pipeline cache "
                        "(%s); starting it empty", self.path, exc)
            backend.open_driver_cache(b"")
            self._dirty = True

    @property
    def writable(self) -> bool:
        return self._writer is not None and self._writer.held

    def count_error(self, op: str) -> None:
        """Count a failed file operation (`op`: a key of `CacheStats.ERROR_FIELDS`); the
        caller logs it."""
        name = CacheStats.ERROR_FIELDS[op]
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _file_error(self, op: str, subject: str, exc: OSError) -> None:
        self.count_error(op)
        log.warning("%s: cannot %s: %s; the pipeline cache works in memory only", subject, op,
                    describe_os_error(exc))

    @staticmethod
    def _present(path: Path) -> bool:
        try:
            return path.exists()
        except OSError:
            return True  # something is there that we cannot look at: a save replaces it

    def _open_writer(self) -> bool:
        """Create the folder and try to become the file's writer; False when the folder
        cannot be created (then there is nothing to read either)."""
        assert self.path is not None and self._writer is not None
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._retry_writer = True
            self._file_error("create", f"pipeline cache folder {folder}", exc)
            return False
        if self._writer.acquire():
            self._retry_writer = False
        elif self._writer.error is not None:
            self._retry_writer = True
            if self.stats.lock_errors:  # the WriterLock logs (path, errno) its first only
                self._file_error("lock", f"pipeline cache lock {self._writer.lock_path}",
                                 self._writer.error)
            else:
                self.count_error("lock")
        return True

    def _once(self, table: dict[Any, T], key: Any, build: Callable[[], T]) -> tuple[T, bool]:
        """Return (value, built_here) for `key`, building it at most once at a time."""
        with self._lock:
            if key in table:
                return table[key], False
            future = self._inflight.get(key)
            owner = future is None
            if owner:
                future = self._inflight[key] = Future()
        if not owner:
            return future.result(), False
        try:
            value = build()
        except BaseException as exc:
            with self._lock:
                del self._inflight[key]
            future.set_exception(exc)
            raise
        with self._lock:
            table[key] = value
            del self._inflight[key]
            if table is self._spirv:
                self._dirty = True
        future.set_result(value)
        return value, True

    def spirv(self, shader: ShaderSource, option_bits: int) -> bytes:
        key = SpirvKey(shader.shader_id, option_bits, shader.source_hash)

        def build() -> bytes:
            t0 = time.perf_counter()
            code = self.backend.compile(shader, option_bits)
            with self._lock:
                self.stats.glsl_compiles += 1
                self.stats.compile_seconds += time.perf_counter() - t0
                # The shader's source changed: its entries for the old source are dead.
                for stale in [k for k in self._spirv if k.shader_id == key.shader_id
                              and k.source_hash != key.source_hash]:
                    del self._spirv[stale]
            return code

        code, built = self._once(self._spirv, key, build)
        if not built:
            with self._lock:
                self.stats.spirv_hits += 1
        return code

    def pipeline(self, request: PipelineRequest) -> Artifact:
        """The live pipeline for `request`, compiled and created on first use."""
        key = request.digest(self.backend.subgroup_size)

        def build() -> Artifact:
            shader = request.shader
            code = (shader.code if isinstance(shader, SpirvModule)
                    else self.spirv(shader, request.option_bits))
            t0 = time.perf_counter()
            artifact = self.backend.create_pipeline(code, request)
            with self._lock:
                self.stats.pipeline_seconds += time.perf_counter() - t0
            return artifact

        artifact, built = self._once(self._pipelines, key, build)
        with self._lock:
            if built:
                self.stats.pipeline_misses += 1
            else:
                self.stats.pipeline_hits += 1
        return artifact

    @property
    def pipeline_count(self) -> int:
        return len(self._pipelines)

    def save(self) -> bool:
        """Write the file if its contents changed and this process is the writer."""
        if self.path is None:
            return False
        blob = self.backend.driver_cache_data()
        with self._lock:
            if not self._dirty and blob == self._saved_blob:
                return False
        with self._writer_lock:
            if not self.writable and self._retry_writer:  # the folder or lock failed before
                self._open_writer()
        with self._lock:
            if not self.writable:
                log.debug("pipeline cache %s changed but this process cannot write it",
                          self.path)
                return False
            entries = dict(self._spirv)
            self._dirty = False
            previous, self._saved_blob = self._saved_blob, blob
        data = encode_cache_file(self.backend.identity, entries, blob)
        try:
            atomic_write(self.path, data)
        except OSError as exc:  # full disk, a directory at the path, ...: try again next time
            with self._lock:
                self._dirty = True
                self._saved_blob = previous
            self._file_error("save", f"pipeline cache {self.path}", exc)
            return False
        self.stats.driver_blob_saved_bytes = len(blob)
        log.info("pipeline cache %s: saved %d SPIR-V modules, %d bytes", self.path,
                 len(entries), len(data))
        return True

    def close(self) -> None:
        """Destroy every live pipeline and the driver cache (call `save` first)."""
        with self._lock:
            artifacts = list(self._pipelines.values())
            self._pipelines.clear()
        for artifact in artifacts:
            artifact.destroy()
        self.backend.close_driver_cache()
        if self._writer is not None:
            self._writer.release()
