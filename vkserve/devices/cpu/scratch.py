"""The CPU Plan's reusable fp32 work buffers."""

from __future__ import annotations

import numpy as np

from vkserve.devices.arena import ALIGNMENT, align_up


class Scratch:
    """Reusable fp32 work buffers of a Plan, by slot name (the compute side of bf16 storage).

    The arena holds every blob as bf16; kernels widen into these buffers, compute in fp32 and
    the executor narrows the results back. A slot is one grow-only buffer shared by all steps
    (one step's buffers are dead by the time the next step runs), so nothing is allocated on
    the hot path after the first run. Within one step, distinct slot names never share bytes.
    Weights are never kept here between steps: a slot such as ``"w"`` holds the widened
    weights (or a block of them) of the step that is running.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}
        #: how many times a slot was made or grown: a call made once (``jit.KernelCall``) that
        #: holds a slot's buffer is stale once this moves
        self.grown = 0

    def get(self, slot: str, shape: tuple[int, ...] | int, dtype: type = np.float32) -> np.ndarray:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = 1
        for v in shape:
            n *= int(v)
        itemsize = np.dtype(dtype).itemsize
        nbytes = align_up(max(n * itemsize, 1), ALIGNMENT)
        buf = self._bufs.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(nbytes // 4, dtype=np.float32)
            self._bufs[slot] = buf
            self.grown += 1
        return buf.view(dtype)[:n].reshape(shape)
