"""The vector width the CPU kernels are compiled for, and the GEMM register tile that goes with it.

LLVM compiles for Intel's AVX-512 server cores with 256-bit vectors unless told otherwise (its
``prefer-256-bit`` tuning, meant to spare the clock drops of the first AVX-512 generations), so
numba's kernels used half of such a core's vector width. On a host with AVX-512F this package
compiles with ``-prefer-256-bit`` and a GEMM register tile of 8 rows x 16 pixels (eight 512-bit
accumulators; 4 rows would leave the FMA units waiting on their latency); elsewhere (AVX2, NEON)
the tile stays 4 x 16 (eight 256-bit registers, the most that fit beside the operands in 16).

Measured on the GPU machine's 16-core Xeon (AVX-512 BF16/AMX), `benchmarks/cpu_scaling.py`,
median of 5 runs, both in one call: resnet50 74.2 -> 56.3 ms on 4 threads (33.5 -> 27.6 on 16),
vgg16 111.6 -> 89.4 ms (42.4 -> 38.9), mobilenet_v2 12.2 -> 12.5 ms (6.5 -> 7.1: its 1x1
layers gain, its depthwise and first layers do not).

On AMD cores with AVX-512 BF16 (``znver4`` and later) the GEMM convolution multiplies bf16 pairs
with ``vdpbf16ps`` (``jit.bf16dot``) instead of widening both operands to fp32: there the
instruction does twice an FMA's multiply-adds at the FMA's rate. Not on Intel's: measured on the
GPU machine's Sapphire Rapids Xeon (one core, register tiles of 256-deep sums), the pair
products ran at 59-83 GFLOP/s by tile shape, 61.5 for the 8 x 32 tile used, against 83 for the
fp32 kernel (the instruction issues on one port where FMAs issue on two), and whole models at 4
threads took 0.96-1.50x the fp32 kernel's time, 10 of 12 longer (RESULTS.md); on the 2-core Zen 4
box 202 against 113 GFLOP/s.

On Intel cores with AMX (``+amx-tile``, ``+amx-bf16``: Sapphire Rapids and later) the
convolutions multiply on AMX tiles (``jit.amx``, ``jit.implicit``), some 20x the fp32 kernel's
rate: used where Linux grants the process the tile registers (``request_tiles``, asked here,
before any kernel compiles) and ``VKSERVE_CPU_AMX`` is not ``0``.

An explicit ``NUMBA_CPU_FEATURES`` wins: the tile is then 8 rows only if it holds both
``+avx512f`` and ``-prefer-256-bit``, the bf16 products are used only if it also holds
``+avx512bf16`` (on an AMD core: the host's, or ``NUMBA_CPU_NAME``), AMX only if it holds the
AMX features.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import logging
import os
import platform
from collections.abc import Callable, Mapping

from llvmlite.binding import get_host_cpu_name
from numba.core.codegen import get_host_cpu_features

__all__ = ["SETTINGS", "VectorSettings", "choose", "request_tiles"]

log = logging.getLogger(__name__)

WIDE = "-prefer-256-bit"
BF16 = "+avx512bf16"
#: LLVM names of the CPUs whose vdpbf16ps beats fp32 FMAs (AMD Zen 4 and later)
FAST_BF16_CPUS = ("znver",)
#: LLVM features of AMX with bf16 tiles
AMX = {"+amx-tile", "+amx-bf16"}
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@dataclasses.dataclass(frozen=True)
class VectorSettings:
    features: str | None  # numba's target features to set (None: leave numba's choice)
    tile_rows: int  # the GEMM micro kernel's rows (``jit.conv.MR``)
    vector_bits: int  # the widest vectors the kernels are compiled to use
    bf16_dot: bool  # AVX-512 BF16 pair products in the GEMM convolution (``jit.bf16dot``)
    amx: bool = False  # AMX tiles for the GEMM convolution's product (``jit.amx``)


def _flags(features: str) -> set[str]:
    return set(features.split(","))


def _bits(flags: set[str]) -> int:
    if "+avx512f" in flags and WIDE in flags:
        return 512
    return 256 if "+avx" in flags else 128  # AVX2 / AVX; else SSE or NEON


def _pair_products(flags: set[str], bits: int, cpu_name: str) -> bool:
    return bits == 512 and BF16 in flags and cpu_name.startswith(FAST_BF16_CPUS)


def request_tiles() -> bool:
    """Ask Linux for this process's use of the AMX tile registers (``arch_prctl``
    ARCH_REQ_XCOMP_PERM, XTILEDATA); whether it was granted."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0:
        return True
    err = ctypes.get_errno()
    log.warning("CPU kernels: the OS refused the AMX tile registers (arch_prctl: %s, %s): the convolutions "
                "multiply in fp32 instead", errno.errorcode.get(err, err), os.strerror(err))
    return False


def _tiles(flags: set[str], bits: int, env: Mapping[str, str], permit: Callable[[], bool]) -> bool:
    return bits == 512 and AMX <= flags and env.get("VKSERVE_CPU_AMX", "1") != "0" and permit()


def choose(host_features: str, host_name: str, env: Mapping[str, str],
           permit: Callable[[], bool] = request_tiles) -> VectorSettings:
    """From the host's LLVM feature string (``+avx2,-avx512f,...``), its LLVM CPU name
    (``znver4``, ``sapphirerapids``, ...) and the environment; ``permit`` asks the OS for the
    AMX tiles, where they would be used."""
    cpu_name = env.get("NUMBA_CPU_NAME") or host_name
    explicit = env.get("NUMBA_CPU_FEATURES")
    if explicit is not None:
        flags = _flags(explicit)
        bits = _bits(flags)
        dot = _pair_products(flags, bits, cpu_name)
        return VectorSettings(None, 8 if bits == 512 else 4, bits, dot, not dot and _tiles(flags, bits, env, permit))
    flags = _flags(host_features)
    if "+avx512f" in flags:
        dot = _pair_products(flags, 512, cpu_name)
        return VectorSettings(f"{host_features},{WIDE}", 8, 512, dot, not dot and _tiles(flags, 512, env, permit))
    return VectorSettings(None, 4, _bits(flags), False)


#: this process's choice (``vkserve.devices.cpu.jit`` hands its features to numba before any
#: kernel compiles)
SETTINGS = choose(get_host_cpu_features(), get_host_cpu_name(), os.environ)
