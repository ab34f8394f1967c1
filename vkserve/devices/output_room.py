"""Room a client gave for one job's outputs, which an engine fills directly.

A shared-memory client (``vkserve.daemon.shm``) names a slot of one of its regions for the
outputs. Copying them there after the run would make each output's bytes travel twice
(staging, or the CPU engine's bf16 arena, into a new array, then into the region); an engine
given an ``OutputRoom`` instead writes each wanted output straight into its place in the slot
(widening or casting on the way) and returns that view as the output.

The engine writes from its worker thread while the event loop may end the job (its deadline,
a cancel, the daemon stopping, another device's retry finishing first). ``close`` waits for a
write under way and refuses every later one, so a client never finds its room written after
the answer that ended its request. Outputs the engine did not place (computed on the host,
data-dependent, or a run that wrote nothing) are copied in by ``complete`` as the answer is
made; it is the daemon's own write, allowed after ``close``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Collection, Iterator, Mapping

import numpy as np

__all__ = ["ALIGN", "OutputRoom", "Placed"]

#: each output placed in a room starts at this alignment (from the room's start)
ALIGN = 64


@dataclasses.dataclass(frozen=True)
class Placed:
    """Where one output lies in its room: ``nbytes`` from ``offset`` (from the room's start)."""

    offset: int
    nbytes: int


class OutputRoom:
    """The bytes of one job's output slot, filled in the order outputs are placed: each at the
    next ``ALIGN`` boundary, an output that does not fit left out (it travels inline).
    ``wanted``: the outputs the job returns (None: all)."""

    def __init__(self, memory: memoryview, wanted: Collection[str] | None = None) -> None:
        self._bytes = np.frombuffer(memory, dtype=np.uint8)
        if self._bytes.flags.writeable is False:
            raise ValueError("an output room must be writable memory")
        self._wanted = None if wanted is None else frozenset(wanted)
        self._lock = threading.Lock()
        self._open = True
        self._next = 0
        self._placed: dict[str, tuple[Placed, np.ndarray]] = {}

    @property
    def size(self) -> int:
        return len(self._bytes)

    @contextlib.contextmanager
    def writing(self) -> Iterator[bool]:
        """An engine's write of one run's outputs: yields False when the job has ended (write
        nothing then); otherwise the room is the engine's until the block ends, and what an
        earlier run placed is forgotten (a retried job's outputs are placed afresh)."""
        with self._lock:
            if self._open:
                self._next = 0
                self._placed.clear()
            yield self._open

    def place(self, name: str, shape: tuple[int, ...], dtype: np.dtype = np.dtype(np.float32)) -> np.ndarray | None:
        """A C-contiguous array of ``shape`` for output ``name`` in the room (inside
        ``writing`` or ``complete``), or None: not a wanted output, or no room left for it."""
        if self._wanted is not None and name not in self._wanted:
            return None
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = self._next
        if start + nbytes > len(self._bytes):
            return None
        array = self._bytes[start:start + nbytes].view(dtype).reshape(shape)
        self._placed[name] = (Placed(start, nbytes), array)
        self._next = start + -(-nbytes // ALIGN) * ALIGN
        return array

    def close(self) -> None:
        """The job ended: wait for an engine's write under way, refuse later ones."""
        with self._lock:
            self._open = False

    def complete(self, outputs: Mapping[str, np.ndarray]) -> dict[str, Placed]:
        """Copy in the wanted ``outputs`` an engine did not place (each after those placed, as
        long as they fit); returns where every output in the room lies."""
        with self._lock:
            for name, array in outputs.items():
                held = self._placed.get(name)
                if held is not None and held[1] is array:
                    continue
                data = np.ascontiguousarray(array)
                if held is not None and (held[1].shape, held[1].dtype) == (data.shape, data.dtype):
                    dest: np.ndarray | None = held[1]  # an output replaced after the engine's write
                else:
                    self._placed.pop(name, None)
                    dest = self.place(name, data.shape, data.dtype)
                if dest is not None:
                    np.copyto(dest, data)
            return {name: placed for name, (placed, _) in self._placed.items() if name in outputs}
