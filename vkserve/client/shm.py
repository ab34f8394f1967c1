"""The client's side of shared-memory tensors on a Unix socket (see ``vkserve.daemon.shm``).

A connection keeps a few regions: memfds sealed against shrinking, mapped here and registered
with the daemon once each (the descriptor travels with the ``shm_register`` frame). A request
whose inputs reach ``THRESHOLD`` bytes takes a free region large enough (registering a new one
when none is), writes its inputs into it, sends references instead of bytes, and leaves the rest
of the region for the outputs; the outputs are copied out of the region before it is freed for
the next request. Both clients use this transparently (the sequence of requests is
``vkserve.client.calls.infer_steps``); TCP connections send tensors inline.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import mmap
import os
import threading
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .messages import InferRequest, ShmSlot
from .tensors import TensorError

__all__ = ["THRESHOLD", "ClientRegion", "SharedInputs", "SharedMemory"]

#: Inputs of at least this many bytes in all go through shared memory.
THRESHOLD = 64 * 1024
#: Inputs start at this alignment in a region; the outputs' room follows them.
ALIGN = 64
#: Room for outputs in a new region: its inputs' size again, at least this much.
MIN_OUTPUT_ROOM = 1 << 20
#: Regions one connection may have registered at once: the daemon refuses more, and a client
#: with more requests in flight sends the others' tensors inline.
MAX_REGIONS = 16
_names = itertools.count(1)


class ClientRegion:
    """One sealed memfd, mapped; ``fd`` is what registering sends (it stays open)."""

    def __init__(self, size: int) -> None:
        self.name = f"r{os.getpid()}-{next(_names)}"
        self.size = size
        self.fd = os.memfd_create(f"vkserve-{self.name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        """Unmap the region and close its descriptor, once: a request abandoned after its
        connection closed drops its region again, and a second os.close could close a reused
        descriptor number that belongs to something else."""
        if self.fd < 0:
            return
        self.map.close()
        os.close(self.fd)
        self.fd = -1


class SharedInputs:
    """A request's inputs written into a region: where each lies, and the outputs' room."""

    def __init__(self, region: ClientRegion, arrays: Mapping[str, np.ndarray]) -> None:
        self.region = region
        self.placed: dict[str, ShmSlot] = {}
        offset = 0
        for name, value in arrays.items():
            array = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
            region.map[offset:offset + array.nbytes] = array.reshape(-1).view(np.uint8)
            self.placed[name] = ShmSlot(region.name, offset, array.nbytes)
            offset += -(-array.nbytes // ALIGN) * ALIGN
        self.outputs = ShmSlot(region.name, offset, region.size - offset)

    def request(self, request: InferRequest) -> InferRequest:
        """``request`` sending these inputs by reference, with the region's rest for outputs."""
        return dataclasses.replace(request, placed=self.placed, outputs_shm=self.outputs)

    def view(self, region: str, offset: int, nbytes: int) -> memoryview:
        """Outputs the daemon wrote (``ShmResolver``): only inside this request's room."""
        room = self.outputs
        if region != room.region or not room.offset <= offset <= offset + nbytes <= room.offset + room.size:
            raise TensorError("shm", f"the server referred to {nbytes} bytes at {region!r}+{offset}, "
                                     f"outside this request's output room")
        return memoryview(self.region.map)[offset:offset + nbytes]


class SharedMemory:
    """The regions of one connection: taken by one request at a time, reused, grown by
    registering a larger one. Thread-safe (the sync client's callers share it).

    ``off`` says why shared memory was turned off for the connection (the daemon refused a
    region); tensors then go inline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[ClientRegion] = []
        self.regions: list[ClientRegion] = []
        self.off: str | None = None

    def wanted(self, arrays: Mapping[str, npt.NDArray[np.generic]]) -> bool:
        """Whether ``arrays`` go through shared memory: large enough, and it is not off."""
        return self.off is None and sum(a.nbytes for a in arrays.values()) >= THRESHOLD

    def refused(self, region: ClientRegion, reason: str) -> None:
        """The daemon refused to register ``region``: drop it and turn shared memory off."""
        self.drop(region)
        self.off = reason

    def take(self, arrays: Mapping[str, np.ndarray]) -> tuple[ClientRegion, bool] | None:
        """A free region that holds ``arrays`` with as much room again for outputs, and whether
        it is new (the caller registers it, then ``put``s it back after the request); None when
        every region the daemon allows (`MAX_REGIONS`) is busy or too small: that request goes
        inline."""
        need = sum(-(-a.nbytes // ALIGN) * ALIGN for a in arrays.values())
        with self._lock:
            fits = [r for r in self._free if r.size >= need + min(need, MIN_OUTPUT_ROOM)]
            if fits:
                region = min(fits, key=lambda r: r.size)
                self._free.remove(region)
                return region, False
            if len(self.regions) >= MAX_REGIONS:
                return None
            region = ClientRegion(1 << max(need + max(need, MIN_OUTPUT_ROOM), 1).bit_length())
            self.regions.append(region)
        return region, True

    def put(self, region: ClientRegion) -> None:
        """A region's request is done: free for the next one."""
        with self._lock:
            self._free.append(region)

    def drop(self, region: ClientRegion) -> None:
        """A region the daemon refused (or the request broke): never used again."""
        with self._lock:
            if region in self.regions:
                self.regions.remove(region)
        region.close()

    def close(self) -> None:
        """Unmap and close every region (the connection is gone)."""
        with self._lock:
            regions, self.regions, self._free = self.regions, [], []
        for region in regions:
            region.close()
