"""Issue 3 at the integration level: PipelineCache on lavapipe with real files and
real processes (round trip, corruption, driver rejection, shader edits, threads,
one writer per file, saves only on change, counters)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.paths import REPO
from vkserve.cache import cache_file
from vkserve.cache.cache_file import (
    HEADER_SIZE,
    MAX_FILE_BYTES,
    DeviceIdentity,
    SpirvKey,
    decode_cache_file,
    encode_cache_file,
)
from vkserve.cache.pipeline_cache import PipelineCache, PipelineRequest, ShaderSource
from vkserve.devices.capabilities import DeviceCaps, DeviceKind, Precision
from vkserve.devices.discovery import discover_devices
from vkserve.devices.vulkan.context import MemoryKind, VulkanContext
from vkserve.devices.vulkan.descriptors import DescriptorPool
from vkserve.devices.vulkan.errors import VulkanError
from vkserve.devices.vulkan.pipeline import ComputePipeline, pack_scalars
from vkserve.devices.vulkan.pipeline_backend import OPTION_BITS, VulkanPipelineBackend
from vkserve.devices.vulkan.shader_registry import buildable, builtin_shader, builtin_shader_ids

VKSERVE = Path(sys.executable).with_name("vkserve")
CHILD_TIMEOUT_S = 60
RELU_SLOPE = 0.125  # a power of two: the leaky branch is exact in fp32
RELU = PipelineRequest(builtin_shader("relu"), OPTION_BITS[Precision.FP32])


# ---------------------------------------------------------------- helpers


def run_relu(ctx: VulkanContext, pipeline: ComputePipeline, data: np.ndarray) -> np.ndarray:
    """Dispatch a cached fp32 `relu` pipeline (built without spec constants) on `data`."""
    vk = ctx.vk
    count = data.size // 4
    push = pack_scalars([RELU_SLOPE, count])
    buf = ctx.create_buffer(data.nbytes, MemoryKind.DEVICE)
    pool = None
    try:
        ctx.upload(buf, data)
        pool = DescriptorPool(ctx, 1, 1)
        dset = pool.allocate(pipeline.set_layout, [(buf, 0, buf.size)])

        def body(cmd: Any) -> None:
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                       0, 1, [dset], 0, None)
            vk.vkCmdPushConstants(cmd, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                  len(push), vk.ffi.from_buffer(push))
            vk.vkCmdDispatch(cmd, math.ceil(count / pipeline.local_size[0]), 1, 1)

        ctx.run_once(body)
        return ctx.download(buf, data.dtype, data.size)
    finally:
        if pool is not None:
            pool.destroy()
        buf.destroy()


def relu_input() -> np.ndarray:
    return (np.random.default_rng(3).standard_normal(4 * 100) * 4).astype(np.float32)


def child_round_trip(cache_dir: str) -> None:
    """Child process: build every built-in pipeline, run relu, save, print a JSON report."""
    from vkserve.devices.vulkan.device import VulkanDevice  # noqa: PLC0415

    caps = next(d for d in discover_devices() if d.kind is DeviceKind.VULKAN)
    with VulkanDevice(caps, Path(cache_dir)) as dev:
        for shader_id in builtin_shader_ids():
            for precision in caps.supported_precisions():
                if buildable(shader_id, caps, precision):
                    dev.pipeline(shader_id, precision)
        result = run_relu(dev.ctx, dev.pipeline("relu", Precision.FP32), relu_input())
        stats = dev.pipelines.stats
        report = {"pipelines": dev.pipelines.pipeline_count, "glsl_compiles": stats.glsl_compiles,
                  "spirv_hits": stats.spirv_hits, "writer": dev.pipelines.writable,
                  "saved": dev.pipelines.save(), "relu": result.tolist()}
    print(json.dumps(report))


def child_hold(cache_dir: str) -> None:
    """Child process: hold a VulkanDevice (and so the cache's writer lock) until stdin closes."""
    from vkserve.devices.vulkan.device import VulkanDevice  # noqa: PLC0415

    caps = next(d for d in discover_devices() if d.kind is DeviceKind.VULKAN)
    with VulkanDevice(caps, Path(cache_dir)) as dev:
        print(json.dumps({"writer": dev.pipelines.writable}), flush=True)
        sys.stdin.read()


def python_child(function: str, cache_dir: Path) -> list[str]:
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            f"import tests.cache.test_pipeline_cache as t; t.{function}(sys.argv[1])")
    return [sys.executable, "-c", code, str(cache_dir)]


