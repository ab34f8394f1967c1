"""Kernel base class, the type-name registry and ncnn's fused activations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from vkserve.devices.cpu.bf16 import from_bf16, to_bf16
from vkserve.models.layers import Shape, activation_values


class StepCall(Protocol):
    """A Plan's step as one call made once and repeated run after run (``Kernel.store_call``:
    ``jit.KernelCall``; ``Kernel.view_copies``: ``CopyCall``)."""

    def __call__(self) -> None: ...


class CopyCall:
    """A ``bf16_native`` step whose results are views of its input (a slice, a transposition,
    a window), as the copies from those views into its outputs' views, made once by a Plan
    (``Kernel.view_copies``) and repeated run after run."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.pairs = pairs  # (output view, input view)

    def __call__(self) -> None:
        for dst, src in self.pairs:
            np.copyto(dst, src)


class Kernel:
    """One layer, compiled for fixed input shapes.

    ``__init__`` takes ``out_shapes`` from the layer's definition (``infer``), checks what this
    engine cannot run and narrows weights to bf16 once; ``forward`` takes fp32 arrays and
    returns fp32 arrays.
    """

    #: outputs are the bytes of input 0 under a new shape (no compute at run time)
    alias: ClassVar[bool] = False
    #: output shapes depend on the data (not planned into the arena)
    dynamic: ClassVar[bool] = False
    #: the executor calls ``forward_bf16`` with the bf16 (uint16) arena views of the inputs
    #: (read-only) instead of widening them into fp32 for ``forward``
    raw_inputs: ClassVar[bool] = False
    #: ``forward`` only moves values (any dtype in, the same dtype out): the executor hands it
    #: the bf16 arena views and copies its uint16 results, with no widening or narrowing
    bf16_native: bool = False
    #: ``forward`` returns views of its inputs, computing nothing (a slice, a transposition, a
    #: window): the Plan copies them into the outputs (``view_copies``)
    forward_views: ClassVar[bool] = False
    #: every fp32 result is a bf16 value already (maxima, ReLU, copies): the executor stores
    #: the high halves instead of rounding (an exact shortcut, same bits)
    exact_store: bool = False
    #: ``forward`` (or ``forward_store``) also takes a batch: arrays with a leading item axis
    #: before the layer's shapes, results likewise (element-wise layers, Softmax, InnerProduct;
    #: BinaryOp and Eltwise where the operands have the output's shape); a batched
    #: Plan runs such a layer once for all its items, any other once per item
    batched: bool = False
    #: the Plan's reusable work buffers (None when a kernel runs outside a Plan)
    scratch: Any = None
    #: ``forward_store`` also takes a second input, one value per channel of the first, by
    #: which it multiplies that channel as it reads it (a BinaryOp Mul fused in: the Plan's
    #: ``_fuse_channel_scales``)
    channel_scale: bool = False
    #: with the channel scale, the activation applied to each product (one fused into that
    #: BinaryOp), as ``jit.epilogue.scale_act`` gives it: (op code, a, b)
    channel_scale_act: tuple[int, np.float32, np.float32] = (0, np.float32(0.0), np.float32(0.0))

    def __init__(self, layer: Any, in_shapes: Sequence[Shape]) -> None:
        self.layer = layer
        self.p = layer.params
        self.in_shapes = [tuple(s) for s in in_shapes]
        self.out_shapes: list[Shape] = self.infer(self.in_shapes)

    def infer(self, in_shapes: list[Shape]) -> list[Shape]:
        """Output shapes, as ``vkserve.models.layers`` defines them (ShapeError when the inputs
        do not fit); kernels extend it with their checks and set-up."""
        return [tuple(s) for s in self.p.infer_shapes(in_shapes, len(self.layer.outputs))]

    def forward(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def channel_scale_operands(self) -> tuple[int, int] | None:
        """(index of the input, index of the scale) where this layer's one output is one of its
        two inputs, (C, H, W), times the other's one value per channel C and nothing else, else
        None."""
        return None

    def items(self, out: np.ndarray) -> int:
        """Items in ``out``: its leading axis when it has one more than the layer's output (a
        batched kernel's batch), else 1."""
        return int(out.shape[0]) if out.ndim > len(self.out_shapes[0]) else 1

    def view_copies(self, xs: list[np.ndarray], outs: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """For a ``bf16_native`` kernel whose results are views of its inputs: (output view,
        input view) pairs whose copies are its step (``CopyCall``); None for the others."""
        return list(zip(outs, self.forward(xs))) if self.forward_views else None

    def store_call(self, us: list[np.ndarray], outs: list[np.ndarray], post: Sequence[Kernel]) -> StepCall | None:
        """``forward_store`` of these arena views (``post`` fused) as one compiled call that a
        Plan makes once, under a run's thread cap, and repeats (``jit.KernelCall``); None where
        the kernel has none for them (a numpy path, or arguments read from an input's values):
        then the Plan calls ``forward_store`` each run."""
        return None

    def forward_bf16(self, us: list[np.ndarray]) -> list[np.ndarray]:
        return self.forward([from_bf16(u) if u.dtype == np.uint16 else u for u in us])

    def buf(self, slot: str, shape: Shape | int, dtype: type = np.float32) -> np.ndarray:
        """A work buffer for this step: the Plan's scratch slot, or a fresh array outside a Plan.

        Its contents are garbage; results returned from ``forward`` may live in one.
        """
        if self.scratch is None:
            return np.empty(shape, dtype=dtype)
        return self.scratch.get(slot, shape, dtype)

    def fp32_bias(self, index: int) -> np.ndarray:
        """Weight ``index`` (a bias vector) kept in fp32, as ncnn's bf16 path keeps biases:
        one value per output channel costs nothing, and rounding it would add an error to
        every output element (measured: nanodet_m's box heads 2.14 % -> 1.76 % max error)."""
        return np.asarray(self.layer.weights[index], dtype=np.float32).ravel().copy()

    def bf16_weight(self, index: int) -> np.ndarray:
        """Weight ``index`` narrowed to bf16 (uint16), or an empty array when absent."""
        ws = self.layer.weights
        w = ws[index] if index < len(ws) else None  # read once: a stored weight is read per index
        if w is None or np.asarray(w).size == 0:
            return np.zeros(0, dtype=np.uint16)
        return to_bf16(np.asarray(w, dtype=np.float32).ravel())


REGISTRY: dict[str, type[Kernel]] = {}


def register(*names: str) -> Callable[[type[Kernel]], type[Kernel]]:
    def deco(cls: type[Kernel]) -> type[Kernel]:
        for name in names:
            REGISTRY[name] = cls
        return cls

    return deco


def widen(u: np.ndarray) -> np.ndarray:
    return from_bf16(u)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def hardswish(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return x * np.clip(x * np.float32(alpha) + np.float32(beta), 0.0, 1.0)


def leaky_relu(y: np.ndarray, slope: float, out: np.ndarray | None = None) -> np.ndarray:
    """y < 0 ? y * slope : y; for 0 <= slope <= 1 that is max(y, y * slope), done in place."""
    s = np.float32(slope)
    if 0.0 <= slope <= 1.0:
        if out is None:
            out = y
        return np.maximum(y, y * s, out=out)
    return np.where(y < 0, y * s, y)


def activate(y: np.ndarray, act_type: int, act_params: Sequence[float]) -> np.ndarray:
    """ncnn's fused activation (activation_type 0..6, validated by the params), applied in
    place where possible."""
    a, b = activation_values(act_type, tuple(act_params))
    if act_type == 0:
        return y
    if act_type == 1:
        return np.maximum(y, 0.0, out=y)
    if act_type == 2:
        return leaky_relu(y, a)
    if act_type == 3:
        return np.clip(y, a, b, out=y)
    if act_type == 4:
        return sigmoid(y)
    if act_type == 5:
        with np.errstate(over="ignore"):
            return y * np.tanh(np.logaddexp(y, 0.0))
    return hardswish(y, a, b)
