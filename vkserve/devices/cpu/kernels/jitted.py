"""The base of the kernels that run a numba routine (``vkserve.devices.cpu.jit``): it reads the
bf16 arena (or fp32 arrays) and writes bf16 (or fp32) results, fused activations included."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vkserve.devices.cpu import jit
from vkserve.devices.cpu.kernels.base import Kernel, StepCall
from vkserve.models.layers import Shape

#: a numba kernel and the arguments of one call (``JitKernel._call``)
JitCall = tuple[Callable[..., None], tuple[Any, ...]]


class JitKernel(Kernel):
    """A kernel whose numba routine reads bf16 or fp32 input and writes bf16 or fp32 output."""

    raw_inputs = True
    #: multiply-adds (or elements) of one run (``infer`` sets it): small layers run on one thread
    work: int = jit.SMALL_WORK

    def _call(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> JitCall:
        """The numba kernel computing ``out`` from ``xs`` with the epilogue ``ops``, and its
        arguments: views of these arrays, work buffers, weights, task counts for the calling
        thread's cap; none read from the inputs' values (``jit.KernelCall``)."""
        raise NotImplementedError

    def _launch(self, xs: list[np.ndarray], out: np.ndarray, ops: np.ndarray) -> None:
        kernel, args = self._call(xs, out, ops)
        kernel(*args)

    def _activation(self) -> tuple[int, Sequence[float]]:
        """The layer's own fused activation (ncnn's activation_type and params)."""
        return self.p.activation_type, self.p.activation_params

    def _own_post(self) -> tuple[Kernel, ...]:
        """Activation layers that are this layer's own op (an activation layer itself)."""
        return ()

    def _ops(self, post: Sequence[Kernel]) -> np.ndarray:
        """The epilogue: this layer's activation, then ``post`` (cached per fused chain)."""
        key = tuple(id(k) for k in post)
        ops = self._epilogues.get(key)
        if ops is None:
            ops = jit.epilogue_ops(*self._activation(), (*self._own_post(), *post))
            self._epilogues[key] = ops
        return ops

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        self._epilogues: dict[tuple[int, ...], np.ndarray] = {}
        return super().infer(in_shapes)

    def _store_call(self, us: list[np.ndarray], outs: list[np.ndarray], post: Sequence[Kernel]) -> jit.KernelCall:
        """``forward_store``'s call, whether or not a Plan may make it once (``store_call``, which
        a kernel reading a value from an input turns down)."""
        return jit.KernelCall(*self._call(us, outs[0], self._ops(post)), self.work * self.items(outs[0]))

    def store_call(self, us: list[np.ndarray], outs: list[np.ndarray], post: Sequence[Kernel]) -> StepCall | None:
        return self._store_call(us, outs, post)

    def forward_store(self, us: list[np.ndarray], outs: list[np.ndarray], post: Sequence[Kernel]) -> None:
        """bf16 arena input -> bf16 arena output, ``post`` activations fused (the Plan's path)."""
        self._store_call(us, outs, post)()

    def forward_bf16(self, us: list[np.ndarray]) -> list[np.ndarray]:
        out = self.buf("out", self.out_shapes[0])
        with jit.launch(self.work):
            self._launch([np.ascontiguousarray(u) for u in us], out, self._ops(()))
        return [out]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        out = self.buf("out", self.out_shapes[0])
        with jit.launch(self.work):
            self._launch([np.ascontiguousarray(x, dtype=np.float32) for x in xs], out, self._ops(()))
        return [out]