def run_json(argv: list[str]) -> tuple[Any, str]:
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def warm(cache_dir: Path) -> tuple[dict[str, Any], str]:
    results, stderr = run_json([str(VKSERVE), "cache", "warm", "--cache-dir", str(cache_dir),
                                "--json"])
    gpus = [r for r in results if r["device"] != "cpu"]
    assert len(gpus) == 1 and len(results) == 2
    return gpus[0], stderr


class Instrumented:
    """A backend wrapper that records compiles and creations and can run hooks in them."""

    def __init__(self, inner: VulkanPipelineBackend,
                 on_compile: Callable[[ShaderSource], None] | None = None,
                 on_create: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.identity = inner.identity
        self.subgroup_size = inner.subgroup_size
        self.on_compile = on_compile
        self.on_create = on_create
        self.compiled: list[tuple[str, int]] = []
        self.created = 0
        self._lock = threading.Lock()

    def compile(self, shader: ShaderSource, option_bits: int) -> bytes:
        with self._lock:
            self.compiled.append((shader.shader_id, option_bits))
        if self.on_compile is not None:
            self.on_compile(shader)
        return self.inner.compile(shader, option_bits)

    def create_pipeline(self, spirv: bytes, request: PipelineRequest) -> ComputePipeline:
        with self._lock:
            self.created += 1
        if self.on_create is not None:
            self.on_create()
        return self.inner.create_pipeline(spirv, request)

    def open_driver_cache(self, initial_data: bytes) -> None:
        self.inner.open_driver_cache(initial_data)

    def driver_cache_data(self) -> bytes:
        return self.inner.driver_cache_data()

    def close_driver_cache(self) -> None:
        self.inner.close_driver_cache()


OpenCache = Callable[..., PipelineCache]


@pytest.fixture
def open_cache(vulkan_ctx: VulkanContext) -> Iterator[OpenCache]:
    """Open PipelineCaches on the shared context; those still open are closed at teardown."""
    opened: list[PipelineCache] = []

    def open_(directory: Path | None, wrap: Callable[[VulkanPipelineBackend], Any] | None = None
              ) -> PipelineCache:
        backend = VulkanPipelineBackend(vulkan_ctx)
        cache = PipelineCache(backend if wrap is None else wrap(backend), directory)
        opened.append(cache)
        return cache

    yield open_
    for cache in opened:
        cache.close()  # idempotent: a no-op for those the test closed


# ---------------------------------------------------------------- round trip across processes


def test_second_process_compiles_no_glsl_and_builds_the_same_pipelines(
        tmp_path: Path, vulkan_caps: DeviceCaps) -> None:
    cold, _ = run_json(python_child("child_round_trip", tmp_path))
    # every built-in in every mode (counted by the child: others may be adding shaders)
    everything = cold["pipelines"]
    assert everything >= 2 * len(vulkan_caps.supported_precisions())
    assert cold["glsl_compiles"] == everything and cold["saved"] and cold["writer"]
    data = relu_input()
    want = np.where(data >= 0, data, data * RELU_SLOPE)
    np.testing.assert_array_equal(np.array(cold["relu"], np.float32), want)

    warm_run, _ = run_json(python_child("child_round_trip", tmp_path))
    assert warm_run["glsl_compiles"] == 0
    # every built-in pipeline plus the second relu request hit the SPIR-V tier
    assert warm_run["pipelines"] == everything
    assert warm_run["spirv_hits"] == everything
    assert warm_run["relu"] == cold["relu"]
    assert not warm_run["saved"]  # nothing new: the file is left alone

    cli, _ = warm(tmp_path)
    assert (cli["glsl_compiles"], cli["spirv_hits"], cli["pipelines"]) == (0, everything,
                                                                           everything)


def test_a_second_warm_with_nothing_new_leaves_the_file_untouched(tmp_path: Path) -> None:
    first, _ = warm(tmp_path)
    assert first["saved"]
    path = Path(first["file"])
    before = path.stat()
    content = path.read_bytes()
    second, _ = warm(tmp_path)
    assert not second["saved"] and second["glsl_compiles"] == 0
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert path.read_bytes() == content


# ---------------------------------------------------------------- one writer per file


def test_a_second_process_loads_but_does_not_write(
        tmp_path: Path, vulkan_caps: DeviceCaps, open_cache: OpenCache) -> None:
    seed = open_cache(tmp_path)  # a file holding only relu fp32
    seed.pipeline(RELU)
    assert seed.save()
    seed.close()
    path = seed.path
    assert path is not None
    before, content = path.stat(), path.read_bytes()

    holder = subprocess.Popen(python_child("child_hold", tmp_path), cwd=REPO, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert json.loads(holder.stdout.readline()) == {"writer": True}
        result, stderr = warm(tmp_path)
        assert not result["writer"] and not result["saved"]
        assert (result["glsl_compiles"], result["spirv_hits"]) == (result["pipelines"] - 1, 1)
        assert "will load the pipeline cache but not write it" in stderr
        after = path.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert path.read_bytes() == content
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        assert holder.wait(timeout=CHILD_TIMEOUT_S) == 0

    result, _ = warm(tmp_path)  # the holder is gone: this process may write now
    assert result["writer"] and result["saved"]
    contents = decode_cache_file(path.read_bytes(), DeviceIdentity.from_caps(vulkan_caps))
    assert len(contents.spirv) == result["pipelines"]


# ---------------------------------------------------------------- corruption


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory: pytest.TempPathFactory, vulkan_ctx: VulkanContext) -> bytes:
    """A valid file holding relu and clip in fp32 and the driver's (non-empty) blob."""
    directory = tmp_path_factory.mktemp("valid")
    cache = PipelineCache(VulkanPipelineBackend(vulkan_ctx), directory)
    try:
        cache.pipeline(RELU)
        cache.pipeline(PipelineRequest(builtin_shader("clip"), OPTION_BITS[Precision.FP32]))
        assert cache.save()
    finally:
        cache.close()
    assert cache.path is not None
    data = cache.path.read_bytes()
    assert decode_cache_file(data, cache.backend.identity).driver_blob, \
        "the blob-corruption cases need a non-empty driver blob"
    return data


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x40]) + data[offset + 1:]


