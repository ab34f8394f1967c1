"""CPU executor: a Plan compiles a Graph for fixed input shapes into a list of kernels over
one bf16 arena.

Storage is bf16 (uint16) and compute fp32: before a step runs, each of its inputs is widened
from the arena into a reusable fp32 scratch buffer (``vkserve.devices.cpu.scratch.Scratch``; kernels that
define ``forward_bf16`` instead read the bf16 arena views and widen what they need themselves,
e.g. straight into a padded buffer); the kernel's fp32 results are narrowed (RNE) into the
outputs' arena slots. Kernels that define ``forward_store`` (the numba kernels: convolutions,
InnerProduct, Pooling) read the arena and store their bf16 results into it themselves, fused
activations included. After the first run nothing large is allocated per run. Because every
input is read before any output is written, a blob last read by a step may share bytes with
that step's outputs (see
``vkserve.devices.arena``), except for those self-storing kernels.
Reshape-like layers (Split, Reshape, Flatten, Noop, Input) alias their input's bytes, and a
Concat along the channels is written in place where it can be (``_concats_in_place``): each
input's producer stores straight into the output's channel range, and the Concat runs nothing.
Data-dependent outputs (detections) live outside the arena, in fp32.

A Plan built for a batch of ``batch`` items (``Plan(..., batch=n)``, ``sibling(batch=n)``) runs
up to that many items in one execution (``run_batch_timed``): every blob has a leading item
axis in the arena (each item's bytes contiguous, so Reshape-like aliases stay views). Kernels
that declare ``batched`` (element-wise layers, Softmax, InnerProduct: nothing in them depends
on the item count) run once over the whole batch; the others run once per item on that item's views, in
the same pass, so a batch pays the run's fixed costs (narrowing the inputs, widening the
outputs, the lock, the per-step hand-offs of the batched layers) once, not per item. Graphs
with data-dependent outputs (detections) run one item at a time.

A Plan is not re-entrant: ``run`` holds a lock; use one Plan per concurrent job.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import enum
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from vkserve.devices.arena import Interval, plan_offsets
from vkserve.devices.cpu import jit, threads
from vkserve.devices.cpu.bf16 import from_bf16, narrow_exact_into, to_bf16, widen_into
from vkserve.devices.cpu.jit import elementwise as jit_elementwise
from vkserve.devices.cpu.kernels import REGISTRY, Kernel
from vkserve.devices.cpu.kernels.base import CopyCall, StepCall
from vkserve.devices.cpu.kernels.elementwise import ELEMENT_WORK
from vkserve.devices.cpu.kernels.shape import Concat
from vkserve.devices.cpu.scratch import Scratch
from vkserve.devices.cpu.thread_choice import ThreadChoice
from vkserve.devices.errors import UnsupportedError
from vkserve.devices.output_room import OutputRoom
from vkserve.devices.timing import StageTimes
from vkserve.models.layers import Shape, ShapeError

log = logging.getLogger(__name__)

BYTES_PER_ELEMENT = 2


class PlanError(ValueError):
    """The graph cannot be compiled for the CPU engine (all offending layers named at once)."""


#: activation layers that can run on their producer's fp32 result before its single store
FUSABLE_ACTIVATIONS = frozenset({"ReLU", "Clip", "Sigmoid", "Swish", "HardSigmoid", "HardSwish", "GELU"})
#: producers whose ``forward`` returns a fresh or step-owned fp32 buffer (an "out" scratch
#: slot or a new array, never a slot those activations use, never a view of an input)
FUSABLE_PRODUCERS = frozenset({"Convolution", "ConvolutionDepthWise", "InnerProduct", "Eltwise", "BinaryOp",
                               "BatchNorm", "Gemm", "MatMul"})


def _stores_itself(kernel: Kernel) -> bool:
    """The kernel reads the bf16 arena and stores its bf16 results itself (``forward_store``)."""
    return kernel.raw_inputs and hasattr(kernel, "forward_store")


class StepKind(enum.Enum):
    """How ``Plan.run`` feeds a step."""

    ALIAS = "alias"  # outputs are an input's bytes: nothing runs (data-dependent blobs pass on)
    BF16_NATIVE = "bf16-native"  # bf16 arena views in, uint16 results copied out
    RAW_INPUTS = "raw-inputs"  # bf16 arena views in (``forward_bf16``), fp32 out
    #: bf16 arena views in and out: the kernel stores its results (RNE) itself, fused
    #: activations included (``forward_store(inputs, output views, post)``)
    STORE = "store"
    WIDENED = "widened"  # inputs widened to fp32 scratch, fp32 out


@dataclasses.dataclass
class _Step:
    kernel: Kernel
    name: str
    inputs: list[str]
    outputs: list[str]
    #: activation kernels fused into this step: applied in order to its fp32 result
    post: list[Kernel] = dataclasses.field(default_factory=list)
    #: names of the layers fused in (for reports)
    fused: list[str] = dataclasses.field(default_factory=list)


class _Prepared(NamedTuple):
    """A step as ``Plan.run`` takes it: inputs are arena views, or names of data-dependent
    (fp32) blobs; outputs are (view or name, exact store) pairs."""

    kind: StepKind
    kernel: Kernel
    ins: list[Any]
    outs: list[Any]
    post: list[Kernel]
    name: str
    #: a bf16-native step with several inputs or outputs whose bytes overlap in the arena (a
    #: blob last read by a step may share bytes with its outputs): its inputs are copied first,
    #: since an early write could clobber a later read. One copy from one input to one output
    #: needs nothing: numpy's copyto detects overlap and buffers.
    copy_inputs: bool = False
    #: the batch item this step runs on (its views are that item's), or -1: the whole batch
    #: (a ``batched`` kernel, whose views have the item axis; an alias step)
    item: int = -1

    def first(self, count: int) -> _Prepared:
        """This whole-batch step on the first ``count`` items only."""
        return self._replace(
            ins=[x[:count] if isinstance(x, np.ndarray) else x for x in self.ins],
            outs=[(v[:count], e) if isinstance(v, np.ndarray) else (v, e) for v, e in self.outs])


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One step's wall time in ``Plan.profile`` (median over the runs)."""

    name: str
    type: str
    fused: tuple[str, ...]  # layers fused in: a channel scale read with its input, activations in its epilogue
    ms: float


