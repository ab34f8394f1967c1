"""Where the CPU engine's compiled kernels are kept on disk, and what makes them stale.

numba checks a cached kernel against its own source file only (time and size), while a kernel
inlines functions from the other modules of ``vkserve.devices.cpu.jit``: after an upgrade that
changes only such a helper, numba would load the kernel compiled with the old one. So the
default folder is named by a hash of every kernel module's source (``sources_key``): a changed
module starts a new folder, and the daemon's first start after it compiles the kernels again
(``vkserve.devices.cpu.warm``), then removes the folders of other sources
(``stale_folders``).

Kept apart from the ``jit`` package, which imports numba: this module reads files only, and the
package sets ``NUMBA_CACHE_DIR`` from it before numba loads.
"""

import hashlib
import re
from functools import cache
from pathlib import Path

from vkserve.cache.persist import default_cache_dir

__all__ = ["default_numba_dir", "kernel_sources", "sources_key", "stale_folders"]

#: the kernels' modules: every source file of this folder is part of the key
_JIT_SOURCES = Path(__file__).parent / "jit"

#: a key folder's name: ``sources_key``'s form
_KEY_NAME = re.compile(r"[0-9a-f]{16}")


def kernel_sources() -> list[Path]:
    """The kernel modules' files."""
    return sorted(_JIT_SOURCES.glob("*.py"))


@cache
def sources_key() -> str:
    """A hash of the kernel modules' contents (not their times: an unchanged module reinstalled
    keeps its key)."""
    digest = hashlib.sha256()
    for source in kernel_sources():
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _numba_root() -> Path:
    return default_cache_dir() / "numba"


def default_numba_dir() -> Path:
    """``numba/<sources_key>`` in vkserve's cache folder (``default_cache_dir``)."""
    return _numba_root() / sources_key()


def stale_folders(numba_dir: Path) -> list[Path]:
    """The folders of kernels compiled from other sources beside ``numba_dir``, when it is the
    default one (an explicit ``NUMBA_CACHE_DIR`` is its owner's to manage): key folders of
    other keys, and what earlier versions kept in ``numba/`` itself (numba's ``jit_*`` folders
    and their stamp)."""
    root = _numba_root()
    if numba_dir != default_numba_dir() or not root.is_dir():
        return []
    return sorted(entry for entry in root.iterdir() if entry != numba_dir and (
        (_KEY_NAME.fullmatch(entry.name) and entry.is_dir())
        or entry.name.startswith("jit_") or entry.name == "vkserve-kernels.stamp"))
