"""Shared-memory regions of one Unix-socket connection (Triton's system shared memory, with the
file descriptor passed over the socket instead of a name anyone could open).

A client registers a region once (op ``shm_register``: a name and a size, the descriptor sent
with the frame as SCM_RIGHTS); its infer requests then refer to tensors by (region, offset)
instead of carrying their bytes, and may give room in a region for the outputs. The daemon maps
each region once; inputs are numpy views of the mapping, so the engines read them in place: the
CPU engine as any array, a GPU that imports host memory straight from the client's pages (the
mapping is registered in ``vkserve.devices.host_regions`` while the connection has it). The
engines write the outputs into their room themselves (``vkserve.devices.output_room``).

Only memfds sealed against shrinking are taken: a region the client could shrink after
registering would turn the daemon's next read of it into a SIGBUS. Regions go with their
connection; one unregistered while a job still reads it stays mapped until the job is done
(the views hold the mapping).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
from collections.abc import Collection

from vkserve.client.messages import ShmSlot
from vkserve.client.tensors import TensorError
from vkserve.devices.host_regions import REGIONS, HostRegion
from vkserve.devices.output_room import OutputRoom

__all__ = ["RegionError", "Regions"]

NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


class RegionError(ValueError):
    """A region cannot be registered; the message says why (answered BAD_REQUEST)."""


class Regions:
    """The connection's registered regions: name -> mapping."""

    def __init__(self, max_regions: int, max_bytes: int) -> None:
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self._maps: dict[str, mmap.mmap] = {}
        self._hosts: dict[str, HostRegion] = {}

    def register(self, name: str, fd: int, size: int) -> None:
        """Map ``size`` bytes of ``fd`` as ``name``. Takes ownership of ``fd`` (closed here,
        whatever happens); RegionError when the region is refused."""
        try:
            if not NAME_RE.fullmatch(name):
                raise RegionError(f"field 'name': {name[:70]!r} is not 1 to 64 letters, digits, '.', '_' or '-'")
            if name in self._maps:
                raise RegionError(f"region {name!r} is already registered on this connection")
            if len(self._maps) >= self.max_regions:
                raise RegionError(f"{len(self._maps)} regions registered on this connection (limit "
                                  f"{self.max_regions}); unregister one first")
            used = sum(len(m) for m in self._maps.values())
            if used + size > self.max_bytes:
                raise RegionError(f"field 'size': {size} bytes would make {used + size} bytes of "
                                  f"regions on this connection (limit {self.max_bytes})")
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                seals = 0
            if not seals & fcntl.F_SEAL_SHRINK:
                raise RegionError("the descriptor must be a memfd sealed against shrinking "
                                  "(memfd_create with MFD_ALLOW_SEALING, then F_SEAL_SHRINK)")
            actual = os.fstat(fd).st_size
            if actual < size:
                raise RegionError(f"field 'size': {size} bytes, but the memfd holds {actual}")
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._maps[name] = mapping
            self._hosts[name] = REGIONS.register(mapping)
        finally:
            os.close(fd)

    def unregister(self, name: str) -> bool:
        """Forget ``name`` (False when unknown); its mapping lives on while views use it."""
        host = self._hosts.pop(name, None)
        if host is not None:
            REGIONS.retire(host)
        return self._maps.pop(name, None) is not None

    def close(self) -> None:
        for host in self._hosts.values():
            REGIONS.retire(host)
        self._hosts.clear()
        self._maps.clear()

    def view(self, region: str, offset: int, nbytes: int) -> memoryview:
        """Bytes of a region (``vkserve.client.tensors.ShmResolver``)."""
        mapping = self._maps.get(region)
        if mapping is None:
            raise TensorError("shm.region", f"no region {region[:70]!r} registered on this connection")
        if offset + nbytes > len(mapping):
            raise TensorError("shm.offset", f"{nbytes} bytes at offset {offset} run past the end of "
                                            f"region {region!r} ({len(mapping)} bytes)")
        return memoryview(mapping)[offset:offset + nbytes]

    def room(self, slot: ShmSlot, wanted: Collection[str] | None) -> OutputRoom | None:
        """The room ``slot`` gives a job's ``wanted`` outputs (None: all), which the engines
        fill directly; None for a slot outside its region (or of an unknown region): the
        outputs then go inline."""
        mapping = self._maps.get(slot.region)
        if mapping is None or slot.offset + slot.size > len(mapping):
            return None
        return OutputRoom(memoryview(mapping)[slot.offset:slot.offset + slot.size], wanted)
