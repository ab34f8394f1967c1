"""Host memory a device may read in place: the shared-memory regions the daemon maps for its
clients (``vkserve.daemon.shm``).

The model is CUDA's host registration: the owner of a mapping registers it once; an engine
handed an array asks ``find`` whether the array lies inside a registered region and, where it
does and the device can import host memory (``VK_EXT_external_memory_host``), reads the bytes
from there instead of copying them into its staging buffer first. The owner retires a region
when it lets the mapping go; engines that imported it hear of it (``on_retire``) and free their
imports once no run reads them. A region keeps its mapping alive for as long as any engine
holds it, so the pages a GPU reads are never unmapped under it.
"""

from __future__ import annotations

import bisect
import dataclasses
import mmap
import threading
from collections.abc import Callable

import numpy as np

__all__ = ["HostRegion", "HostRegions", "REGIONS"]


@dataclasses.dataclass(eq=False)
class HostRegion:
    """One registered mapping: ``size`` bytes from ``address``."""

    mapping: mmap.mmap
    address: int
    size: int
    retired: bool = False


class HostRegions:
    """The process's registered regions, looked up by address (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []  # sorted region addresses
        self._regions: list[HostRegion] = []  # in the same order
        self._listeners: list[Callable[[HostRegion], None]] = []

    def register(self, mapping: mmap.mmap) -> HostRegion:
        """Register the whole of ``mapping``."""
        address = np.frombuffer(mapping, dtype=np.uint8).__array_interface__["data"][0]
        region = HostRegion(mapping, address, len(mapping))
        with self._lock:
            i = bisect.bisect(self._starts, address)
            self._starts.insert(i, address)
            self._regions.insert(i, region)
        return region

    def retire(self, region: HostRegion) -> None:
        """The owner lets ``region`` go: no array is found in it any more, and every listener
        hears of it (they free what they imported from it)."""
        with self._lock:
            if region.retired:
                return
            region.retired = True
            i = self._regions.index(region)
            del self._starts[i], self._regions[i]
            listeners = list(self._listeners)
        for listener in listeners:
            listener(region)

    def find(self, array: np.ndarray) -> tuple[HostRegion, int] | None:
        """The region holding every byte of the C-contiguous ``array`` and the offset of its
        first byte there; None for an array anywhere else."""
        if not array.flags.c_contiguous:
            return None
        address = array.__array_interface__["data"][0]
        with self._lock:
            i = bisect.bisect(self._starts, address) - 1
            if i < 0:
                return None
            region = self._regions[i]
        offset = address - region.address
        if offset + array.nbytes > region.size:
            return None
        return region, offset

    def on_retire(self, listener: Callable[[HostRegion], None]) -> None:
        """Call ``listener`` with each region retired from now on."""
        with self._lock:
            self._listeners.append(listener)

    def forget(self, listener: Callable[[HostRegion], None]) -> None:
        """Stop calling ``listener`` (its engine closed)."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


#: the process's registry: the daemon registers its clients' regions here, engines look there
REGIONS = HostRegions()
