"""`vkserve cache warm|inspect|clear`: manage the per-device pipeline cache files."""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vkserve.cache.cache_file import inspect_cache_file
from vkserve.cache.persist import WriterLock, default_cache_dir
from vkserve.cli.commands._device import device_arg
from vkserve.cli.output import CommandFailed, print_json
from vkserve.cli.progress import Progress
from vkserve.devices.capabilities import DeviceCaps, DeviceKind, Precision
from vkserve.devices.cpu.warm import compile_kernels
from vkserve.devices.discovery import discover_devices
from vkserve.devices.names import CPU, DeviceName, device_name
from vkserve.devices.vulkan.engine import DeviceNotFound, find_vulkan_device

NAME = "cache"
HELP = "build, inspect or clear the per-device pipeline cache files"
log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    warm = sub.add_parser("warm", help="build every built-in shader in every supported mode and "
                                       "compile the CPU kernels for this machine, then save")
    warm.add_argument("--cache-dir", type=Path, default=None,
                      help="cache folder (default: $CACHE_DIRECTORY or $XDG_CACHE_HOME/vkserve)")
    warm.add_argument("--device", type=device_arg, default=None, metavar="DEVICE",
                      help="only this device: vulkan:N or N (its pipelines), or cpu (the CPU "
                           "kernels); default: every device")
    warm.add_argument("--json", action="store_true", help="print a JSON list, one entry a device")
    inspect = sub.add_parser("inspect", help="print a cache file's header, entries and validity")
    inspect.add_argument("file", type=Path)
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    clear = sub.add_parser("clear", help="delete the cache files (not those in use)")
    clear.add_argument("--cache-dir", type=Path, default=None)
    clear.add_argument("--json", action="store_true",
                       help="print {cache_dir, removed, in_use} as JSON")


def main(args: argparse.Namespace) -> int:
    return {"warm": warm, "inspect": inspect, "clear": clear}[args.cache_command](args)


def _vulkan_devices(only: DeviceName | None) -> list[DeviceCaps]:
    if only is None:
        return [d for d in discover_devices() if d.kind is DeviceKind.VULKAN]
    if only.is_cpu:
        return []
    try:
        return [find_vulkan_device(only.index)]
    except DeviceNotFound as exc:
        raise CommandFailed.usage(str(exc)) from None


def warm_device(caps: DeviceCaps, cache_dir: Path, progress: Progress) -> dict[str, Any]:
    from vkserve.devices.vulkan.device import VulkanDevice  # noqa: PLC0415 (needs Vulkan)
    from vkserve.devices.vulkan.shader_registry import buildable, builtin_shader_ids  # noqa: PLC0415

    name = device_name(caps.kind, caps.index)
    t0 = time.perf_counter()
    with VulkanDevice(caps, cache_dir) as dev:
        jobs = [(s, p) for s in builtin_shader_ids() for p in caps.supported_precisions()
                if buildable(s, caps, p)]
        progress.stage(f"building {len(jobs)} pipelines on {name} ({caps.name})")
        finished = itertools.count(1)

        def build(job: tuple[str, Precision]) -> None:
            dev.pipeline(*job)
            progress(next(finished), len(jobs), f"{job[0]} {job[1].value}")

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(build, jobs))
        saved = dev.pipelines.save()
        stats = dev.pipelines.stats
        result = {
            "device": name,
            "device_name": caps.name,
            "file": str(dev.pipelines.path),
            "saved": saved,
            "writer": dev.pipelines.writable,
            "pipelines": dev.pipelines.pipeline_count,
            "glsl_compiles": stats.glsl_compiles,
            "spirv_hits": stats.spirv_hits,
            "driver_blob_bytes": stats.driver_blob_saved_bytes or stats.driver_blob_loaded_bytes,
            "compile_seconds": round(stats.compile_seconds, 4),
            "pipeline_seconds": round(stats.pipeline_seconds, 4),
        }
    result["seconds"] = round(time.perf_counter() - t0, 4)
    return result


def warm(args: argparse.Namespace) -> int:
    cache_dir = args.cache_dir or default_cache_dir()
    with Progress("cache warm", quiet=args.json) as progress:
        results = [warm_device(caps, cache_dir, progress) for caps in _vulkan_devices(args.device)]
        cpu = None
        if args.device is None or args.device.is_cpu:
            progress.stage("compiling the CPU kernels for this machine (or loading them from "
                           "numba's cache)")
            cpu = compile_kernels()
            results.append({"device": CPU, **cpu.as_json()})
        progress.done(f"{len(results)} device(s) warm")
    if args.json:
        print_json(results, indent=2)
        return 0
    for r in results:
        if r["device"] == CPU:
            continue
        print(f"{r['device']} ({r['device_name']}): {r['pipelines']} pipelines, "
              f"{r['glsl_compiles']} GLSL compiles, {r['spirv_hits']} SPIR-V hits, "
              f"driver blob {r['driver_blob_bytes']} bytes, {r['seconds']:.2f} s"
              f" -> {r['file']}{'' if r['saved'] else ' (unchanged, not written)'}")
    if cpu is not None:
        print(f"cpu: {cpu.describe()}")
    elif not results:
        print("no Vulkan device: nothing to warm")
    return 0


def inspect(args: argparse.Namespace) -> int:
    try:
        data = args.file.read_bytes()
    except OSError as exc:
        raise CommandFailed.usage(f"cannot read {args.file}: {exc.strerror}") from None
    info = inspect_cache_file(data)
    blob = info.pop("driver_blob")
    info["driver_blob_bytes"] = None if blob is None else len(blob)
    info["file"] = str(args.file)
    if args.json:
        print_json(info, indent=2)
    else:
        print(f"{args.file}: {'valid' if info['valid'] else 'INVALID: ' + info['reason']}")
        print(f"  size {info['size']} bytes, driver blob {info['driver_blob_bytes']} bytes")
        for key, value in (info["header"] or {}).items():
            print(f"  {key:24} {value}")
        for e in info["entries"]:
            print(f"  spirv {e['shader_id']:24} bits={e['option_bits']:#05b} "
                  f"{e['spirv_bytes']:7} bytes source {e['source_hash'][:16]}")
    return 0 if info["valid"] else 1


def clear(args: argparse.Namespace) -> int:
    cache_dir = args.cache_dir or default_cache_dir()
    removed: list[str] = []
    busy: list[str] = []
    for path in sorted(cache_dir.glob("vkserve-*.cache")):
        lock = WriterLock(path)
        if not lock.acquire():
            busy.append(str(path))
            continue
        with lock:
            path.unlink()
        removed.append(str(path))
    if args.json:
        print_json({"cache_dir": str(cache_dir), "removed": removed, "in_use": busy}, indent=2)
    else:
        for path_text in busy:
            print(f"in use by a running vkserve, kept: {path_text}")
        for path_text in removed:
            print(f"removed {path_text}")
        print(f"{len(removed)} cache file(s) removed from {cache_dir}")
    return 1 if busy else 0
