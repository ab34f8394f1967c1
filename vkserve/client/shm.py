"""The client's side of shared-memory tensors on a Unix socket (see ``vkserve.daemon.shm``).

A connection keeps a few regions: memfds sealed against shrinking, mapped here and registered
with the daemon once each (the descriptor travels with the ``shm_register`` frame). A request
whose inputs reach ``THRESHOLD`` bytes takes a free region large enough (registering a new one
when none is), writes its inputs into it, sends references instead of bytes, and leaves the rest
of the region for the outputs; the outputs are copied out of the region before it is freed for
the next request. The pool remembers how many bytes of outputs each kind of request (model,
input shapes and types, outputs asked for) got back, so the next such request takes a region
with room for all of them: a model whose outputs outgrow its inputs (segmentation maps,
upsamplers) gets them through shared memory from its second request on, small inputs
included. Both clients use this transparently (the sequence of requests is
``vkserve.client.calls.infer_steps``); TCP connections send tensors inline.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .messages import InferRequest, ShmSlot
from .tensors import TensorError

__all__ = ["THRESHOLD", "ClientRegion", "SharedInputs", "SharedMemory"]

#: Inputs (and the outputs expected back) of at least this many bytes in all go through shared
#: memory.
THRESHOLD = 64 * 1024
#: Inputs start at this alignment in a region; the outputs' room follows them (the daemon
#: places each output at this alignment too: ``vkserve.devices.output_room.ALIGN``).
ALIGN = 64
#: Room for outputs in a new region when none are known for the request: its inputs' size
#: again, at least this much.
MIN_OUTPUT_ROOM = 1 << 20
#: Room remembered for a kind of request at most: larger outputs come inline (a connection's
#: regions may hold 1 GiB in all, ``vkserve.daemon.connection.SHM_MAX_BYTES``).
MAX_OUTPUT_ROOM = 64 << 20
#: Kinds of request whose outputs' size is remembered (the least recently seen forgotten).
MAX_KNOWN_OUTPUTS = 64
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


def _aligned(arrays: Mapping[str, npt.NDArray[np.generic]]) -> int:
    """Bytes ``arrays`` take in a region, each at ``ALIGN``."""
    return sum(-(-a.nbytes // ALIGN) * ALIGN for a in arrays.values())


_OutputsKey = tuple[str, tuple[tuple[str, tuple[int, ...], str], ...], tuple[str, ...] | None]


def _outputs_key(request: InferRequest) -> _OutputsKey:
    """What a request's outputs' size depends on: the model, its inputs' shapes and types,
    the outputs asked for."""
    inputs = tuple((n, a.shape, a.dtype.str) for n, a in request.inputs.items())
    return request.model, inputs, None if request.outputs is None else tuple(request.outputs)


class SharedMemory:
    """The regions of one connection: taken by one request at a time, reused, grown by
    registering a larger one; and the outputs' size each kind of request got back (``learn``).
    Thread-safe (the sync client's callers share it).

    ``off`` says why shared memory was turned off for the connection (the daemon refused a
    region); tensors then go inline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[ClientRegion] = []
        self.regions: list[ClientRegion] = []
        self.off: str | None = None
        self._outputs: OrderedDict[_OutputsKey, int] = OrderedDict()

    def learn(self, request: InferRequest, outputs: Mapping[str, npt.NDArray[np.generic]]) -> None:
        """``request`` got ``outputs`` back: the room the next such request asks for."""
        key = _outputs_key(request)
        with self._lock:
            self._outputs[key] = min(_aligned(outputs), MAX_OUTPUT_ROOM)
            self._outputs.move_to_end(key)
            if len(self._outputs) > MAX_KNOWN_OUTPUTS:
                self._outputs.popitem(last=False)

    def output_room(self, request: InferRequest) -> int | None:
        """Bytes of outputs ``request``'s kind got back last time (None: not seen yet)."""
        with self._lock:
            return self._outputs.get(_outputs_key(request))

    def wanted(self, request: InferRequest) -> bool:
        """Whether ``request``'s tensors go through shared memory: its inputs and the outputs
        it is expected to get back large enough, and it is not off."""
        size = sum(a.nbytes for a in request.inputs.values()) + (self.output_room(request) or 0)
        return self.off is None and size >= THRESHOLD

    def refused(self, region: ClientRegion, reason: str) -> None:
        """The daemon refused to register ``region``: drop it and turn shared memory off."""
        self.drop(region)
        self.off = reason

    def take(self, request: InferRequest) -> tuple[ClientRegion, bool] | None:
        """A free region that holds ``request``'s inputs with room for its outputs (the bytes
        its kind got back last time; unknown: as much as the inputs again), and whether it is
        new (the caller registers it, then ``put``s it back after the request); None when every
        region the daemon allows (`MAX_REGIONS`) is busy or too small: that request goes
        inline."""
        need = _aligned(request.inputs)
        known = self.output_room(request)
        room = min(need, MIN_OUTPUT_ROOM) if known is None else known
        with self._lock:
            fits = [r for r in self._free if r.size >= need + room]
            if fits:
                region = min(fits, key=lambda r: r.size)
                self._free.remove(region)
                return region, False
            if len(self.regions) >= MAX_REGIONS:
                return None
            region = ClientRegion(1 << max(need + max(need, MIN_OUTPUT_ROOM, room), 1).bit_length())
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
