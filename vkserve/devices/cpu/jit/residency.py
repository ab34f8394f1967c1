"""Taking the JIT compiler's pages out of this process's resident memory once the kernels are loaded.

Loading llvmlite's library (LLVM: 179 MB, 80 of code and 59 of read-only data) maps ~100 MiB
of it into the process: its static initializers are spread through it, and each page fault
maps the pages around it (RESULTS.md, thirtieth session). Running the compiled kernels reads
none of those pages; only compiling a kernel, or linking one loaded from numba's cache, does.
They are clean pages of a file, so ``madvise(MADV_PAGEOUT)`` (Linux 5.4 and later) takes them
out of the resident set, and out of memory altogether where no other process maps them: the
resident memory an operator sees (``process_resident_memory_bytes``) and a cgroup's memory
limit counts drop by that much, and a later compile faults back what it reads. Pages that
another process maps too (a second vkserve process, say) stay: the kernel leaves those, and they
are in memory once for both. The peak (``ru_maxrss``) keeps the import's moment.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys

from llvmlite.binding.ffi import get_library_name

__all__ = ["compiler_mappings", "release_compiler_pages"]

log = logging.getLogger(__name__)

MADV_PAGEOUT = 21


def compiler_mappings(maps: str = "/proc/self/maps") -> list[tuple[int, int]]:
    """The (start, end) addresses of this process's mappings of llvmlite's library."""
    name = get_library_name()
    found = []
    with open(maps) as lines:
        for line in lines:
            fields = line.split()
            if len(fields) >= 6 and os.path.basename(fields[5]) == name:
                start, end = (int(a, 16) for a in fields[0].split("-"))
                found.append((start, end))
    return found


def release_compiler_pages() -> int:
    """Advise the kernel to page out llvmlite's mappings; the bytes advised (0 off Linux, or
    where the kernel refuses: then logged, nothing else changes)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    for start, end in compiler_mappings():
        if libc.madvise(start, end - start, MADV_PAGEOUT) != 0:
            code = ctypes.get_errno()
            log.info("CPU kernels: the JIT compiler's pages stay resident: madvise(MADV_PAGEOUT) "
                     "failed with %s (%s)", errno.errorcode.get(code, code), os.strerror(code))
            return advised
        advised += end - start
    log.debug("CPU kernels: %.0f MiB of the JIT compiler's mappings paged out", advised / 2**20)
    return advised
