"""Compile the CPU engine's kernels for this machine before the first job needs them.

numba compiles each kernel at its first call (about 2 minutes for all of them on a 2-core box) and
keeps the result in its cache folder (``vkserve.devices.cpu.jit``), from where later processes
load it in well under a second. ``compile_kernels`` runs a small built-in net through every
kernel path once: `vkserve cache warm` calls it, and the daemon's child process on a first
start (``vkserve.devices.cpu.compile_child``), so no model's load pays the compilation. A stamp
beside numba's cache says whether this machine's kernels are all there (``kernels_cached``);
where they are, the daemon loads none at start, each model's warm-up loading those it runs
(``scheduler.engine.prepare_device``). Once they are loaded, the JIT compiler's pages leave the
process's resident memory (``jit.residency``): running the kernels reads none of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from types import ModuleType

import numpy as np

from vkserve.cache.persist import atomic_write, describe_os_error
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.cpu.jit import (
    VECTORS,
    Dispatcher,
    amx,
    attention,
    bf16dot,
    conv,
    direct,
    dwblocks,
    dwrows,
    elementwise,
    epilogue,
    implicit,
    implicit_pairs,
    innerproduct,
    interp,
    linear,
    lrn,
    nms,
    norm,
    pinning,
    pooling,
    poolrows,
    winograd,
)
from vkserve.devices.cpu.jit.residency import release_compiler_pages
from vkserve.devices.cpu.kernel_cache import kernel_sources, sources_key, stale_folders
from vkserve.models.graph import build_graph, parse_param_text
from vkserve.models.randinit import random_weights

__all__ = ["KERNEL_MODULES", "WarmReport", "compile_kernels", "kernels_cached"]

log = logging.getLogger(__name__)

#: the modules of the compiled (cached) kernels
KERNEL_MODULES = (amx, attention, bf16dot, conv, direct, dwblocks, dwrows, elementwise, epilogue, implicit,
                  implicit_pairs, innerproduct, interp, linear, lrn, nms, norm, pinning, pooling, poolrows,
                  winograd)

#: dense 3x3 (direct, Winograd, from the input's planes where this host has those kernels) and
#: 1x1 convolutions (a strided one decimating its input, on the hosts where it does),
#: depthwise at strides 1 and 2 (row runs where this host has them, the planes,
#: a small map's channel blocks; dilated), grouped,
#: windowed max and average and global average pooling, LRN across channels, BatchNorm, bilinear Interp,
#: LayerNorm, InnerProduct, a Linear Gemm, self- and cross-attention, MatMul, element-wise (Eltwise, BinaryOp, an activation on its own),
#: Softmax, fused activations; the detection layers' NMS is called on its own
_NET = """7767517
36 40
Input data 0 1 data 0=24 1=24 2=4
Convolution conv3 1 1 data a 0=128 1=3 4=1 5=1 6=4608 9=1
Convolution wino 1 1 a a1 0=16 1=3 4=1 5=1 6=18432 9=1
Convolution planes 1 1 a1 a2 0=16 1=3 4=1 5=1 6=2304
Convolution conv1s2 1 1 a2 a3 0=16 1=1 3=2 13=1 5=1 6=256
Interp nearest 1 1 a3 a4 0=1 1=1.0 2=2.0
ConvolutionDepthWise dw1 1 1 a4 b 0=16 1=3 4=1 5=1 6=144 7=16 9=2 -23310=1,0.1
ConvolutionDepthWise dw2 1 1 b c 0=16 1=3 3=2 4=1 5=1 6=144 7=16
ConvolutionDepthWise dw5 1 1 c c5 0=16 1=5 4=2 5=1 6=400 7=16
ConvolutionDepthWise dw7 1 1 c5 c7 0=16 1=7 4=3 5=1 6=784 7=16
ConvolutionDepthWise dwd 1 1 c7 c9 0=16 1=3 2=2 4=2 5=1 6=144 7=16
Convolution conv1 1 1 c9 d 0=8 1=1 5=1 6=128 9=6 -23310=2,0.2,0.5
ConvolutionDepthWise group 1 1 d e 0=8 1=3 4=1 5=1 6=144 7=4
Split split 1 3 e e1 e2 e5
HardSigmoid hs 1 1 e5 h
Eltwise sum 2 1 e1 e2 e3 0=1
BinaryOp mul 2 1 e3 h e4a 0=2
BinaryOp scale 1 1 e4a e4 0=2 1=1 2=0.5
Pooling maxpool 1 1 e4 e6 0=0 1=3 2=1 3=1
Pooling pool 1 1 e6 f 0=1 1=2 2=2
LRN lrn 1 1 f f2 0=0 1=3
BatchNorm bn 1 1 f2 f3 0=8
ReLU bnrelu 1 1 f3 f4
Interp up 1 1 f4 f5 0=2 1=2.0 2=2.0
GELU gelu 1 1 f5 f6
LayerNorm ln 1 1 f6 f7 0=12 1=1e-05
Pooling gap 1 1 f7 g 0=1 4=1
InnerProduct fc 1 1 g fc 0=4 1=1 2=32 9=4
Reshape pair 1 1 fc fc2 0=2 1=2
Gemm lin 1 1 fc2 lin 10=4 2=0 3=1 4=0 5=1 6=1 7=2 8=4 9=2
MultiHeadAttention self 1 1 lin s1 0=4 1=2 2=16
Split sp2 1 2 s1 s2 s3
MultiHeadAttention cross 2 1 s2 s3 att 0=4 1=2 2=16
Split sp3 1 2 att t1 t2
MatMul mm 2 1 t1 t2 scores 0=1
Softmax prob 1 1 scores out 0=1 1=1
"""


@dataclasses.dataclass(frozen=True)
class WarmReport:
    seconds: float
    compiled: int  # kernel specializations compiled now (not in the cache yet)
    cached: int  # loaded from the cache
    cache_dir: str
    vector_bits: int  # the widest vectors the kernels are compiled to use (``jit.vectors``)
    bf16_dot: bool  # the GEMM convolution multiplies bf16 pairs (AVX-512 BF16; ``jit.bf16dot``)
    amx: bool = False  # the GEMM convolution multiplies on AMX tiles (``jit.amx``)

    def describe(self) -> str:
        dot = ", bf16 dot products" if self.bf16_dot else ", AMX tiles" if self.amx else ""
        return (f"CPU kernels ready in {self.seconds:.1f} s: {self.compiled} compiled for this CPU "
                f"(up to {self.vector_bits}-bit vectors{dot}), {self.cached} loaded from the cache "
                f"({self.cache_dir})")

    def as_json(self) -> dict[str, object]:
        """The fields as `vkserve cache warm --json` prints them."""
        return {"kernels_compiled": self.compiled, "kernels_cached": self.cached,
                "seconds": self.seconds, "cache_dir": self.cache_dir,
                "vector_bits": self.vector_bits, "bf16_dot": self.bf16_dot, "amx": self.amx}

    @classmethod
    def from_json(cls, entry: dict[str, object]) -> WarmReport:
        """Inverse of ``as_json``; KeyError / TypeError / ValueError on anything else."""
        return cls(float(entry["seconds"]), int(entry["kernels_compiled"]),  # type: ignore[arg-type]
                   int(entry["kernels_cached"]), str(entry["cache_dir"]),  # type: ignore[arg-type]
                   int(entry["vector_bits"]), bool(entry["bf16_dot"]),  # type: ignore[arg-type]
                   bool(entry.get("amx", False)))


def _dispatchers(modules: tuple[ModuleType, ...]) -> list[Dispatcher]:
    return [obj for module in modules for obj in vars(module).values() if isinstance(obj, Dispatcher)]


def _counts(dispatchers: list[Dispatcher]) -> tuple[int, int]:
    """(cache misses, cache hits) so far, over every cached kernel."""
    misses = sum(sum(d.stats.cache_misses.values()) for d in dispatchers)
    hits = sum(sum(d.stats.cache_hits.values()) for d in dispatchers)
    return misses, hits


#: written beside numba's cache once ``compile_kernels`` has run: the key of what it compiled
_STAMP = "vkserve-kernels.stamp"


def _kernels_key() -> str:
    """What numba's cache entries of the kernels depend on: its version, the CPU and features
    its code generator targets, the GEMM tile's rows, the kernel modules' sources and each one's
    file (numba keys an entry on its source file's time and size; the stamp takes every module,
    since a kernel inlines other modules' functions). The same in the daemon and its compiling
    child, which sees the daemon's features as an explicit NUMBA_CPU_FEATURES."""
    # numba through the jit package alone, which turns its failure to load into JitUnavailable
    from vkserve.devices.cpu.jit import numba  # noqa: PLC0415

    parts = [numba.__version__, repr(numba.core.registry.cpu_target.target_context.codegen().magic_tuple()),
             f"tile rows {VECTORS.tile_rows}", f"bf16 dot {VECTORS.bf16_dot}", f"amx {VECTORS.amx}", f"sources {sources_key()}"]
    for source in kernel_sources():
        info = source.stat()
        parts.append(f"{source}:{info.st_mtime_ns}:{info.st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _stamp_path() -> Path:
    return Path(os.environ["NUMBA_CACHE_DIR"]) / _STAMP


def kernels_cached() -> bool:
    """Whether ``compile_kernels`` has run for these kernels on this machine and numba's cache
    holds them (unless removed since: then ``compile_kernels`` compiles them again)."""
    try:
        return _stamp_path().read_text() == _kernels_key()
    except OSError:  # no stamp yet (a first start), or an unreadable one: not known to be there
        return False


def _remove_stale(numba_dir: Path) -> None:
    """Once this version's kernels are in: the folders other sources' kernels left beside them
    (``kernel_cache.stale_folders``), so upgrades do not pile them up."""
    stale = stale_folders(numba_dir)
    for entry in stale:
        try:
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
        except OSError as exc:  # another user's files, or a read-only folder: they stay
            log.warning("CPU kernels: cannot remove %s (%s)", exc.filename or entry, describe_os_error(exc))
    if stale:
        log.info("CPU kernels: removed what other versions of the kernels left in %s: %s",
                 numba_dir.parent, ", ".join(entry.name for entry in stale))


def compile_kernels() -> WarmReport:
    """Blocking (a worker thread in the daemon): compile or load every kernel once."""
    start = time.perf_counter()
    kernels = _dispatchers(KERNEL_MODULES)
    misses, hits = _counts(kernels)
    layers = parse_param_text(_NET, "warm-up net")
    for layer, weights in zip(layers, random_weights(layers, 0)):
        layer.weights = weights
    graph = build_graph(layers, "warm-up net")
    plan = Plan(graph)
    data = np.random.default_rng(0).standard_normal((4, 24, 24)).astype(np.float32)
    plan.run({"data": data})
    # the daemon's inputs are read-only (views of a request's bytes or of shared memory), and
    # numba compiles a read-only array apart: the kernel narrowing the inputs too (2.4 s)
    data.flags.writeable = False
    plan.run({"data": data})
    nms.nms_sorted(np.array([[0, 0, 1, 1], [0, 0, 1, 1]], np.float32), np.float32(0.45), False)  # YOLOv3 detection
    new_misses, new_hits = _counts(kernels)
    release_compiler_pages()  # every kernel is loaded: running them reads none of LLVM's pages
    try:
        if not kernels_cached():  # a warm start (the daemon checked just before) writes nothing
            atomic_write(_stamp_path(), _kernels_key().encode())
            _remove_stale(Path(os.environ["NUMBA_CACHE_DIR"]))
    except OSError as exc:  # numba's cache folder read-only or missing: the next start compiles apart again
        log.warning("CPU kernels: cannot write %s (%s): the next start compiles them again",
                    _stamp_path(), describe_os_error(exc))
    return WarmReport(time.perf_counter() - start, new_misses - misses, new_hits - hits,
                      os.environ.get("NUMBA_CACHE_DIR", ""), VECTORS.vector_bits, VECTORS.bf16_dot, VECTORS.amx)
