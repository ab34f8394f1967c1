"""Vulkan executor: a Graph compiled for (device, input shapes, precision) into a Plan whose
instances replay one recorded command buffer per inference (DESIGN §7).

Compile (once per Plan):
- every layer gets its `VulkanLayer` (vkserve.devices.vulkan.layers); a trailing run of layers
  whose class is not `usable` here but has a `host_step` (detection output) runs on the host
  in fp32 afterwards (the host tail); every other layer without a Vulkan implementation is
  named in one `PlanError`;
- weights are converted to the storage type (fp16 in the fp16 modes) and uploaded once into
  one device-local buffer shared by all instances;
- pipelines come from the device's PipelineCache (a warm cache compiles nothing), fetched in
  parallel threads because cold builds are independent;
- blobs are packed into ONE arena by lifetime (`vkserve.devices.arena.plan_offsets`, offsets
  aligned to minStorageBufferOffsetAlignment); aliasing layers (Split, Reshape, ...) reuse
  their input's bytes, an elementwise layer takes over an input that dies there, and a
  Concat whose inputs are contiguous runs of its output (`VulkanLayer.input_windows`) has
  their producers write straight into its output and records no copies;
- a convolution or Gemm followed by a residual sum (and ReLU) becomes one layer, a Permute
  is written by the layer before it where that layer can, a constant scale after a Gemm goes
  into its weights and an activation layer into its epilogue (engine.fusion);
- a barrier is placed only before a dispatch that touches arena bytes another dispatch
  since the previous barrier wrote (or writes bytes one read).

Run (per inference, per `PlanInstance`): numpy writes the inputs into the instance's mapped
staging buffer (fp32: cast_input converts them on the GPU), one vkQueueSubmit of the recorded
command buffer (the inputs into the arena by copies or cast_input, all the other dispatches,
arena->staging copies), a sliced fence wait, and the outputs are copied out of staging. No
per-layer Python work. An input lying in a client's shared memory is read by the GPU from there
where the device imports host memory (`host_import`): the submission is then an input command
buffer recorded for that place (kept for the next runs from it) and one of the other steps.

Host-finished layers (data-dependent outputs, e.g. detection output): a VulkanLayer may also
define `host_readback() -> {scratch key: bytes}` and `finish_on_host({key: uint8 view}) ->
[outputs]`. Its dispatches run in the command buffer like any other; those scratch bytes are
read back with the outputs, and `finish_on_host` turns them into the layer's outputs after the
fence (before the host tail). Its outputs get no arena bytes, so no dispatch may read them. A
trailing such layer whose class says `usable(caps, layer, in_shapes)` is False runs on the host
tail instead.

Instances own an arena, a staging buffer, descriptor sets, command buffers and a fence;
they come from `Plan.acquire()` (several may run at once, each on its own thread), and their
buffers come from the device's MemoryPool.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import itertools
import logging
import math
import os
import pkgutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from vkserve.devices.arena import Interval, align_up, plan_offsets
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.errors import UnsupportedError
from vkserve.devices.host_regions import REGIONS
from vkserve.devices.output_room import OutputRoom
from vkserve.devices.timing import StageTimes
from vkserve.devices.vulkan import layers as layer_package
from vkserve.devices.vulkan.context import Buffer, MemoryKind, VulkanContext
from vkserve.devices.vulkan.descriptors import DescriptorPool
from vkserve.devices.vulkan.engine.fusion import (
    fold_activations,
    fold_channel_norms,
    fold_permutes,
    fold_residuals,
    fold_row_norms,
    fold_scales,
)
from vkserve.devices.vulkan.engine.tuning import tuned_dispatches
from vkserve.devices.vulkan.errors import VulkanError, check
from vkserve.devices.vulkan.host_import import ImportedRegion
from vkserve.devices.vulkan.image import Image, ImageBinding, ImageFormat, Sampler
from vkserve.devices.vulkan.layers.base import MAX_GROUPS, VULKAN_LAYERS, Dispatch, VulkanLayer
from vkserve.devices.vulkan.pipeline import ComputePipeline, pack_scalars
from vkserve.devices.vulkan.shader_options import ShaderOptions
from vkserve.models.graph import Graph, Layer, infer_shapes
from vkserve.models.layers import Shape

if TYPE_CHECKING:
    from vkserve.devices.progress import ProgressFn
    from vkserve.devices.vulkan.device import VulkanDevice

log = logging.getLogger(__name__)

#: floats a weight upload stages at a time (64 MiB of host memory at most)
UPLOAD_WINDOW = 16 << 20

STAGING_ALIGN = 64


class PlanError(ValueError):
    """The graph cannot be compiled for the Vulkan engine (all problems named at once)."""


def engine_precision(caps: DeviceCaps, name: str) -> Precision:
    """'fp32' -> FP32; 'fp16' -> fp16 arithmetic where the device has it, else fp16 storage
    (the packed mode is not used by the engine)."""
    if name == "fp32":
        return Precision.FP32
    if name != "fp16":
        raise ValueError(f"precision {name!r}: expected fp32 or fp16")
    if caps.fp16_arithmetic and caps.fp16_storage:
        return Precision.FP16_ARITHMETIC
    if caps.fp16_storage:
        return Precision.FP16_STORAGE
    raise PlanError(f"device {caps.index} ({caps.name}) has no 16-bit storage: use fp32")


def storage_dtype(precision: Precision) -> np.dtype[Any]:
    if precision is Precision.FP32:
        return np.dtype(np.float32)
    if precision in (Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC):
        return np.dtype(np.float16)
    raise PlanError(f"precision {precision.value} is not supported by the engine")


_loaded = False
_load_lock = threading.Lock()


def load_layer_modules() -> None:
    """Import every module of devices.vulkan.layers so their @register calls run."""
    global _loaded
    with _load_lock:
        if not _loaded:
            for info in pkgutil.iter_modules(layer_package.__path__):
                importlib.import_module(f"{layer_package.__name__}.{info.name}")
            _loaded = True


def supported_layer_types() -> frozenset[str]:
    """Layer types a Plan runs: the registered layers, and Input (the Plan's staging copy)."""
    load_layer_modules()
    return frozenset(VULKAN_LAYERS) | {"Input"}


# -------------------------------------------------------------------------------- compile


@dataclasses.dataclass
class _Storage:
    """A run of arena bytes: one blob, or blobs sharing bytes (aliases, in-place outputs)."""

    nbytes: int
    start: int  # step that first writes it
    end: int  # one past the last step that reads it
    blobs: list[str]
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class _Binding:
    # "arena" (the instance's), "weights" (shared), "staging" (the instance's), or "image":
    # the arena bytes copied into the instance's 3D image of `extent` before the dispatch
    buffer: str
    offset: int
    size: int
    extent: tuple[int, int, int] = (0, 0, 0)


@dataclasses.dataclass
class Step:
    """One dispatch, resolved: everything an instance needs to write sets and record."""

    pipeline: ComputePipeline
    bindings: list[_Binding]
    push: bytes
    groups: tuple[int, int, int]
    barrier_before: bool
    label: str
    shader: str
    dispatch: Dispatch | None = None  # as the layer declared it (default local size): the tuner's
    batched: bool = False  # one dispatch runs every item of a batch (Dispatch.batched)


@dataclasses.dataclass(frozen=True)
class _Transfer:
    blob: str
    shape: Shape
    arena_offset: int
    staging_offset: int
    nbytes: int


class _HostTail:
    """The trailing layers run on the host in fp32 on the Vulkan part's outputs, by their
    classes' `host_step` (detection output is sequential post-processing)."""

    def __init__(self, layers: Sequence[Layer], shapes: Mapping[str, Shape]) -> None:
        self.steps = [(VULKAN_LAYERS[layer.type].host_step(  # type: ignore[attr-defined]
            layer, [shapes[b] for b in layer.inputs]), layer) for layer in layers]

    def run(self, blobs: dict[str, np.ndarray]) -> None:
        for step, layer in self.steps:
            ys = step([blobs[b] for b in layer.inputs])
            blobs.update(zip(layer.outputs, (np.asarray(y, dtype=np.float32) for y in ys)))


def _split_tail(layers: Sequence[Layer], on_vulkan: Callable[[Layer], bool]) -> int:
    """Index where the trailing run of layers that run on the host (not usable on Vulkan, with
    a `host_step`) starts."""
    k = len(layers)
    while k > 0:
        layer = layers[k - 1]
        if on_vulkan(layer) or not hasattr(VULKAN_LAYERS.get(layer.type), "host_step"):
            break
        k -= 1
    return k


def _host_finished(vl: VulkanLayer | None) -> bool:
    return vl is not None and hasattr(vl, "finish_on_host")


class Plan:
    """A Graph compiled for one Vulkan device, input shapes and precision.

    `acquire()` hands out a `PlanInstance` (context manager; back to the plan on exit), creating
    up to `max_instances`; `run()` is acquire + run + release. Close the plan before its device.
    """

    def __init__(self, device: VulkanDevice, graph: Graph,
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 precision: Precision = Precision.FP32,
                 outputs: Sequence[str] | None = None, max_instances: int = 4,
                 tuned: bool = True, progress: ProgressFn | None = None) -> None:
        t0 = time.perf_counter()
        self.use_tuning = tuned  # local sizes from the device's tuning file (engine.tuning)
        load_layer_modules()
        self.device = device
        self.ctx = device.ctx
        self.file = graph.file
        self.sources_full_logged = False  # (PlanInstance._input_source)
        #: where a binding may start in a buffer (an input read in place by cast_input)
        self.min_binding_offset = max(16, int(self.ctx.caps.properties.get("minStorageBufferOffsetAlignment", 16)))
        self.pool = device.pool
        self.precision = Precision(precision)
        self.dtype = storage_dtype(self.precision)
        self.elem = self.dtype.itemsize
        # Inputs are staged in fp32 and converted by the GPU (cast_input.comp): numpy's
        # fp32 -> fp16 pass costs more than the whole inference of a small model. Outputs the
        # same way back (cast_output.comp): deeplabv3_mbv3's 21x256x256 output took 5.4 ms per
        # run in fp16 against 1.9 ms in fp32 on an H100 at equal GPU time.
        self.input_dtype = np.dtype(np.float32)
        self.output_dtype = np.dtype(np.float32)
        self.max_instances = max_instances
        self.input_names = list(graph.input_names)
        self.output_names = list(outputs) if outputs is not None else list(graph.output_names)
        given = {n: graph.blob_shapes[n] for n in self.input_names if n in graph.blob_shapes}
        given.update({k: tuple(int(v) for v in s) for k, s in (input_shapes or {}).items()})
        self.blob_shapes: dict[str, Shape] = infer_shapes(graph.layers, graph.file, given)
        self.weights: Buffer | None = None
        self._cond = threading.Condition()
        # instances by batch size (items run together in one submission, see PlanInstance)
        self._idle: dict[int, list[PlanInstance]] = {}
        self._count: dict[int, int] = {}
        self._closed = False
        compiles_before = device.pipelines.stats.glsl_compiles
        try:
            self._compile(graph, progress)
            self.pool.add_reclaimer(self.drop_idle)
        except BaseException:
            self._release_weights()
            raise
        self.glsl_compiles = device.pipelines.stats.glsl_compiles - compiles_before
        self.load_seconds = time.perf_counter() - t0

    # -- compile ------------------------------------------------------------------------------

    def _on_vulkan(self, layer: Layer) -> bool:
        cls = VULKAN_LAYERS.get(layer.type)
        usable = getattr(cls, "usable", None)
        return cls is not None and (usable is None or bool(usable(
            self.ctx.caps, layer, [self.blob_shapes[b] for b in layer.inputs])))

    def _compile(self, graph: Graph, progress: ProgressFn | None) -> None:
        layers = graph.layers
        k = _split_tail(layers, self._on_vulkan)
        body, tail_layers = layers[:k], layers[k:]
        problems: list[str] = []
        missing = [lay for lay in body if lay.type != "Input" and not self._on_vulkan(lay)]
        if missing:
            types = sorted({lay.type for lay in missing})
            problems.append("no Vulkan implementation for: " + "; ".join(
                f"{t} ({', '.join(lay.name for lay in missing if lay.type == t)})"
                for t in types))
        vlayers: list[tuple[Layer, VulkanLayer | None]] = []
        for layer in body:
            if layer.type == "Input":
                vlayers.append((layer, None))
                continue
            if any(layer is lay for lay in missing):
                continue  # named above
            try:
                vl = VULKAN_LAYERS[layer.type](
                    layer, [self.blob_shapes[b] for b in layer.inputs],
                    [self.blob_shapes[b] for b in layer.outputs], self.precision)
                vl.specialize(self.ctx.caps)
            except UnsupportedError as e:
                problems.append(f"{layer.name} ({layer.type}, line {layer.line}): {e}")
                continue
            vlayers.append((layer, vl))
        self.folded_residuals = self.folded_permutes = self.folded_scales = self.folded_activations = 0
        self.folded_norms = 0
        if not problems:
            keep = set(self.output_names) | {b for lay in tail_layers for b in lay.inputs}
            vlayers, beside_norms = fold_channel_norms(vlayers, self.blob_shapes, keep)
            vlayers, self.folded_permutes = fold_permutes(vlayers, self.blob_shapes, keep)
            self.folded_permutes += beside_norms
            vlayers, self.folded_scales = fold_scales(vlayers, self.blob_shapes, keep)
            vlayers, self.folded_activations = fold_activations(vlayers, keep)
            vlayers, self.folded_residuals = fold_residuals(vlayers, self.blob_shapes, keep)
            self.folded_norms = fold_row_norms(vlayers, keep)
        self.finishers = [(i, layer, vl) for i, (layer, vl) in enumerate(vlayers)
                          if _host_finished(vl)]
        finished = {b for _, lay, _ in self.finishers for b in lay.outputs}
        for lay in body:
            if set(lay.inputs) & finished:
                problems.append(f"{lay.name} ({lay.type}, line {lay.line}) reads a host-side "
                                f"output ({', '.join(sorted(set(lay.inputs) & finished))})")
        produced_body = {b for lay in body for b in lay.outputs} - finished
        self.tail = _HostTail(tail_layers, self.blob_shapes) if tail_layers else None
        needed = [n for n in self.output_names if n in produced_body]
        if tail_layers:
            needed += [b for lay in tail_layers for b in lay.inputs
                       if b in produced_body and b not in needed]
        unknown = [n for n in self.output_names if n not in self.blob_shapes]
        if unknown:
            problems.append(f"requested outputs not in the graph: {', '.join(unknown)}")
        if problems:
            raise PlanError("cannot run on the Vulkan engine:\n  " + "\n  ".join(problems))
        self.readback_names = needed
        self._lay_out(vlayers, needed)
        self._upload_weights(vlayers)
        self._resolve(vlayers, progress)

    def _padded_bytes(self, shape: Shape) -> int:
        """Blobs take whole vec4s so that vec4 shaders never touch a neighbour's bytes."""
        return max(1, -(-math.prod(shape) // 4)) * 4 * self.elem

    def _lay_out(self, vlayers: list[tuple[Layer, VulkanLayer | None]],
                 readback: list[str]) -> None:
        """Storages for every blob and scratch, their lifetimes in steps (0 = input copies,
        layer i = i + 1, then the readback copies), and arena offsets."""
        final = len(vlayers) + 1
        self.alignment = max(16, int(self.ctx.caps.properties.get(
            "minStorageBufferOffsetAlignment", 16)))
        last_read: dict[str, int] = {}
        for i, (layer, _) in enumerate(vlayers):
            for b in layer.inputs:
                last_read[b] = i + 1
        for b in readback:
            last_read[b] = final + 1
        self._storages: list[_Storage] = []
        self._storage_of: dict[str, int] = {}
        self._blob_offset: dict[str, int] = {}  # bytes into its storage (Concat inputs)
        placed = self._place_concat_inputs(vlayers)
        self._scratch: dict[tuple[int, str], int] = {}
        self.naive_bytes = 0  # every blob and scratch but alias outputs in bytes of its own

        def new_storage(blob: str, nbytes: int, step: int) -> int:
            self._storages.append(_Storage(nbytes, step, step + 1, [blob]))
            self.naive_bytes += align_up(nbytes, self.alignment)
            return len(self._storages) - 1

        def inplace_source(layer: Layer, vl: VulkanLayer, out: str, step: int) -> int | None:
            """The storage of an input that `out` may take over: same element count, bound
            to one input of this layer only, at the storage's start (`out` will be: element i
            read and written at one address; a Concat's later inputs are not), and no blob of
            it read after this step."""
            bound = [self._storage_of[b] for b in layer.inputs]
            for k in vl.inplace_inputs:
                if k >= len(layer.inputs):
                    continue
                src = layer.inputs[k]
                sid = bound[k]
                if (bound.count(sid) == 1 and not self._blob_offset.get(src, 0)
                        and math.prod(self.blob_shapes[src]) == math.prod(self.blob_shapes[out])
                        and max(last_read.get(b, 0) for b in self._storages[sid].blobs) <= step):
                    return sid
            return None

        self.inputs_staged: list[str] = []
        zeroed_storages: list[int] = []
        for i, (layer, vl) in enumerate(vlayers):
            step = i + 1
            if vl is None:  # Input: written by the copy from staging
                for b in layer.outputs:
                    self._storage_of[b] = new_storage(b, self._padded_bytes(self.blob_shapes[b]), 0)
                    self.inputs_staged.append(b)
                continue
            for b in layer.inputs:
                st = self._storages[self._storage_of[b]]
                st.end = max(st.end, step + 1)
            if i in self.zero_copy:  # its output's storage exists: its inputs' producers made it
                continue
            if vl.aliases_input:
                for j, b in enumerate(layer.outputs):
                    sid = self._storage_of[layer.inputs[j if len(layer.inputs) > 1 else 0]]
                    self._storage_of[b] = sid
                    self._storages[sid].blobs.append(b)
                continue
            for j, b in enumerate(() if _host_finished(vl) else layer.outputs):
                nbytes = self._padded_bytes(self.blob_shapes[b])
                if b in placed:  # a window of a Concat's output
                    whole, self._blob_offset[b] = placed[b]
                    if whole not in self._storage_of:
                        self._storage_of[whole] = new_storage(
                            whole, self._padded_bytes(self.blob_shapes[whole]), step)
                    sid = self._storage_of[whole]
                    self._storages[sid].blobs.append(b)
                    self._storage_of[b] = sid
                    continue
                sid = inplace_source(layer, vl, b, step) if j == 0 else None
                if sid is None:
                    sid = new_storage(b, nbytes, step)
                else:
                    self._storages[sid].blobs.append(b)
                    self.naive_bytes += align_up(nbytes, self.alignment)
                self._storage_of[b] = sid
            zeroed = vl.zeroed_scratch()
            for key, count in vl.scratch().items():
                sid = new_storage(f"{layer.name}/s:{key}", max(1, -(-count // 4)) * 4 * self.elem,
                                  0 if key in zeroed else step)
                if key in zeroed:  # zeros from the run's start (_record) until this layer
                    self._storages[sid].end = step + 1
                    zeroed_storages.append(sid)
                self._scratch[(i, key)] = sid
        for b in readback:
            self._storages[self._storage_of[b]].end = final + 1
        for i, _, vl in self.finishers:
            for key in vl.host_readback():  # type: ignore[attr-defined]
                self._storages[self._scratch[(i, key)]].end = final + 1
        offsets, total = plan_offsets([Interval(s.nbytes, s.start, s.end) for s in self._storages],
                                      self.alignment)
        for st, off in zip(self._storages, offsets):
            st.offset = off
        #: (offset, bytes) of the arena that every run starts by filling with zeros
        self.zeroed_spans = [(self._storages[sid].offset, self._storages[sid].nbytes) for sid in zeroed_storages]
        self.arena_bytes = max(total, self.alignment)
        # a batch's items' arenas lie side by side, this many bytes apart (PlanInstance)
        self.arena_stride = align_up(self.arena_bytes, self.alignment)

    def _place_concat_inputs(self, vlayers: list[tuple[Layer, VulkanLayer | None]]) -> dict[str, tuple[str, int]]:
        """Input blob -> (Concat output, byte offset) for every Concat whose inputs can all be
        written in place by their producers (`self.zero_copy` gets the Concats' indices): each
        input a window of the output, produced by a layer of its own storage (not an input,
        alias or host-finished output, nor another such Concat), once in one Concat, at an
        offset the device can bind, and a whole number of vec4s unless it is the last (blobs
        are padded to vec4s, and a vec4 shader may write the padding)."""
        self.zero_copy: set[int] = set()
        own = {b: vl for layer, vl in vlayers for b in layer.outputs
               if vl is not None and not vl.aliases_input and not _host_finished(vl)}
        placed: dict[str, tuple[str, int]] = {}
        for i, (layer, vl) in enumerate(vlayers):
            windows = vl.input_windows() if vl is not None else None
            if windows is None or len(set(layer.inputs)) != len(layer.inputs):
                continue
            last = len(layer.inputs) - 1
            if all(b in own and b not in placed and own[b].input_windows() is None
                   and (start * self.elem) % self.alignment == 0
                   and (k == last or math.prod(self.blob_shapes[b]) % 4 == 0)
                   for k, (b, start) in enumerate(zip(layer.inputs, windows))):
                placed.update((b, (layer.outputs[0], start * self.elem)) for b, start in zip(layer.inputs, windows))
                self.zero_copy.add(i)
        return placed

    def _upload_weights(self, vlayers: list[tuple[Layer, VulkanLayer | None]]) -> None:
        """Lay out and upload every layer's weights into one device buffer. The layouts are
        made twice, once for their sizes (the buffer's), once to upload them a layer at a time,
        so that a load holds one layer's layouts, not the model's (vgg16: +0.07-0.14 s of a
        2-3 s load on lavapipe, against 528 MiB of fp32 layouts held at once)."""
        self._weight_at: dict[tuple[int, str], tuple[int, int]] = {}
        total = 0
        for i, (_, vl) in enumerate(vlayers):
            if vl is None:
                continue
            for key, arr in vl.weights().items():
                nbytes = self._padded_bytes((np.size(arr),))
                self._weight_at[(i, key)] = (total, nbytes)
                total = align_up(total + nbytes, self.alignment)
        self.weight_bytes = total
        if not total:
            return
        self.weights = self.pool.acquire(total, MemoryKind.DEVICE)
        if self.dtype == np.float32:
            self._upload_values(self.weights, self._layouts(vlayers), total // self.elem)
        else:
            self._upload_converted(self._layouts(vlayers), total // self.elem)

    def _layouts(self, vlayers: list[tuple[Layer, VulkanLayer | None]]) -> Iterator[tuple[int, np.ndarray]]:
        """Each layer's weight layouts again, made when the upload reaches them: (first fp32
        element, values), element i of the storage type at byte i * elem."""
        for i, (layer, vl) in enumerate(vlayers):
            if vl is None:
                continue
            for key, arr in vl.weights().items():
                at, nbytes = self._weight_at[(i, key)]
                data = np.asarray(arr, dtype=np.float32).ravel()
                if self._padded_bytes((data.size,)) != nbytes:
                    raise RuntimeError(f"{layer.name}: weight {key!r} laid out in {data.size} values "
                                       f"after {nbytes // self.elem} the first time")
                yield at // self.elem, data

    def _upload_values(self, dst: Buffer, values: Iterator[tuple[int, np.ndarray]], count: int) -> None:
        """fp32 `values` ((first element, array), ascending) into `dst`'s first `count` floats,
        zeros between them, a window of at most `UPLOAD_WINDOW` floats at a time through one
        host staging buffer, each array taken from `values` when the window reaches it. (A
        whole-model fp32 blob and a staging buffer of its size held the weights three times
        over beside their layouts: vgg16, 528 MiB each.)"""
        window = min(count, UPLOAD_WINDOW)
        staging = self.ctx.create_buffer(window * 4, MemoryKind.HOST)
        try:
            view = staging.array(np.float32, window)
            pending = next(values, None)
            for lo in range(0, count, window):
                hi = min(count, lo + window)
                view[: hi - lo] = 0
                while pending is not None and pending[0] < hi:
                    at, data = pending
                    a, b = max(at, lo), min(at + data.size, hi)
                    view[a - lo:b - lo] = data[a - at:b - at]
                    if at + data.size > hi:
                        break  # it goes on in the next window
                    pending = next(values, None)
                staging.flush(0, (hi - lo) * 4)
                self.ctx.copy(staging, dst, (hi - lo) * 4, 0, lo * 4)
        finally:
            staging.destroy()

    def _upload_converted(self, values: Iterator[tuple[int, np.ndarray]], count: int) -> None:
        """Upload fp32 weights and convert them to the storage type on the GPU (cast_input):
        numpy's fp32 -> fp16 pass was 0.52 of vgg16's 0.86 s warm load (cProfile, lavapipe)."""
        assert self.weights is not None
        staged = self.ctx.create_buffer(count * 4, MemoryKind.DEVICE)
        descriptors: DescriptorPool | None = None
        try:
            self._upload_values(staged, values, count)
            pipeline = self.device.pipeline("cast_input", self.precision, (64, 1, 1), ())
            # one dispatch per run of vec4s the x dimension can count
            step = MAX_GROUPS // 1024 * 1024 * 64
            runs = [(lo, min(count // 4, lo + step)) for lo in range(0, count // 4, step)]
            descriptors = DescriptorPool(self.ctx, len(runs), 2 * len(runs))
            sets = [descriptors.allocate(pipeline.set_layout,
                                         [(staged, lo * 16, (hi - lo) * 16),
                                          (self.weights, lo * 4 * self.elem, (hi - lo) * 4 * self.elem)])
                    for lo, hi in runs]
            vk = self.ctx.vk

            def record(cmd: Any) -> None:
                vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
                for (lo, hi), dset in zip(runs, sets):
                    vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                               pipeline.layout, 0, 1, [dset], 0, None)
                    push = pack_scalars((hi - lo,))
                    vk.vkCmdPushConstants(cmd, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                          0, len(push), vk.ffi.from_buffer(push))
                    vk.vkCmdDispatch(cmd, -(-(hi - lo) // 64), 1, 1)

            self.ctx.run_once(record)
        finally:
            if descriptors is not None:
                descriptors.destroy()
            staged.destroy()

    def _stage(self) -> None:
        """Staging layout: inputs (fp32 when the GPU converts them) then outputs."""
        offset = 0
        self.copy_in: list[_Transfer] = []
        self.copy_out: list[_Transfer] = []
        for names, out, elem in ((self.inputs_staged, self.copy_in, self.input_dtype.itemsize),
                                 (self.readback_names, self.copy_out, self.output_dtype.itemsize)):
            for b in names:
                shape = self.blob_shapes[b]
                nbytes = math.prod(shape) * elem
                out.append(_Transfer(b, shape, self._blob_at(b),
                                     offset, nbytes))
                offset = align_up(offset + nbytes, STAGING_ALIGN)
        self.copy_raw: list[tuple[int, _Transfer]] = []  # (index in finishers, scratch bytes)
        for f, (i, _, vl) in enumerate(self.finishers):
            for key, nbytes in vl.host_readback().items():  # type: ignore[attr-defined]
                st = self._storages[self._scratch[(i, key)]]
                if nbytes > st.nbytes:
                    raise PlanError(f"{vl.layer.name}: reads back {nbytes} bytes of scratch "
                                    f"{key!r}, which has {st.nbytes}")
                self.copy_raw.append((f, _Transfer(key, (nbytes,), st.offset, offset, nbytes)))
                offset = align_up(offset + nbytes, STAGING_ALIGN)
        self.staging_bytes = max(offset, STAGING_ALIGN)

    def _resolve(self, vlayers: list[tuple[Layer, VulkanLayer | None]],
                 progress: ProgressFn | None) -> None:
        """Pipelines, bindings, push constants, group counts and barriers of every dispatch;
        ``progress`` hears of each pipeline built (from the pool's threads)."""
        self._stage()
        todo: list[tuple[int, Layer, Dispatch]] = []
        if self.input_dtype != self.dtype:  # the first dispatches convert the inputs
            for t in self.copy_in:
                i = next(k for k, (layer, _) in enumerate(vlayers) if t.blob in layer.outputs)
                n4 = -(-math.prod(t.shape) // 4)
                todo.append((i, vlayers[i][0], Dispatch("cast_input", (f"staging:{t.blob}", t.blob),
                                                        (n4, 1, 1), (n4,))))
        for i, (layer, vl) in enumerate(vlayers):
            if vl is not None and not vl.aliases_input and i not in self.zero_copy:
                vl.item_stride = self.arena_stride // self.elem
                todo.extend((i, layer, d) for d in vl.dispatches())
        if self.output_dtype != self.dtype:  # the last dispatches convert the outputs
            for t in self.copy_out:
                i = max(k for k, (layer, _) in enumerate(vlayers) if t.blob in layer.outputs)
                n4 = -(-math.prod(t.shape) // 4)
                todo.append((i, vlayers[i][0], Dispatch("cast_output", (t.blob, f"staging_out:{t.blob}"),
                                                        (n4, 1, 1), (n4,))))
        declared = [d for _, _, d in todo]
        # Tuned local sizes replace the layers' defaults where the tuning file has them; a new
        # local size is a new pipeline key and a new group count (ceil(global / local)).
        chosen = tuned_dispatches(self.device, self.precision, declared) if self.use_tuning \
            else declared
        self.tuned_count = sum(a is not b for a, b in zip(chosen, declared))
        todo = [(i, layer, d) for (i, layer, _), d in zip(todo, chosen)]
        requests = sorted({(d.shader, d.local_size, tuple(d.spec_constants), d.images)
                           for _, _, d in todo}, key=repr)
        workers = max(1, min(8, os.cpu_count() or 1, len(requests)))
        finished = itertools.count(1)

        image_options = ShaderOptions.for_precision(self.precision).replace(image_storage=True)

        def build(r: tuple[str, Any, tuple[Any, ...], bool]) -> ComputePipeline:
            pipeline = self.device.pipeline(r[0], image_options if r[3] else self.precision, r[1], r[2])
            if progress is not None:
                progress(next(finished), len(requests), r[0])
            return pipeline

        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            built = dict(zip(requests, ex.map(build, requests)))
        self.steps: list[Step] = []
        #: the leading steps that convert the inputs (cast_input, in copy_in's order); none
        #: where the inputs are copied into the arena as they are
        self.input_steps = len(self.copy_in) if self.input_dtype != self.dtype else 0
        pending_reads: list[tuple[int, int]] = []
        pending_writes: list[tuple[int, int]] = []
        self.barrier_count = 0
        for (i, layer, d), default in zip(todo, declared):
            pipeline = built[(d.shader, d.local_size, tuple(d.spec_constants), d.images)]
            label = f"{layer.name} ({layer.type}) {d.shader}"
            if len(d.bindings) < pipeline.binding_count:
                raise PlanError(f"{label}: {len(d.bindings)} bindings for a shader with "
                                f"{pipeline.binding_count}")
            bindings, reads, writes = [], [], []
            for name in d.bindings:
                binding = self._binding(i, layer, name, label)
                bindings.append(binding)
                if binding.buffer == "image":  # copied from the arena before the dispatch
                    if d.batched:
                        raise PlanError(f"{label}: a batched dispatch reads an image ({name!r})")
                    reads.append((binding.offset, binding.offset + binding.size))
                    continue
                if binding.buffer != "arena":
                    if d.batched and binding.buffer == "staging":
                        raise PlanError(f"{label}: a batched dispatch binds staging ({name!r})")
                    continue
                span = (binding.offset, binding.offset + binding.size)
                (writes if name in layer.outputs or name.startswith("s:") else reads).append(span)
            push = pack_scalars(d.push_constants)
            if len(push) < pipeline.push_constant_size:
                raise PlanError(f"{label}: {len(push)} bytes of push constants, the shader "
                                f"reads {pipeline.push_constant_size}")
            groups = tuple(max(1, -(-g // max(s, 1))) for g, s in zip(d.global_size, d.local_size))
            if max(groups) > MAX_GROUPS:
                raise PlanError(f"{label}: {groups} work groups exceed {MAX_GROUPS} per dimension")
            barrier = (_overlaps(reads + writes, pending_writes)
                       or _overlaps(writes, pending_reads))
            if barrier:
                pending_reads, pending_writes = [], []
                self.barrier_count += 1
            pending_reads += reads
            pending_writes += writes
            self.steps.append(Step(pipeline, bindings, push[:pipeline.push_constant_size],
                                    groups, barrier, label, d.shader,  # type: ignore[arg-type]
                                    default, d.batched))

    def _binding(self, i: int, layer: Layer, name: str, label: str) -> _Binding:
        if name.startswith("img:"):
            if name[4:] not in layer.inputs:
                raise PlanError(f"{label}: binding {name!r} is not an input blob of the layer")
            shape = self.blob_shapes[name[4:]]
            if len(shape) > 3:
                raise PlanError(f"{label}: a {len(shape)}-D blob cannot be a 3D image ({name!r})")
            c, h, w = (1,) * (3 - len(shape)) + tuple(shape)
            return _Binding("image", self._blob_at(name[4:]), math.prod(shape) * self.elem, (w, h, c))
        if name.startswith("staging:"):
            t = next(t for t in self.copy_in if t.blob == name[8:])
            return _Binding("staging", t.staging_offset, align_up(t.nbytes, 16))
        if name.startswith("staging_out:"):
            t = next(t for t in self.copy_out if t.blob == name[12:])
            return _Binding("staging", t.staging_offset, align_up(t.nbytes, 16))
        if name.startswith("w:"):
            key = (i, name[2:])
            if key not in self._weight_at:
                raise PlanError(f"{label}: binding {name!r} names no weight of the layer")
            off, size = self._weight_at[key]
            return _Binding("weights", off, size)
        if name.startswith("s:"):
            sid = self._scratch.get((i, name[2:]))
            if sid is None:
                raise PlanError(f"{label}: binding {name!r} names no scratch blob of the layer")
            st = self._storages[sid]
            return _Binding("arena", st.offset, st.nbytes)
        if name not in layer.inputs and name not in layer.outputs:
            raise PlanError(f"{label}: binding {name!r} is not a blob of the layer")
        return _Binding("arena", self._blob_at(name), self._padded_bytes(self.blob_shapes[name]))

    def _blob_at(self, name: str) -> int:
        """The blob's first byte in the arena."""
        return self._storages[self._storage_of[name]].offset + self._blob_offset.get(name, 0)

    # -- instances ------------------------------------------------------------------------------

    def acquire(self, timeout_s: float | None = None, batch: int = 1) -> PlanInstance:
        """A free instance for ``batch`` items (created on demand, up to max_instances per
        batch size, else waits for one)."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("plan is closed")
                if self._idle.get(batch):
                    return self._idle[batch].pop()
                if self._count.get(batch, 0) < self.max_instances:
                    self._count[batch] = self._count.get(batch, 0) + 1
                    break
                if not self._cond.wait(timeout_s):
                    raise TimeoutError(f"no free plan instance within {timeout_s} s")
        try:
            return PlanInstance(self, batch=batch)
        except BaseException:
            with self._cond:
                self._count[batch] -= 1
                self._cond.notify()
            raise

    def release(self, instance: PlanInstance) -> None:
        """Take an instance back; one whose wait was abandoned (timeout, cancellation, device
        error) is settled and destroyed rather than reused."""
        reusable = not instance.in_flight
        if not reusable:
            instance.settle()
        with self._cond:
            if not self._closed and reusable:
                self._idle.setdefault(instance.batch, []).append(instance)
                self._cond.notify()
                return
            self._count[instance.batch] -= 1
        instance.destroy()

    def drop_idle(self) -> None:
        """Destroy idle instances (their arenas go back to the pool): the pool's reclaimer."""
        with self._cond:
            idle = [inst for insts in self._idle.values() for inst in insts]
            self._idle = {}
            for inst in idle:
                self._count[inst.batch] -= 1
            self._cond.notify_all()
        for inst in idle:
            inst.destroy()

    def run(self, inputs: Mapping[str, np.ndarray], timeout_s: float | None = None,
            between_waits: Callable[[], None] | None = None) -> dict[str, np.ndarray]:
        with self.acquire() as inst:
            return inst.run(inputs, timeout_s, between_waits)

    def run_batch(self, batch: Sequence[Mapping[str, np.ndarray]], timeout_s: float | None = None,
                  between_waits: Callable[[], None] | None = None) -> list[dict[str, np.ndarray]]:
        """Several inferences in one submission (see PlanInstance); outputs in input order."""
        return self.run_batch_timed(batch, timeout_s, between_waits)[0]

    def run_batch_timed(self, batch: Sequence[Mapping[str, np.ndarray]], timeout_s: float | None = None,
                        between_waits: Callable[[], None] | None = None,
                        rooms: Sequence[OutputRoom | None] = ()
                        ) -> tuple[list[dict[str, np.ndarray]], StageTimes]:
        """``run_batch``, and where its time went: writing the inputs into staging, submit to
        fence, reading the outputs (and the host tail). An item with a room (``rooms``, by
        item) has its outputs read straight into it."""
        with self.acquire(batch=len(batch)) as inst:
            t0 = time.perf_counter()
            inst.start_batch(batch)
            t1 = time.perf_counter()
            inst.wait(timeout_s, between_waits)
            t2 = time.perf_counter()
            outputs = inst.read_outputs(rooms)
            return outputs, StageTimes(t1 - t0, t2 - t1, time.perf_counter() - t2,
                                       inst.inputs_in_place, inst.shared_inputs_copied)

    def close(self) -> None:
        """Destroy idle instances now, busy ones when released, and give the weights back."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self.pool.remove_reclaimer(self.drop_idle)
        self.drop_idle()
        self._release_weights()

    def _release_weights(self) -> None:
        if self.weights is not None:
            self.pool.release(self.weights)
            self.weights = None

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summary(self) -> dict[str, Any]:
        return {"precision": self.precision.value, "dispatches": len(self.steps),
                "barriers": self.barrier_count, "arena_bytes": self.arena_bytes,
                "zero_copy_concats": len(self.zero_copy),
                "folded_residuals": self.folded_residuals,
                "folded_permutes": self.folded_permutes,
                "folded_scales": self.folded_scales,
                "folded_activations": self.folded_activations,
                "folded_norms": self.folded_norms,
                "naive_bytes": self.naive_bytes, "weight_bytes": self.weight_bytes,
                "staging_bytes": self.staging_bytes,
                "host_tail": [layer.name for _, layer in self.tail.steps] if self.tail else [],
                "host_finish": [layer.name for _, layer, _ in self.finishers]}


def _overlaps(spans: list[tuple[int, int]], others: list[tuple[int, int]]) -> bool:
    return any(a < d and c < b for a, b in spans for c, d in others)


# -------------------------------------------------------------------------------- instance


class StepTimer(Protocol):
    """What a profiling instance records around its dispatches (engine.profile's
    DispatchProfiler): a timestamp before the first dispatch and one after each."""

    def record_start(self, cmd: Any) -> None: ...

    def record_step(self, cmd: Any, k: int) -> None: ...


#: input command buffers an instance keeps for inputs read in place (``PlanInstance._input_source``)
MAX_INPUT_SOURCES = 8


@dataclasses.dataclass(frozen=True)
class _InPlace:
    """An input the GPU reads where the client put it: a region imported, and the offset."""

    imported: ImportedRegion
    offset: int


@dataclasses.dataclass(eq=False)
class _InputSource:
    """An input command buffer reading some inputs in place (``places``), its descriptor sets."""

    ctx: VulkanContext
    cmd: Any
    places: tuple[_InPlace, ...]
    descriptors: DescriptorPool | None

    def destroy(self) -> None:
        self.ctx.free_command_buffer(self.cmd)
        if self.descriptors is not None:
            self.descriptors.destroy()


class PlanInstance:
    """One replayable copy of a Plan: its own arena, staging buffer, descriptor sets,
    recorded command buffer and fence. Not re-entrant: one inference at a time.

    With ``batch`` N the instance holds N arenas and staging regions side by side and records
    the N items layer by layer: each layer's dispatches for every item, then one barrier, so
    the GPU runs the items' dispatches of a layer concurrently and the batch costs one submit,
    one fence wait and one pass of copies. A step whose shader takes the batch itself
    (`Step.batched`: the convolution GEMMs) is one dispatch for every item, its arena bindings
    spanning the items' arenas, so its work groups share the weights and fill the device
    together; it falls back to one dispatch per item where the span exceeds the device's
    maxStorageBufferRange or the work groups its MAX_GROUPS."""

    def __init__(self, plan: Plan, profiler: StepTimer | None = None, batch: int = 1) -> None:
        self.plan = plan
        ctx = self.ctx = plan.ctx
        vk = ctx.vk
        self.profiler = profiler
        self.batch = batch
        self.arena_stride = plan.arena_stride
        self.staging_stride = align_up(plan.staging_bytes, STAGING_ALIGN)
        self.arena: Buffer | None = None
        self.staging: Buffer | None = None
        self.descriptors: DescriptorPool | None = None
        # image-backed blobs: images[(step, binding, item)], read through one sampler
        self.images: dict[tuple[int, int, int], Image] = {}
        self.sampler: Sampler | None = None
        self.cmd: Any = None  # the inputs from staging into the arena, then every other step
        # every step but the inputs' (after an input command buffer reading some in place):
        # recorded at the instance's first such run. Staged inputs keep one command buffer
        # (a second one measured 10-40 us slower a run on an H200 in one call: RESULTS.md)
        self.main_cmd: Any = None
        self.fence: Any = None
        self.in_flight = False  # submitted and not waited for to the end (wait abandoned)
        # inputs read from clients' shared memory in place: the command buffers doing so (by
        # where each item's inputs lie), the imports the run in flight holds, and its counts
        self.imports = plan.device.imports
        self._sources: dict[tuple[tuple[_InPlace | None, ...], ...], _InputSource] = {}
        self._held: list[ImportedRegion] = []
        self.inputs_in_place = 0
        self.shared_inputs_copied = 0
        try:
            self.arena = plan.pool.acquire(self.arena_stride * batch, MemoryKind.DEVICE)
            self.staging = plan.pool.acquire(self.staging_stride * batch, MemoryKind.HOST)
            self._make_images()
            self._write_sets()
            staged = [[(self.staging, i * self.staging_stride + t.staging_offset) for t in plan.copy_in]
                      for i in range(batch)]
            self.cmd = ctx.allocate_command_buffer()
            ctx.record(self.cmd, lambda cmd: (self._record_inputs(cmd, staged, self.sets), self._record(cmd)))
            self.fence = ctx.create_fence()
        except BaseException:
            self.destroy()
            raise
        ffi = vk.ffi
        self._lib = vk.lib
        self._cmds = ffi.new("VkCommandBuffer[2]", [self.cmd, ffi.NULL])
        self._fences = ffi.new("VkFence[1]", [self.fence])
        self._submit = ffi.new("VkSubmitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                 "commandBufferCount": 1,
                                                 "pCommandBuffers": self._cmds})
        # per item: (blob, shape, staging view) of inputs, (blob, view) of outputs, raw views
        self._inputs = [self._input_views(i) for i in range(batch)]
        self._outputs = [[(t.blob, self._view(plan.output_dtype, t, i)) for t in plan.copy_out]
                         for i in range(batch)]
        self._finish_views: list[list[dict[str, np.ndarray]]] = []
        for i in range(batch):
            views: list[dict[str, np.ndarray]] = [{} for _ in plan.finishers]
            for f, t in plan.copy_raw:
                views[f][t.blob] = self._view(np.dtype(np.uint8), t, i)
            self._finish_views.append(views)

    def _view(self, dtype: np.dtype, t: _Transfer, item: int) -> np.ndarray:
        assert self.staging is not None
        offset = item * self.staging_stride + t.staging_offset
        return self.staging.array(dtype, math.prod(t.shape), offset).reshape(t.shape)

    def _input_views(self, item: int) -> list[tuple[str, Shape, np.ndarray]]:
        return [(t.blob, t.shape, self._view(self.plan.input_dtype, t, item))
                for t in self.plan.copy_in]

    def _make_images(self) -> None:
        fmt = ImageFormat.for_storage(1, self.plan.elem == 2)
        for k, step in enumerate(self.plan.steps):
            for j, b in enumerate(step.bindings):
                if b.buffer == "image":
                    for i in range(self.batch):
                        self.images[(k, j, i)] = Image(self.ctx, b.extent, 3, fmt)
        if self.images:
            self.sampler = Sampler(self.ctx)

    def _resource(self, b: _Binding, k: int, j: int, item: int, buffers: Mapping[str, Buffer | None],
                  strides: Mapping[str, int]) -> Any:
        """Binding j of step k for `item`: (buffer, offset, range) or its image."""
        if b.buffer == "image":
            return ImageBinding(self.images[(k, j, item)], self.sampler)
        return (buffers[b.buffer], b.offset + item * strides[b.buffer], b.size)

    def _write_sets(self) -> None:
        plan = self.plan
        assert self.arena is not None
        steps = max(1, len(plan.steps)) * self.batch
        self.descriptors = DescriptorPool(self.ctx, steps,
                                          self.batch * sum(len(s.bindings) for s in plan.steps),
                                          max_images=len(self.images))
        buffers = {"weights": plan.weights, "arena": self.arena, "staging": self.staging}
        strides = {"weights": 0, "arena": self.arena_stride, "staging": self.staging_stride}
        limit = int(self.ctx.caps.properties.get("maxStorageBufferRange", 2**27))
        extra = (self.batch - 1) * self.arena_stride  # a binding's span past item 0's bytes
        # sets[k][i]: step k of item i, or sets[k] = [one set for every item] where the
        # step's dispatch runs the whole batch
        self.sets: list[list[Any]] = []
        for step in plan.steps:
            used = step.bindings[:step.pipeline.binding_count]
            if (self.batch > 1 and step.batched and step.groups[0] * self.batch <= MAX_GROUPS
                    and all(b.size + extra <= limit for b in used if b.buffer == "arena")):
                bufs = [(buffers[b.buffer], b.offset, b.size + (extra if b.buffer == "arena" else 0))
                        for b in used]
                self.sets.append([self.descriptors.allocate(step.pipeline.set_layout, bufs)])
                continue
            k = len(self.sets)
            self.sets.append([self.descriptors.allocate(
                step.pipeline.set_layout,
                [self._resource(b, k, j, i, buffers, strides) for j, b in enumerate(used)])
                for i in range(self.batch)])
        self.dispatch_count = sum(len(sets) for sets in self.sets)

    def _record(self, cmd: Any) -> None:
        """Every step after the input steps, then the readback."""
        vk, plan = self.ctx.vk, self.plan
        assert self.arena is not None and self.staging is not None
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        transfer = vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        barrier = self._barrier(cmd)
        items = range(self.batch)
        self._record_steps(cmd, range(plan.input_steps, len(plan.steps)), self.sets, barrier)
        cast_out = plan.output_dtype != plan.dtype
        copies = [*([] if cast_out else plan.copy_out), *(t for _, t in plan.copy_raw)]
        if cast_out and plan.copy_out and not copies:  # cast_output wrote staging: host reads it
            barrier(compute, vk.VK_ACCESS_SHADER_WRITE_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT,
                    vk.VK_ACCESS_HOST_READ_BIT)
        if copies:
            barrier(compute | transfer, vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                    transfer, vk.VK_ACCESS_TRANSFER_READ_BIT)
            regions = [vk.VkBufferCopy(srcOffset=i * self.arena_stride + t.arena_offset,
                                       dstOffset=i * self.staging_stride + t.staging_offset,
                                       size=t.nbytes) for i in items for t in copies]
            vk.vkCmdCopyBuffer(cmd, self.arena.handle, self.staging.handle, len(regions), regions)
            barrier(transfer | compute, vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
                    vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)

    def _barrier(self, cmd: Any) -> Callable[[int, int, int, int], None]:
        vk = self.ctx.vk

        def barrier(src_stage: int, src: int, dst_stage: int, dst: int) -> None:
            mb = vk.VkMemoryBarrier(srcAccessMask=src, dstAccessMask=dst)
            vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)

        return barrier

    def _record_steps(self, cmd: Any, steps: range, sets: Sequence[Sequence[Any]],
                      barrier: Callable[[int, int, int, int], None]) -> None:
        """The dispatches of ``steps`` (``sets[k]``: step k's descriptor sets, one per item or
        one for the whole batch), each after the barrier it needs."""
        vk = self.ctx.vk
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        shader_rw = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
        bound = None
        for k in steps:
            step, dsets = self.plan.steps[k], sets[k]
            if step.barrier_before and k:
                barrier(compute, shader_rw, compute, shader_rw)
            self._record_image_copies(cmd, k, barrier)
            if step.pipeline is not bound:
                vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, step.pipeline.handle)
                bound = step.pipeline
            gx, gy, gz = step.groups
            if len(dsets) == 1:  # one dispatch for every item: their work groups side by side
                gx *= self.batch
            for dset in dsets:  # the items' dispatches of one step: no barrier between them
                vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                                           step.pipeline.layout, 0, 1, [dset], 0, None)
                if step.push:
                    vk.vkCmdPushConstants(cmd, step.pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                          0, len(step.push), vk.ffi.from_buffer(step.push))
                vk.vkCmdDispatch(cmd, gx, gy, gz)
            if self.profiler:
                self.profiler.record_step(cmd, k)

    def _record_inputs(self, cmd: Any, sources: Sequence[Sequence[tuple[Buffer, int]]],
                       sets: Sequence[Sequence[Any]]) -> None:
        """The run's first commands: the scratch a layer needs zeroed filled, and item i's
        input j (``plan.copy_in[j]``) read from ``sources[i][j]`` (a buffer and the offset of its
        first byte) into the arena, by copies or by the cast_input steps (``sets``: their
        descriptor sets, bound to those sources)."""
        vk, plan = self.ctx.vk, self.plan
        assert self.arena is not None
        for offset, nbytes in plan.zeroed_spans:  # scratch a layer needs zeroed (split K's counters)
            for i in range(self.batch):
                vk.vkCmdFillBuffer(cmd, self.arena.handle, i * self.arena_stride + offset, nbytes, 0)
        by_buffer: dict[Buffer, list[Any]] = {}
        for i, row in enumerate(sources if not plan.input_steps else ()):
            for (buffer, offset), t in zip(row, plan.copy_in):
                by_buffer.setdefault(buffer, []).append(vk.VkBufferCopy(
                    srcOffset=offset, dstOffset=i * self.arena_stride + t.arena_offset, size=t.nbytes))
        for buffer, regions in by_buffer.items():
            vk.vkCmdCopyBuffer(cmd, buffer.handle, self.arena.handle, len(regions), regions)
        barrier = self._barrier(cmd)
        if by_buffer or plan.zeroed_spans:
            barrier(vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                    vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                    vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT)
        if self.profiler:
            self.profiler.record_start(cmd)
        self._record_steps(cmd, range(plan.input_steps), sets, barrier)

    def _record_image_copies(self, cmd: Any, k: int, barrier: Callable[[int, int, int, int], None]) -> None:
        """Step k's image-backed inputs: every item's blob bytes copied into its image, after
        the dispatches that wrote them and before the step reads them."""
        copies = [(b, img, i) for (s, j, i), img in self.images.items() if s == k
                  for b in (self.plan.steps[k].bindings[j],)]
        if not copies:
            return
        vk = self.ctx.vk
        compute, transfer = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        barrier(compute | transfer, vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                transfer, vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        assert self.arena is not None
        for b, img, i in copies:
            vk.vkCmdCopyBufferToImage(cmd, self.arena.handle, img.handle, vk.VK_IMAGE_LAYOUT_GENERAL, 1,
                                      [img.copy_region(b.offset + i * self.arena_stride)])
        barrier(transfer, vk.VK_ACCESS_TRANSFER_WRITE_BIT, compute, vk.VK_ACCESS_SHADER_READ_BIT)

    def run(self, inputs: Mapping[str, np.ndarray], timeout_s: float | None = None,
            between_waits: Callable[[], None] | None = None) -> dict[str, np.ndarray]:
        """One inference: `start` then `finish`."""
        self.start(inputs)
        return self.finish(timeout_s, between_waits)

    def run_batch(self, batch: Sequence[Mapping[str, np.ndarray]], timeout_s: float | None = None,
                  between_waits: Callable[[], None] | None = None) -> list[dict[str, np.ndarray]]:
        """The instance's ``batch`` inferences in one submission."""
        self.start_batch(batch)
        return self.finish_batch(timeout_s, between_waits)

    def start(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Write the inputs into staging (converting to the storage type) and submit."""
        self.start_batch([inputs])

    def start_batch(self, batch: Sequence[Mapping[str, np.ndarray]]) -> None:
        """`start` for the instance's ``batch`` items (exactly that many)."""
        if self.in_flight:
            raise RuntimeError("plan instance already has an inference in flight")
        if len(batch) != self.batch:
            raise ValueError(f"{len(batch)} inputs for an instance of batch {self.batch}")
        self.inputs_in_place = self.shared_inputs_copied = 0
        for key in [k for k, v in self._sources.items() if not all(p.imported.alive for p in v.places)]:
            self._sources.pop(key).destroy()  # its regions went: never submitted again
        try:
            items = [[(self._input(inputs, name, shape), view) for name, shape, view in views]
                     for inputs, views in zip(batch, self._inputs)]
            where = tuple(tuple(self._place(arr) for arr, _ in row) for row in items)
            source = self._input_source(where) if self._held else None
            if source is None and self._held:  # no command buffer for these places: copied
                if not self.plan.sources_full_logged:
                    self.plan.sources_full_logged = True
                    log.info("plan of %s: an instance keeps input command buffers for %d places "
                             "in clients' shared memory; inputs elsewhere are copied into staging",
                             self.plan.file or "a graph", MAX_INPUT_SOURCES)
                self.shared_inputs_copied += len(self._held)
                self._release_imports()
                where = tuple((None,) * len(row) for row in where)
            self.inputs_in_place = len(self._held)
            for row, places in zip(items, where):
                for (arr, view), place in zip(row, places):
                    if place is None:
                        np.copyto(view, arr, casting="unsafe")
            if source is None:
                self._cmds[0] = self.cmd
                self._submit.commandBufferCount = 1
            else:
                if self.main_cmd is None:
                    self.main_cmd = self.ctx.allocate_command_buffer()
                    self.ctx.record(self.main_cmd, self._record)
                self._cmds[0], self._cmds[1] = source.cmd, self.main_cmd
                self._submit.commandBufferCount = 2
            staging = self.staging
            assert staging is not None
            if not staging.coherent:
                staging.flush()
            ctx, lib = self.ctx, self._lib
            check(lib.vkResetFences(ctx.device, 1, self._fences), "vkResetFences")
            with ctx.queue_lock:
                code = lib.vkQueueSubmit(ctx.queue, 1, self._submit, self.fence)
            check(code, "vkQueueSubmit")
        except BaseException:
            self._release_imports()
            raise
        self.in_flight = True

    @staticmethod
    def _input(inputs: Mapping[str, np.ndarray], name: str, shape: Shape) -> np.ndarray:
        arr = inputs.get(name)
        if arr is None:
            raise ValueError(f"missing input {name!r}")
        if np.shape(arr) != shape:
            raise ValueError(f"input {name!r} has shape {np.shape(arr)}, the plan expects {shape}")
        return arr

    def _place(self, arr: np.ndarray) -> _InPlace | None:
        """Where the GPU reads ``arr`` in place (a client's shared memory, imported and held
        for this run), or None: it goes through staging."""
        found = REGIONS.find(arr) if arr.dtype == self.plan.input_dtype else None
        if found is None:
            return None
        region, offset = found
        imported = None
        # A batch's items rarely come back in the same places together, and a batched
        # instance runs under load, where copying (no GIL held) beats recording an input
        # command buffer (the GIL held): only one-item instances read in place. The cast
        # shader binds the input at its offset; copies take any offset.
        if (self.batch == 1 and self.profiler is None
                and (not self.plan.input_steps or offset % self.plan.min_binding_offset == 0)):
            imported = self.imports.acquire(region)
        if imported is None:
            self.shared_inputs_copied += 1
            return None
        self._held.append(imported)
        return _InPlace(imported, offset)

    def _input_source(self, where: tuple[tuple[_InPlace | None, ...], ...]) -> _InputSource | None:
        """The input command buffer reading each item's inputs from ``where`` (staging where
        None), recorded on first use and kept while its imports live; None once the instance
        keeps ``MAX_INPUT_SOURCES`` for other places. Recording holds the GIL for ~0.1 ms
        (lavapipe, mobilenet), where copying the inputs releases it: under load from many
        clients the first places keep theirs and the rest are copied; a sequential client's
        places come back each request."""
        source = self._sources.get(where)
        if source is None and len(self._sources) < MAX_INPUT_SOURCES:
            source = self._sources[where] = self._new_input_source(where)
        return source

    def _new_input_source(self, where: tuple[tuple[_InPlace | None, ...], ...]) -> _InputSource:
        plan, ctx = self.plan, self.ctx
        assert self.staging is not None
        sources = [[(self.staging, i * self.staging_stride + t.staging_offset) if p is None
                    else (p.imported.buffer, p.offset) for t, p in zip(plan.copy_in, row)]
                   for i, row in enumerate(where)]
        places = tuple(p for row in where for p in row if p is not None)
        steps = plan.steps[:plan.input_steps]
        source = _InputSource(ctx, ctx.allocate_command_buffer(), places, None)
        try:
            sets: list[list[Any]] = []
            if steps:
                source.descriptors = DescriptorPool(ctx, len(steps) * self.batch, self.batch * sum(
                    s.pipeline.binding_count for s in steps))
                buffers = {"weights": plan.weights, "arena": self.arena}
                strides = {"weights": 0, "arena": self.arena_stride}
                for k, step in enumerate(steps):  # cast_input k reads copy_in[k]
                    sets.append([source.descriptors.allocate(step.pipeline.set_layout, [
                        (sources[i][k][0], sources[i][k][1], b.size) if b.buffer == "staging"
                        else self._resource(b, k, j, i, buffers, strides)
                        for j, b in enumerate(step.bindings[:step.pipeline.binding_count])])
                        for i in range(self.batch)])
            ctx.record(source.cmd, lambda cmd: self._record_inputs(cmd, sources, sets))
        except BaseException:
            source.destroy()
            raise
        return source

    def _release_imports(self) -> None:
        """The run is over (or never started): the client regions it read may be freed."""
        if self._held:
            held, self._held = self._held, []
            self.imports.release(held)

    def finish(self, timeout_s: float | None = None,
               between_waits: Callable[[], None] | None = None) -> dict[str, np.ndarray]:
        """`finish_batch` of a one-item instance."""
        (out,) = self.finish_batch(timeout_s, between_waits)
        return out

    def finish_batch(self, timeout_s: float | None = None,
                     between_waits: Callable[[], None] | None = None) -> list[dict[str, np.ndarray]]:
        """Wait for the submission, then read the outputs (``wait`` + ``read_outputs``)."""
        self.wait(timeout_s, between_waits)
        return self.read_outputs()

    def wait(self, timeout_s: float | None = None,
             between_waits: Callable[[], None] | None = None) -> None:
        """Wait for the submission.

        `between_waits` runs between 50 ms fence-wait slices (a trio worker checks for
        cancellation there and may raise); `timeout_s` bounds the wait. After either gives
        up, the instance is settled and destroyed when released, never reused."""
        if not self.in_flight:
            raise RuntimeError("no inference in flight: call start() first")
        self.ctx.wait_fence(self.fence, timeout_s, between_waits)
        self.in_flight = False
        self._release_imports()

    def read_outputs(self, rooms: Sequence[OutputRoom | None] = ()) -> list[dict[str, np.ndarray]]:
        """The finished submission's outputs per item, copied out of staging (then the host
        tail): into the item's room (``rooms``, by item) where they fit, else new arrays."""
        staging = self.staging
        assert staging is not None
        if not staging.coherent:
            staging.invalidate()
        results = []
        for item, (outputs, finish_views) in enumerate(zip(self._outputs, self._finish_views)):
            out = self._copied_out(outputs, rooms[item] if item < len(rooms) else None)
            for (_, layer, vl), views in zip(self.plan.finishers, finish_views):
                out.update(zip(layer.outputs, vl.finish_on_host(views)))  # type: ignore[attr-defined]
            tail = self.plan.tail
            if tail is not None:
                tail.run(out)
            results.append({name: out[name] for name in self.plan.output_names})
        return results

    def _copied_out(self, outputs: Sequence[tuple[str, np.ndarray]], room: OutputRoom | None) -> dict[str, np.ndarray]:
        """One item's blobs out of staging, as fp32 (the model's outputs into ``room`` where
        they fit; blobs the host tail reads are not outputs)."""
        if room is None:
            return {name: view.astype(np.float32) for name, view in outputs}
        out: dict[str, np.ndarray] = {}
        with room.writing() as writable:
            for name, view in outputs:
                wanted = writable and name in self.plan.output_names
                dest = room.place(name, view.shape) if wanted else None
                if dest is None:
                    out[name] = view.astype(np.float32)
                else:
                    np.copyto(dest, view)
                    out[name] = dest
        return out

    def settle(self) -> None:
        """Wait for an abandoned submission so that the instance's objects can be destroyed."""
        try:
            self.ctx.wait_fence(self.fence)
        except VulkanError as e:  # device lost: nothing of it runs any more either
            log.warning("plan instance: waiting for an abandoned submission: %s", e)
        self.in_flight = False
        self._release_imports()

    def destroy(self) -> None:
        ctx, pool = self.ctx, self.plan.pool
        if self.fence is not None:
            ctx.destroy_fence(self.fence)
            self.fence = None
        for cmd in (self.cmd, self.main_cmd):
            if cmd is not None:
                ctx.free_command_buffer(cmd)
        self.cmd = self.main_cmd = None
        for source in self._sources.values():
            source.destroy()
        self._sources = {}
        if self.descriptors is not None:
            self.descriptors.destroy()
            self.descriptors = None
        for img in self.images.values():
            img.destroy()
        self.images = {}
        if self.sampler is not None:
            self.sampler.destroy()
            self.sampler = None
        for attr in ("arena", "staging"):
            buf = getattr(self, attr)
            if buf is not None:
                pool.release(buf)
                setattr(self, attr, None)

    def __enter__(self) -> PlanInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.plan.release(self)