@dataclasses.dataclass
class _Storage:
    size: int
    start: int
    end: int


class Plan:
    """A Graph compiled for given input shapes: kernels in order plus an arena layout."""

    def __init__(
        self,
        graph: Any,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        outputs: Sequence[str] | None = None,
        fuse: bool = True,
        batch: int = 1,
        name: str = "",
    ) -> None:
        #: what log lines call the Plan: the model's name (default: its .param file's)
        self.name: str = name or graph.file or "a graph"
        self.input_names: list[str] = list(graph.input_names)
        self.output_names: list[str] = list(outputs) if outputs is not None else list(graph.output_names)
        given = {k: tuple(int(v) for v in s) for k, s in (input_shapes or {}).items()}
        self.blob_shapes: dict[str, Shape] = {}
        self._steps: list[_Step] = []
        self.scratch = Scratch()
        #: bf16 weights the kernels narrowed at compile (shared with this Plan's ``sibling``s)
        self.weight_bytes: int = BYTES_PER_ELEMENT * sum(
            layer.weight_elements() for layer in graph.layers)
        #: which Plan's weights these are (equal for siblings: count them once)
        self.weights_id = id(self)
        self._compile(graph, given)
        self.fused: list[tuple[str, str]] = self._fuse_activations() if fuse else []
        #: (convolution, multiply) layer names: per-channel multiplies read with a convolution's input
        self.scaled: list[tuple[str, str]] = self._fuse_channel_scales() if fuse else []
        self.batch = self._checked_batch(batch)
        self._lay_out()
        self._prepare()
        self._lock = threading.Lock()
        self.thread_choice = ThreadChoice(threads.THREADS)

    def sibling(self, batch: int | None = None) -> Plan:
        """Another Plan of the same graph and shapes for concurrent runs: its own arena and
        work buffers, the kernels' packed weights shared (they are read-only once packed), so
        a second instance costs an arena, not a second copy of the model (resnet18: 23 MB of
        bf16 panels). ``batch``: for that many items per run (default: this Plan's)."""
        twin = copy.copy(self)
        twin.batch = self._checked_batch(self.batch if batch is None else batch)
        twin.scratch = Scratch()
        kernels: dict[int, Kernel] = {}
        for step in self._steps:
            for kernel in (step.kernel, *step.post):
                if id(kernel) not in kernels:
                    kernels[id(kernel)] = copy.copy(kernel)
                    kernels[id(kernel)].scratch = twin.scratch
        twin._steps = [dataclasses.replace(step, kernel=kernels[id(step.kernel)],
                                           post=[kernels[id(k)] for k in step.post])
                       for step in self._steps]
        twin._lay_out()
        twin._prepare()
        twin._lock = threading.Lock()
        twin.thread_choice = ThreadChoice(threads.THREADS)  # measured per batch size
        return twin

    @property
    def batchable(self) -> bool:
        """Can this graph run several items in one execution (no data-dependent outputs)?"""
        return not self._dynamic

    def _checked_batch(self, batch: int) -> int:
        if batch < 1:
            raise ValueError(f"batch {batch}: a Plan runs at least one item")
        if batch > 1 and not self.batchable:
            raise PlanError(f"{batch} items in one run: the graph has data-dependent outputs "
                            f"({', '.join(sorted(self._dynamic))}); run its items one at a time")
        return batch

    # -- compile ---------------------------------------------------------------------------

    def _compile(self, graph: Any, given: dict[str, Shape]) -> None:
        unknown = sorted({layer.type for layer in graph.layers if layer.type not in REGISTRY})
        if unknown:
            names = ", ".join(
                f"{t} ({', '.join(lay.name for lay in graph.layers if lay.type == t)})" for t in unknown
            )
            raise PlanError(f"unsupported layer types for the CPU engine: {names}")
        problems: list[str] = []
        self._dynamic: set[str] = set()
        for layer in graph.layers:
            if layer.type == "Input":
                blob = layer.outputs[0]
                shape = given.get(blob) or given.get(layer.name) or graph.blob_shapes.get(blob)
                if not shape:
                    problems.append(f"{layer.name} (Input): no shape given for input '{blob}'")
                    continue
                in_shapes: list[Shape] = [tuple(shape)]
            elif any(b not in self.blob_shapes for b in layer.inputs):
                continue  # an upstream layer already failed
            else:
                in_shapes = [self.blob_shapes[b] for b in layer.inputs]
            try:
                kernel = REGISTRY[layer.type](layer, in_shapes)
                kernel.scratch = self.scratch
            except (UnsupportedError, ShapeError) as e:
                problems.append(f"{layer.name} ({layer.type}, line {layer.line}): {e}")
                continue
            if len(kernel.out_shapes) != len(layer.outputs):
                problems.append(f"{layer.name} ({layer.type}): {len(layer.outputs)} outputs, kernel makes {len(kernel.out_shapes)}")
                continue
            for blob, shape in zip(layer.outputs, kernel.out_shapes):
                self.blob_shapes[blob] = tuple(shape)
            sources = [layer.inputs[kernel.source(i)] for i in range(len(layer.outputs))] if kernel.alias and layer.inputs else []
            if kernel.dynamic or any(s in self._dynamic for s in sources):
                self._dynamic.update(layer.outputs)
            self._steps.append(_Step(kernel, layer.name, list(layer.inputs), list(layer.outputs)))
        missing = [n for n in self.output_names if n not in self.blob_shapes and not problems]
        if missing:
            problems.append(f"requested outputs not produced by the graph: {', '.join(missing)}")
        if problems:
            raise PlanError("cannot run on the CPU engine:\n  " + "\n  ".join(problems))

    def _fuse_activations(self) -> list[tuple[str, str]]:
        """Fold an activation layer into the step producing its input, when that blob is read by
        nothing else and is not a requested output: the activation then runs on the producer's
        fp32 result before the one bf16 store (one store, one widen and one pass fewer; the
        result differs from running them apart only by the bf16 rounding of the blob between).
        Also through one Reshape-like step between them (pnnx puts a Reshape between each
        Linear layer's Gemm and its GELU): an element-wise activation commutes with it, so the
        producer applies it and the Reshape then aliases the activation's output. Returns
        (producer, activation) layer names."""
        readers = self._readers()
        producer: dict[str, _Step] = {}
        for step in self._steps:
            for b in step.outputs:
                producer[b] = step
        keep: list[_Step] = []
        fused: list[tuple[str, str]] = []
        protected = set(self.output_names) | self._dynamic

        def fusable(src: _Step | None, blob: str) -> bool:
            return (src is not None and not src.post and len(src.outputs) == 1
                    and src.kernel.layer.type in FUSABLE_PRODUCERS and not src.kernel.alias
                    and readers.get(blob) == 1 and blob not in protected)

        for step in self._steps:
            k = step.kernel
            if (k.layer.type in FUSABLE_ACTIVATIONS and len(step.inputs) == 1 and len(step.outputs) == 1
                    and step.outputs[0] not in self._dynamic):
                blob = step.inputs[0]
                src = producer.get(blob)
                between = None
                if (src is not None and src.kernel.alias and src.kernel.layer.type != "Input"
                        and len(src.outputs) == 1 and src.inputs and src.kernel.source(0) == 0
                        and readers.get(blob) == 1 and blob not in protected):
                    between, blob = src, src.inputs[0]
                    src = producer.get(blob)
                if fusable(src, blob):
                    src.post.append(k)
                    src.fused.append(step.name)
                    if between is None:
                        src.outputs = list(step.outputs)
                        producer[step.outputs[0]] = src
                    else:
                        between.outputs = list(step.outputs)
                        producer[step.outputs[0]] = between
                    fused.append((src.name, step.name))
                    continue
            keep.append(step)
        self._steps = keep
        return fused

    def _fuse_channel_scales(self) -> list[tuple[str, str]]:
        """Fold a per-channel multiply (squeeze-and-excitation's: a BinaryOp Mul of a (C, H, W)
        blob by C values) into the step that alone reads its product, when that kernel takes a
        channel scale (``Kernel.channel_scale``): it multiplies each input value by its
        channel's as it copies the input in, with the BinaryOp's fp32 product and rounding (the
        same bits), and the product is never stored; a ReLU, Clip or HardSwish fused into the
        multiply (mobilenet_v3's) goes with it (``jit.scale_act``). efficientnet_b0's 16 such multiplies took 0.51 of 7.87 ms
        (the 2-core VM, 2 threads), each a pass over a blob the next layer reads again. Returns
        (consumer, multiply) layer names."""
        readers = self._readers()
        producer = {blob: step for step in self._steps for blob in step.outputs}
        protected = set(self.output_names) | self._dynamic
        dropped: set[int] = set()
        fused: list[tuple[str, str]] = []
        for step in self._steps:
            if not step.kernel.channel_scale or len(step.inputs) != 1:
                continue
            blob = step.inputs[0]
            src = producer.get(blob)
            if (src is None or len(src.outputs) != 1 or readers[blob] != 1 or blob in protected
                    or any(b in self._dynamic for b in src.inputs)):
                continue
            act = jit.scale_act(src.post)
            operands = src.kernel.channel_scale_operands()
            if operands is None or act is None:
                continue
            step.inputs = [src.inputs[operands[0]], src.inputs[operands[1]]]
            step.kernel.channel_scale_act = act
            step.fused[:0] = [src.name, *src.fused]
            dropped.add(id(src))
            fused.append((step.name, src.name))
        self._steps = [step for step in self._steps if id(step) not in dropped]
        return fused

    def _readers(self) -> collections.Counter[str]:
        """How many steps read each blob."""
        return collections.Counter(blob for step in self._steps for blob in step.inputs)

    def _concats_in_place(self) -> dict[int, list[str]]:
        """Concats whose inputs their producers can store straight into the output's channel
        ranges (step index -> its inputs): along the channels (axis 0 of an item: each input's
        range is contiguous in an item), every input made by a step that computes it (not an
        alias, not the model's input, not another Concat written in place), read by this
        Concat alone, not a requested output, and on its own item's view when the Plan runs a
        batch (a whole-batch kernel would write a strided view). squeezenet's 8 Concats copied
        0.42 ms of a 10.5 ms run (this 2-core VM, 1 thread)."""
        readers = self._readers()
        made_by = {blob: i for i, step in enumerate(self._steps) for blob in step.outputs}
        wanted = set(self.output_names)
        found: dict[int, list[str]] = {}
        for i, step in enumerate(self._steps):
            k = step.kernel
            if not isinstance(k, Concat) or k.axis != 0 or step.post or len(set(step.inputs)) != len(step.inputs):
                continue
            if any(b in self._dynamic for b in (*step.inputs, *step.outputs)):
                continue
            makers = [made_by.get(b) for b in step.inputs]
            if all(j is not None and j not in found and not self._steps[j].kernel.alias
                   and self._steps[j].kernel.layer.type != "Input"
                   and not (self.batch > 1 and self._steps[j].kernel.batched)
                   and readers[b] == 1 and b not in wanted
                   for b, j in zip(step.inputs, makers)):
                found[i] = list(step.inputs)
        return found

    def _lay_out(self) -> None:
        """Group aliasing blobs into storages, give each a lifetime and pack them into the arena."""
        self._storage_of: dict[str, int] = {}
        storages: list[_Storage] = []
        end_of_run = len(self._steps)
        self._in_place = self._concats_in_place()
        #: Concats whose inputs are stored into their output's ranges (they run nothing)
        self.concats_in_place: int = len(self._in_place)
        #: an in-place Concat's input -> (its output, first channel, end channel)
        ranges: dict[str, tuple[str, int, int]] = {}
        for i, ins in self._in_place.items():
            out = self._steps[i].outputs[0]
            lo = 0
            for blob in ins:
                hi = lo + self.blob_shapes[blob][0]
                ranges[blob] = (out, lo, hi)
                lo = hi
        for step_index, step in enumerate(self._steps):
            # a kernel that stores its own outputs writes them while still reading its inputs,
            # and a step run item by item writes item 0's outputs before it reads item 1's
            # inputs: those stay live through the step, never sharing bytes with its outputs
            last = step_index + 1 if (_stores_itself(step.kernel) or self._itemwise(step)) else step_index
            for blob in step.inputs:
                sid = self._storage_of.get(blob)
                if sid is not None:
                    storages[sid].end = max(storages[sid].end, last)
            for i, blob in enumerate(step.outputs):
                if blob in self._dynamic or (step_index in self._in_place and blob in self._storage_of):
                    continue
                if blob in ranges:  # stored into an in-place Concat's output, made here if first
                    whole = ranges[blob][0]
                    if whole not in self._storage_of:
                        self._storage_of[whole] = len(storages)
                        storages.append(_Storage(self.batch * math.prod(self.blob_shapes[whole]) * BYTES_PER_ELEMENT,
                                                 step_index, step_index + 1))
                    self._storage_of[blob] = self._storage_of[whole]
                    continue
                if step.kernel.alias and step.kernel.layer.type != "Input":
                    self._storage_of[blob] = self._storage_of[step.inputs[step.kernel.source(i)]]
                    continue
                size = self.batch * math.prod(self.blob_shapes[blob]) * BYTES_PER_ELEMENT
                self._storage_of[blob] = len(storages)
                storages.append(_Storage(size, step_index, step_index + 1))
        for blob in self.output_names:
            if blob in self._storage_of:
                storages[self._storage_of[blob]].end = end_of_run + 1
        offsets, total = plan_offsets([Interval(s.size, s.start, s.end) for s in storages])
        self.arena_bytes: int = total
        self.naive_bytes: int = sum(
            self.batch * math.prod(self.blob_shapes[b]) * BYTES_PER_ELEMENT for b in self._storage_of
        )
        self.storage_intervals: list[tuple[int, Interval]] = [
            (off, Interval(s.size, s.start, s.end)) for off, s in zip(offsets, storages)
        ]
        self._arena = np.zeros(total // BYTES_PER_ELEMENT, dtype=np.uint16)
        self._views: dict[str, np.ndarray] = {}
        for blob, sid in self._storage_of.items():
            start = offsets[sid] // BYTES_PER_ELEMENT
            shape = (self.batch, *self.blob_shapes[blob])
            self._views[blob] = self._arena[start : start + math.prod(shape)].reshape(shape)
        for blob, (whole, lo, hi) in ranges.items():
            self._views[blob] = self._views[whole][:, lo:hi]

    def _itemwise(self, step: _Step) -> bool:
        """Does the step run once per item (a kernel that takes one item's arrays)? (Steps
        on data-dependent blobs do too, but their graphs run one item at a time.)"""
        return self.batch > 1 and not (step.kernel.batched or step.kernel.alias)

    def _native(self, step: _Step) -> bool:
        return (
            step.kernel.bf16_native and not step.post
            and not any(b in self._dynamic for b in step.inputs + step.outputs)
        )

    def _prepare(self) -> None:
        """Per step, what ``run`` needs without look-ups (``_Prepared``): a step of a
        ``batched`` kernel once, on the whole batch's views; any other once per item, on that
        item's views. Inputs are arena views, or a name for data-dependent (fp32, by name)
        blobs; outputs are (view or name, exact store)."""
        self._program: list[_Prepared] = []
        for index, step in enumerate(self._steps):
            k = step.kernel
            if k.alias or index in self._in_place:  # nothing runs (an in-place Concat: stored)
                self._program.append(_Prepared(
                    StepKind.ALIAS, k, list(step.inputs), [(b, b in self._dynamic) for b in step.outputs],
                    [], step.name))
                continue
            if self._native(step):
                kind = StepKind.BF16_NATIVE
            elif _stores_itself(k) and not any(
                b in self._dynamic for b in step.inputs + step.outputs
            ):
                kind = StepKind.STORE
            elif k.raw_inputs:
                kind = StepKind.RAW_INPUTS
            else:
                kind = StepKind.WIDENED
            exact = bool(k.exact_store) and not step.post
            whole = k.batched and not any(b in self._dynamic for b in step.inputs + step.outputs)
            for item in ([-1] if whole else range(self.batch)):
                def view(blob: str, item: int = item) -> Any:
                    if blob in self._dynamic:
                        return blob
                    return self._views[blob] if item < 0 else self._views[blob][item]
                ins = [view(b) for b in step.inputs]
                outs = [(view(b), exact and b not in self._dynamic) for b in step.outputs]
                copy_inputs = kind is StepKind.BF16_NATIVE and (len(ins) > 1 or len(outs) > 1) and any(
                    np.may_share_memory(o, x) for o, _ in outs for x in ins)
                self._program.append(_Prepared(kind, k, ins, outs, list(step.post), step.name,
                                               copy_inputs, item))
        self._programs: dict[int, list[_Prepared]] = {self.batch: self._program}
        self._bound: dict[tuple[int, int], list[tuple[StepCall | None, _Prepared]]] = {}

    # -- run -------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; ``inputs`` maps every input blob name to a float32-convertible array."""
        return self.run_timed(inputs)[0]

    def run_timed(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], StageTimes]:
        """``run``, and the seconds spent narrowing the inputs, in the kernels and widening
        the outputs."""
        outputs, times = self.run_batch_timed([inputs])
        return outputs[0], times

    def run_batch_timed(self, items: Sequence[Mapping[str, np.ndarray]],
                        rooms: Sequence[OutputRoom | None] = ()
                        ) -> tuple[list[dict[str, np.ndarray]], StageTimes]:
        """Run 1 to ``batch`` items in one execution: their outputs (in order) and the seconds
        spent narrowing the inputs, in the kernels and widening the outputs. An item with a
        room (``rooms``, by item) has its outputs widened straight into it."""
        count = len(items)
        if not 1 <= count <= self.batch:
            raise ValueError(f"{count} items: this Plan runs 1 to {self.batch} at a time")
        with self._lock, np.errstate(over="ignore", under="ignore"):
            t0 = time.perf_counter()
            self._load_inputs(items)
            t1 = time.perf_counter()
            dynamic: dict[str, np.ndarray] = {}
            if self.thread_choice.threads != threads.THREADS:  # the engine's count changed
                self.thread_choice = ThreadChoice(threads.THREADS)
            n = self.thread_choice.next()
            grown = self.scratch.grown
            with jit.run_threads(n):
                for call, step in self._bound_program(count):
                    if call is not None:
                        call()
                    else:
                        self._run_step(step, dynamic)
            if self.scratch.grown != grown:  # a step grew a work buffer a call may hold: make them again
                self._bound.clear()
            t2 = time.perf_counter()
            choice = self.thread_choice
            if choice.record(n, (t2 - t1) / count) and choice.chosen != choice.previous:
                log.info("CPU Plan of %s (%s; batch %d): %d thread%s, measured over its %s runs "
                         "(median %.2f ms on 1 thread, %.2f ms on %d)", self.name, ", ".join(
                             f"{name} {list(self.blob_shapes[name])}" for name in self.input_names),
                         self.batch, choice.chosen, "s" if choice.chosen != 1 else "",
                         "first" if choice.previous is None else "latest",
                         1e3 * choice.median(1), 1e3 * choice.median(choice.threads), choice.threads)
            if any(rooms):
                outputs = [self._outputs(i, dynamic, rooms[i] if i < len(rooms) else None) for i in range(count)]
            else:  # the batch's outputs widened at once
                widened = {name: from_bf16(self._views[name][:count]) for name in self.output_names
                           if name not in dynamic}
                outputs = [{name: widened[name][i] if name in widened else dynamic[name].copy()
                            for name in self.output_names} for i in range(count)]
            return outputs, StageTimes(t1 - t0, t2 - t1, time.perf_counter() - t2)

    def _outputs(self, item: int, dynamic: Mapping[str, np.ndarray], room: OutputRoom | None
                 ) -> dict[str, np.ndarray]:
        """Item ``item``'s outputs widened to fp32: into its room where they fit, else new
        arrays (data-dependent ones copied: the room gets them when the answer is made)."""
        out: dict[str, np.ndarray] = {}
        with contextlib.nullcontext(False) if room is None else room.writing() as writable:
            for name in self.output_names:
                if name in dynamic:
                    out[name] = dynamic[name].copy()
                    continue
                bits = self._views[name][item]
                dest = room.place(name, bits.shape) if writable and room is not None else None
                out[name] = from_bf16(bits) if dest is None else widen_into(bits, dest)
        return out

    def _program_for(self, count: int) -> list[_Prepared]:
        """The steps that run ``count`` items: the whole-batch ones on their first ``count``
        items' views, the item-by-item ones of those items (made once per count)."""
        program = self._programs.get(count)
        if program is None:
            program = [step if step.item >= 0 or count == self.batch else step.first(count)
                       for step in self._program if step.item < count]
            self._programs[count] = program
        return program

    def _bound_program(self, count: int) -> list[tuple[StepCall | None, _Prepared]]:
        """``_program_for(count)``, each step with the call that is its run where it has one
        (``_call``), else None (``_run_step`` runs it): made once per item count and thread cap
        (the calls' task counts follow the cap: call it under ``jit.run_threads``), twice where
        the first making grew a work buffer, so that every call holds the buffer its slot grew
        to."""
        key = (count, jit.kernel_threads())
        bound = self._bound.get(key)
        if bound is None:
            grown = self.scratch.grown
            bound = self._bind(count)
            if self.scratch.grown != grown:
                bound = self._bind(count)
            self._bound[key] = bound
        return bound

    def _bind(self, count: int) -> list[tuple[StepCall | None, _Prepared]]:
        return [(self._call(step), step) for step in self._program_for(count)]

    def _call(self, step: _Prepared) -> StepCall | None:
        """The step's run as one call made once: the compiled call storing its results
        (``Kernel.store_call``), or the copies of a bf16-native step whose results are views of
        its input (``Kernel.view_copies``; where its outputs may overlap its inputs, the views
        are of a work buffer the inputs are copied into first, as ``_run_step`` copies them).
        None where a view is strided: a reshape of it would be a copy, and the call would hold
        one run's data."""
        if step.kind is not StepKind.STORE and step.kind is not StepKind.BF16_NATIVE:
            return None
        outs = [view for view, _ in step.outs]
        if not all(view.flags.c_contiguous for view in (*step.ins, *outs)):
            return None
        if step.kind is StepKind.STORE:
            return step.kernel.store_call(step.ins, outs, step.post)
        ins = step.ins
        if step.copy_inputs:  # the work buffers' slots: "copy0", "copy1", ... (grown: made again)
            ins = [self.scratch.get(f"copy{i}", x.shape, x.dtype.type) for i, x in enumerate(step.ins)]
        pairs = step.kernel.view_copies(ins, outs)
        if pairs is None:
            return None
        return CopyCall([*zip(ins, step.ins), *pairs] if step.copy_inputs else pairs)

    def profile(self, inputs: Mapping[str, np.ndarray], runs: int = 10) -> list[StepTime]:
        """Each step's wall time, median of ``runs`` runs of a full batch of ``inputs`` after
        one warm-up (a step run per item: its items' sum; alias steps and in-place Concats,
        which run nothing, left out)."""
        order = [s.name for s in self._steps]
        samples: dict[str, list[float]] = {name: [] for name in order}
        with self._lock, np.errstate(over="ignore", under="ignore"), jit.run_threads(threads.THREADS):
            for r in range(runs + 1):
                self._load_inputs([inputs] * self.batch)
                dynamic: dict[str, np.ndarray] = {}
                took = dict.fromkeys(order, 0.0)
                for call, step in self._bound_program(self.batch):
                    t0 = time.perf_counter()
                    if call is not None:
                        call()
                    else:
                        self._run_step(step, dynamic)
                    took[step.name] += time.perf_counter() - t0
                if r:
                    for name in order:
                        samples[name].append(took[name])
        return [StepTime(s.name, s.kernel.layer.type, tuple(s.fused), 1e3 * float(np.median(samples[s.name])))
                for i, s in enumerate(self._steps) if not (s.kernel.alias or i in self._in_place)]

    def _load_inputs(self, items: Sequence[Mapping[str, np.ndarray]]) -> None:
        """Narrow the items' inputs into their arena slots (one pass per input blob), checking
        names and shapes."""
        for i, inputs in enumerate(items):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                where = f" (item {i})" if len(items) > 1 else ""
                raise ValueError(f"missing inputs{where}: {', '.join(missing)}")
        for name in self.input_names:
            want = self.blob_shapes[name]
            arrays = [np.asarray(inputs[name], dtype=np.float32) for inputs in items]
            for i, arr in enumerate(arrays):
                if arr.shape != want:
                    where = f" (item {i})" if len(items) > 1 else ""
                    raise ValueError(f"input '{name}'{where} has shape {arr.shape}, the plan expects {want}")
            batch = arrays[0][None] if len(arrays) == 1 else np.stack(arrays)
            self._narrow(batch, self._views[name][:len(arrays)], batch=True)

    def _run_step(self, step: _Prepared, dynamic: dict[str, np.ndarray]) -> None:
        """Run one prepared step: its outputs into their arena views (data-dependent ones into
        ``dynamic``, by name)."""
        kind, kernel, ins, outs, post, name, copy_inputs, _ = step
        if kind is StepKind.ALIAS:
            # no compute; only data-dependent blobs need passing along by name
            for i, (blob, dyn) in enumerate(outs):
                if dyn:
                    dynamic[blob] = dynamic[ins[kernel.source(i)]]
            return
        if kind is StepKind.BF16_NATIVE:
            if copy_inputs:
                ins = [x.copy() for x in ins]
            into = getattr(kernel, "forward_into", None)
            if into is not None:
                into(ins, [view for view, _ in outs])
                return
            ys = kernel.forward(ins)
            for (view, _), y in zip(outs, ys):
                np.copyto(view, y)
            return
        if kind is StepKind.STORE:
            kernel.forward_store(ins, [view for view, _ in outs], post)
            return
        scratch_get = self.scratch.get
        if kind is StepKind.RAW_INPUTS:
            ys = kernel.forward_bf16([dynamic[x] if isinstance(x, str) else x for x in ins])
        else:
            ys = kernel.forward([
                dynamic[x] if isinstance(x, str)
                else widen_into(x, scratch_get(f"in{i}", x.shape))
                for i, x in enumerate(ins)
            ])
        for act in post:
            ys = act.forward(ys)
        for (view, exact), y in zip(outs, ys):
            if isinstance(view, str):
                dynamic[view] = np.array(y, dtype=np.float32)  # a copy: y may be scratch
                continue
            if y.shape != view.shape:
                raise RuntimeError(f"{name}: produced {y.shape}, planned {view.shape}")
            if exact:
                narrow_exact_into(y, view)
            else:
                self._narrow(y, view, batch=step.item < 0)

    def _narrow(self, y: np.ndarray, view: np.ndarray, batch: bool = False) -> None:
        """Round an fp32 result (or input) into its bf16 arena view: one compiled pass (the
        element-wise kernel with no ops) where both are contiguous float32 / bf16, else numpy's
        passes (``bf16.to_bf16``); the same bits either way. Measured on one core: 3.3 us for
        the digits example's 10 and 64 values against numpy's 15.6 us; 200,704 values 71 us
        against 203 us."""
        if y.dtype == np.float32 and y.flags.c_contiguous and view.flags.c_contiguous:
            rows, cols = jit_elementwise.rows_cols(y.shape, batch)
            with jit.launch(ELEMENT_WORK * y.size):
                jit_elementwise.activation(y.reshape(rows, cols), _NO_OPS, jit.task_count(rows),
                                           view.reshape(rows, cols))
            return
        to_bf16(y, out=view, scratch=self.scratch.get("narrow", y.size, np.uint32))


_NO_OPS = jit.epilogue_ops(0, ())