def _header(data: bytes) -> dict[str, Any]:
    return dict(zip(cache_file._HEADER_FIELDS, cache_file._HEADER.unpack_from(data), strict=True))


def _with_header(data: bytes, **changes: Any) -> bytes:
    """`data` with header fields changed and the header hash recomputed (a "valid" lie)."""
    values = _header(data) | changes
    header = bytearray(cache_file._HEADER.pack(*(values[f] for f in cache_file._HEADER_FIELDS)))
    header[-16:] = hashlib.blake2b(header[:-16], digest_size=16).digest()
    return bytes(header) + data[HEADER_SIZE:]


def _another_device(data: bytes, identity: DeviceIdentity) -> bytes:
    other = dataclasses.replace(identity, device_id=identity.device_id ^ 0x1234)
    return encode_cache_file(other, decode_cache_file(data, identity).spirv, b"")


def _foreign_blob_uuid(data: bytes, identity: DeviceIdentity) -> bytes:
    contents = decode_cache_file(data, identity)
    blob = bytearray(contents.driver_blob)
    blob[16:32] = bytes(16 - i for i in range(16))
    with pytest.MonkeyPatch.context() as mp:  # encode refuses such a blob: write it anyway
        mp.setattr(cache_file, "driver_blob_problem", lambda blob, identity: None)
        return encode_cache_file(identity, contents.spirv, bytes(blob))


