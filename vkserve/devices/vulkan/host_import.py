"""Clients' shared-memory regions imported into one Vulkan device (VK_EXT_external_memory_host).

A Plan instance given an input that lies in a registered region (``vkserve.devices.host_regions``)
binds the imported region where it would bind its staging buffer, so the GPU reads the client's
pages and nothing copies the input on the host. A region is imported on a run's first use of it
and freed once it is retired and no run reads it; a region the device cannot import (its address
or size off the device's alignment, or the driver refuses: logged once per region with the
VkResult) is read by copying, as on a device without the extension.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Iterable, Mapping

from vkserve.devices.host_regions import REGIONS, HostRegion
from vkserve.devices.vulkan.context import Buffer, VulkanContext
from vkserve.devices.vulkan.errors import VulkanError

__all__ = ["HostImports", "ImportedRegion"]

log = logging.getLogger(__name__)


class ImportedRegion:
    """One region's pages as a buffer of the device. ``alive`` turns False when it is freed
    (command buffers recorded over it must not be submitted again)."""

    def __init__(self, region: HostRegion, buffer: Buffer) -> None:
        self.region = region
        self.buffer = buffer
        self.users = 0  # runs in flight that read it
        self.alive = True


class HostImports:
    """The regions one device has imported (thread-safe: runs acquire and release them from
    worker threads, retirement comes from the daemon's event loop)."""

    def __init__(self, ctx: VulkanContext, env: Mapping[str, str] = os.environ) -> None:
        self.ctx = ctx
        #: 0 where the device cannot import host memory (or ``VKSERVE_HOST_IMPORT=0`` says not
        #: to): every ``acquire`` answers None
        self.alignment = ctx.host_import_alignment if env.get("VKSERVE_HOST_IMPORT", "1") != "0" else 0
        self._lock = threading.Lock()
        self._imports: dict[HostRegion, ImportedRegion] = {}
        self._refused: set[HostRegion] = set()
        if self.alignment:
            REGIONS.on_retire(self._retired)
        else:
            why = ("VKSERVE_HOST_IMPORT=0" if ctx.host_import_alignment
                   else "no VK_EXT_external_memory_host")
            log.info("device %d (%s): %s; inputs in clients' shared memory are copied into "
                     "staging", ctx.caps.index, ctx.caps.name, why)

    def acquire(self, region: HostRegion) -> ImportedRegion | None:
        """``region`` imported (on first use), held for one run until ``release``; None when
        the device cannot read it in place."""
        if not self.alignment:
            return None
        with self._lock:
            if region.retired or region in self._refused:
                return None
            imported = self._imports.get(region)
            if imported is None:
                imported = self._import(region)
                if imported is None:
                    self._refused.add(region)
                    return None
                self._imports[region] = imported
            imported.users += 1
            return imported

    def _import(self, region: HostRegion) -> ImportedRegion | None:
        align = self.alignment
        size = -(-region.size // align) * align
        # the mapping covers whole pages: a size rounded up within its last page stays mapped
        mapped = -(-region.size // mmap.PAGESIZE) * mmap.PAGESIZE
        if region.address % align or size > mapped:
            log.warning("device %d: a shared-memory region of %d bytes at %#x is off the import "
                        "alignment (%d bytes); its inputs are copied", self.ctx.caps.index,
                        region.size, region.address, align)
            return None
        try:
            return ImportedRegion(region, self.ctx.import_host(region.address, size))
        except VulkanError as e:
            log.warning("device %d: importing a shared-memory region of %d bytes failed (%s); its "
                        "inputs are copied", self.ctx.caps.index, region.size, e)
            return None

    def release(self, imports: Iterable[ImportedRegion]) -> None:
        """A run that read ``imports`` is over: free those retired meanwhile."""
        with self._lock:
            for imported in imports:
                imported.users -= 1
                if not imported.users and imported.region.retired:
                    self._free(imported)

    def _retired(self, region: HostRegion) -> None:
        with self._lock:
            self._refused.discard(region)
            imported = self._imports.get(region)
            if imported is not None and not imported.users:
                self._free(imported)

    def _free(self, imported: ImportedRegion) -> None:
        del self._imports[imported.region]
        imported.alive = False
        imported.buffer.destroy()

    @property
    def count(self) -> int:
        """Regions imported now."""
        with self._lock:
            return len(self._imports)

    def close(self) -> None:
        """Free every import (the device is closing: no run is in flight)."""
        REGIONS.forget(self._retired)
        with self._lock:
            for imported in list(self._imports.values()):
                self._free(imported)