def _other_vkserve(data: bytes, identity: DeviceIdentity) -> bytes:
    contents = decode_cache_file(data, identity)
    return encode_cache_file(identity, contents.spirv, contents.driver_blob,
                             vkserve_version="0.0.0-elsewhere")


CORRUPTIONS: dict[str, tuple[Callable[[bytes, DeviceIdentity], bytes], str]] = {
    "truncated": (lambda d, i: d[:-5], "do not add up to the file size"),
    "truncated_into_header": (lambda d, i: d[:HEADER_SIZE // 2], "shorter than the"),
    "flipped_header_byte": (lambda d, i: _flip(d, 48), "header hash mismatch"),
    "flipped_spirv_byte": (lambda d, i: _flip(d, HEADER_SIZE + 100),
                           "SPIR-V section hash mismatch"),
    "flipped_blob_byte": (lambda d, i: _flip(d, len(d) - 1), "driver blob hash mismatch"),
    "wrong_magic": (lambda d, i: b"X" + d[1:], "bad magic"),
    "wrong_format_version": (lambda d, i: _with_header(d, format_version=2), "format version 2"),
    "other_vkserve_version": (_other_vkserve, "another vkserve version"),
    "another_device": (_another_device, "another device: device_id"),
    "foreign_blob_uuid": (_foreign_blob_uuid, "pipelineCacheUUID"),
    "empty": (lambda d, i: b"", "file is empty"),
    "huge_declared_size": (lambda d, i: _with_header(d, spirv_size=1 << 60),
                           "do not add up to the file size"),
}


def _rejected_then_rebuilt(path: Path, open_cache: OpenCache, caplog: pytest.LogCaptureFixture,
                           identity: DeviceIdentity, reason: str) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cache"):
        cache = open_cache(path.parent)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"ignoring pipeline cache file {path}" in warnings[0], warnings
    assert reason in warnings[0]
    assert cache.stats.driver_blob_loaded_bytes == 0
    cache.pipeline(RELU)  # still works: a miss, not an error
    assert (cache.stats.glsl_compiles, cache.stats.spirv_hits) == (1, 0)
    assert cache.save()  # replaced by the next save
    cache.close()
    contents = decode_cache_file(path.read_bytes(), identity)
    assert list(contents.spirv) == [RELU.spirv_key]


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_corrupt_file_is_a_logged_miss_and_is_replaced(
        name: str, tmp_path: Path, vulkan_caps: DeviceCaps, valid_file: bytes,
        open_cache: OpenCache, caplog: pytest.LogCaptureFixture) -> None:
    identity = DeviceIdentity.from_caps(vulkan_caps)
    corrupt, reason = CORRUPTIONS[name]
    path = tmp_path / identity.file_name()
    path.write_bytes(corrupt(valid_file, identity))
    _rejected_then_rebuilt(path, open_cache, caplog, identity, reason)


def test_a_file_over_the_size_limit_is_rejected_unread(
        tmp_path: Path, vulkan_caps: DeviceCaps, valid_file: bytes, open_cache: OpenCache,
        caplog: pytest.LogCaptureFixture) -> None:
    identity = DeviceIdentity.from_caps(vulkan_caps)
    path = tmp_path / identity.file_name()
    path.write_bytes(valid_file)
    os.truncate(path, MAX_FILE_BYTES + 1)  # sparse: costs no disk
    _rejected_then_rebuilt(path, open_cache, caplog, identity, "exceeds the")


def test_the_driver_rejecting_a_checked_blob_starts_an_empty_driver_cache(
        tmp_path: Path, vulkan_caps: DeviceCaps, vulkan_ctx: VulkanContext, valid_file: bytes,
        open_cache: OpenCache, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    identity = DeviceIdentity.from_caps(vulkan_caps)
    path = tmp_path / identity.file_name()
    path.write_bytes(valid_file)
    real_open = VulkanPipelineBackend.open_driver_cache

    def refusing_open(self: VulkanPipelineBackend, initial_data: bytes) -> None:
        if initial_data:
            raise VulkanError("vkCreatePipelineCache", "VK_ERROR_INITIALIZATION_FAILED", -3)
        real_open(self, initial_data)

    monkeypatch.setattr(VulkanPipelineBackend, "open_driver_cache", refusing_open)
    with caplog.at_level(logging.WARNING, logger="cache"):
        cache = open_cache(tmp_path)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "the driver rejected the saved pipeline cache" in warning
    assert "VK_ERROR_INITIALIZATION_FAILED" in warning
    assert cache.stats.driver_blob_loaded_bytes == 0
    data = relu_input()
    result = run_relu(vulkan_ctx, cache.pipeline(RELU), data)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result, np.where(data >= 0, data, data * RELU_SLOPE))
    assert cache.stats.glsl_compiles == 0  # the SPIR-V tier passed every check: still used
    assert cache.save()  # the refused blob is replaced even though no SPIR-V is new
    cache.close()
    decode_cache_file(path.read_bytes(), identity)


# ---------------------------------------------------------------- shader edits


def test_editing_one_shader_recompiles_only_that_shader(
        tmp_path: Path, vulkan_caps: DeviceCaps, open_cache: OpenCache) -> None:
    a = ShaderSource("edit_a", builtin_shader("relu").source)
    b = ShaderSource("edit_b", builtin_shader("clip").source)
    bits = OPTION_BITS[Precision.FP32]
    cache = open_cache(tmp_path, Instrumented)
    for shader in (a, b):
        cache.pipeline(PipelineRequest(shader, bits))
    assert cache.save()
    cache.close()

    edited = ShaderSource("edit_a", a.source + "\n// edited\n")
    cache = open_cache(tmp_path, Instrumented)
    for shader in (edited, b):
        cache.pipeline(PipelineRequest(shader, bits))
    assert cache.backend.compiled == [("edit_a", bits)]  # type: ignore[attr-defined]
    assert (cache.stats.glsl_compiles, cache.stats.spirv_hits) == (1, 1)
    assert cache.save()
    cache.close()
    assert cache.path is not None
    identity = DeviceIdentity.from_caps(vulkan_caps)
    keys = set(decode_cache_file(cache.path.read_bytes(), identity).spirv)
    # the old source's entry is dropped, not kept forever
    assert keys == {SpirvKey("edit_a", bits, edited.source_hash), SpirvKey("edit_b", bits,
                                                                            b.source_hash)}


# ---------------------------------------------------------------- threads

BARRIER_TIMEOUT_S = 15


def test_different_keys_compile_and_create_in_parallel(open_cache: OpenCache,
                                                       vulkan_caps: DeviceCaps) -> None:
    precisions = [Precision.FP32, Precision.FP16_STORAGE]
    assert set(precisions) <= set(vulkan_caps.supported_precisions())
    requests = [PipelineRequest(builtin_shader(s), OPTION_BITS[p])
                for s in ("relu", "clip") for p in precisions]
    # each barrier only opens when every request is inside the call at once: a cache
    # that serialised them would break it (BrokenBarrierError) instead of hanging
    compiling = threading.Barrier(len(requests), timeout=BARRIER_TIMEOUT_S)
    creating = threading.Barrier(len(requests), timeout=BARRIER_TIMEOUT_S)
    cache = open_cache(None, lambda inner: Instrumented(
        inner, on_compile=lambda shader: compiling.wait(), on_create=creating.wait))
    with ThreadPoolExecutor(len(requests)) as pool:
        pipelines = list(pool.map(cache.pipeline, requests))
    assert len({id(p) for p in pipelines}) == len(requests) == cache.pipeline_count
    assert cache.stats.glsl_compiles == cache.stats.pipeline_misses == len(requests)


def _race(count: int, call: Callable[[], Any]) -> list[Any]:
    """Run `call` in `count` threads released at once; each result or exception, in order."""
    start = threading.Barrier(count, timeout=BARRIER_TIMEOUT_S)
    out: list[Any] = [None] * count

    def worker(i: int) -> None:
        start.wait()
        try:
            out[i] = call()
        except RuntimeError as exc:
            out[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=CHILD_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads)
    return out


def test_the_same_key_from_many_threads_builds_once(open_cache: OpenCache) -> None:
    threads = 8
    cache = open_cache(None, lambda inner: Instrumented(
        inner, on_compile=lambda shader: time.sleep(0.3)))  # every thread arrives meanwhile
    results = _race(threads, lambda: cache.pipeline(RELU))
    assert all(r is results[0] for r in results) and isinstance(results[0], ComputePipeline)
    backend = cache.backend
    assert (len(backend.compiled), backend.created) == (1, 1)  # type: ignore[attr-defined]
    assert (cache.stats.pipeline_misses, cache.stats.pipeline_hits) == (1, threads - 1)
    assert cache.stats.glsl_compiles == 1


def test_a_failed_build_reaches_every_waiter_and_a_later_request_retries(
        open_cache: OpenCache) -> None:
    threads = 6
    failing = True

    def on_compile(shader: ShaderSource) -> None:
        time.sleep(0.5)  # every thread arrives and waits on this build
        if failing:
            raise RuntimeError("injected compile failure")

    cache = open_cache(None, lambda inner: Instrumented(inner, on_compile=on_compile))
    results = _race(threads, lambda: cache.pipeline(RELU))
    assert all(isinstance(r, RuntimeError) and "injected" in str(r) for r in results), results
    assert len(cache.backend.compiled) == 1  # type: ignore[attr-defined]
    assert cache.pipeline_count == 0
    failing = False
    assert isinstance(cache.pipeline(RELU), ComputePipeline)
    assert len(cache.backend.compiled) == 2  # type: ignore[attr-defined]


# ---------------------------------------------------------------- counters


def test_counters_of_each_tier(tmp_path: Path, open_cache: OpenCache) -> None:
    cache = open_cache(tmp_path)
    stats = cache.stats
    first = cache.pipeline(RELU)
    assert (stats.pipeline_misses, stats.pipeline_hits, stats.glsl_compiles, stats.spirv_hits) \
        == (1, 0, 1, 0)
    assert stats.compile_seconds > 0 and stats.pipeline_seconds > 0
    assert cache.pipeline(RELU) is first
    assert (stats.pipeline_misses, stats.pipeline_hits) == (1, 1)
    # another local size: a new pipeline from the same SPIR-V
    cache.pipeline(dataclasses.replace(RELU, local_size=(32, 1, 1)))
    assert (stats.pipeline_misses, stats.glsl_compiles, stats.spirv_hits) == (2, 1, 1)
    compile_seconds = stats.compile_seconds
    assert cache.save()
    saved_blob = stats.driver_blob_saved_bytes
    assert saved_blob > 0
    cache.close()

    cache = open_cache(tmp_path)
    stats = cache.stats
    assert stats.driver_blob_loaded_bytes == saved_blob
    cache.pipeline(RELU)
    assert (stats.pipeline_misses, stats.glsl_compiles, stats.spirv_hits) == (1, 0, 1)
    assert stats.compile_seconds == 0.0 < compile_seconds
    assert set(stats.as_dict()) >= {"pipeline_hits", "pipeline_misses", "spirv_hits",
                                    "glsl_compiles", "compile_seconds", "pipeline_seconds",
                                    "driver_blob_loaded_bytes", "driver_blob_saved_bytes"}
