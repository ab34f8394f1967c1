"""CPU executor: a Plan compiles a Graph for fixed input shapes into a list of kernels over
one bf16 arena.

Storage is bf16 (uint16) and compute fp32: before a step runs, each of its inputs is widened
from the arena into a reusable fp32 scratch buffer (``devices.cpu.arena.Scratch``; kernels that
define ``forward_bf16`` instead read the bf16 arena views and widen what they need themselves,
e.g. straight into a padded or im2col buffer); the kernel's fp32 results are narrowed (RNE)
into the outputs' arena slots. After the first run nothing large is allocated per run. Because every input is read before any output is written, a blob last
read by a step may share bytes with that step's outputs (see ``devices.cpu.arena``).
Reshape-like layers (Split, Reshape, Flatten, Noop, Input) alias their input's bytes.
Data-dependent outputs (detections) live outside the arena, in fp32.

A Plan is not re-entrant: ``run`` holds a lock; use one Plan per concurrent job.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from devices.cpu.arena import Interval, Scratch, plan_offsets
from devices.cpu.bf16 import from_bf16, to_bf16, widen_into
from devices.cpu.kernels import REGISTRY, Kernel, Shape, UnsupportedError

BYTES_PER_ELEMENT = 2


class PlanError(ValueError):
    """The graph cannot be compiled for the CPU engine (all offending layers named at once)."""


@dataclass
class _Step:
    kernel: Kernel
    name: str
    inputs: list[str]
    outputs: list[str]


@dataclass
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
    ) -> None:
        self.input_names: list[str] = list(graph.input_names)
        self.output_names: list[str] = list(outputs) if outputs is not None else list(graph.output_names)
        given = {k: tuple(int(v) for v in s) for k, s in (input_shapes or {}).items()}
        self.blob_shapes: dict[str, Shape] = {}
        self._steps: list[_Step] = []
        self.scratch = Scratch()
        self._compile(graph, given)
        self._lay_out()
        self._lock = threading.Lock()

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
            except UnsupportedError as e:
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

    def _lay_out(self) -> None:
        """Group aliasing blobs into storages, give each a lifetime and pack them into the arena."""
        self._storage_of: dict[str, int] = {}
        storages: list[_Storage] = []
        end_of_run = len(self._steps)
        for step_index, step in enumerate(self._steps):
            for blob in step.inputs:
                sid = self._storage_of.get(blob)
                if sid is not None:
                    storages[sid].end = max(storages[sid].end, step_index)
            for i, blob in enumerate(step.outputs):
                if blob in self._dynamic:
                    continue
                if step.kernel.alias and step.kernel.layer.type != "Input":
                    self._storage_of[blob] = self._storage_of[step.inputs[step.kernel.source(i)]]
                    continue
                size = int(np.prod(self.blob_shapes[blob])) * BYTES_PER_ELEMENT
                self._storage_of[blob] = len(storages)
                storages.append(_Storage(size, step_index, step_index + 1))
        for blob in self.output_names:
            if blob in self._storage_of:
                storages[self._storage_of[blob]].end = end_of_run + 1
        offsets, total = plan_offsets([Interval(s.size, s.start, s.end) for s in storages])
        self.arena_bytes: int = total
        self.naive_bytes: int = sum(
            int(np.prod(self.blob_shapes[b])) * BYTES_PER_ELEMENT for b in self._storage_of
        )
        self.storage_intervals: list[tuple[int, Interval]] = [
            (off, Interval(s.size, s.start, s.end)) for off, s in zip(offsets, storages)
        ]
        self._arena = np.zeros(total // BYTES_PER_ELEMENT, dtype=np.uint16)
        self._views: dict[str, np.ndarray] = {}
        for blob, sid in self._storage_of.items():
            start = offsets[sid] // BYTES_PER_ELEMENT
            n = int(np.prod(self.blob_shapes[blob]))
            self._views[blob] = self._arena[start : start + n].reshape(self.blob_shapes[blob])

    # -- run -------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; ``inputs`` maps every input blob name to a float32-convertible array."""
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise ValueError(f"missing inputs: {', '.join(missing)}")
        with self._lock, np.errstate(over="ignore", under="ignore"):
            for name in self.input_names:
                arr = np.asarray(inputs[name], dtype=np.float32)
                want = self.blob_shapes[name]
                if arr.shape != want:
                    raise ValueError(f"input '{name}' has shape {arr.shape}, the plan expects {want}")
                to_bf16(arr, out=self._views[name], scratch=self.scratch.get("narrow", arr.size, np.uint32))
            dynamic: dict[str, np.ndarray] = {}
            scratch = self.scratch
            views = self._views
            for step in self._steps:
                kernel = step.kernel
                if kernel.alias:
                    # no compute; only data-dependent blobs need passing along by name
                    for i, blob in enumerate(step.outputs):
                        if blob in self._dynamic:
                            dynamic[blob] = dynamic[step.inputs[kernel.source(i)]]
                    continue
                if kernel.raw_inputs:
                    xs = [dynamic[b] if b in dynamic else views[b] for b in step.inputs]
                    ys = kernel.forward_bf16(xs)
                else:
                    xs = [
                        dynamic[b] if b in dynamic
                        else widen_into(views[b], scratch.get(f"in{i}", views[b].shape))
                        for i, b in enumerate(step.inputs)
                    ]
                    ys = kernel.forward(xs)
                for blob, y in zip(step.outputs, ys):
                    if blob in self._dynamic:
                        dynamic[blob] = np.array(y, dtype=np.float32)  # a copy: y may be scratch
                        continue
                    view = views[blob]
                    if y.shape != view.shape:
                        raise RuntimeError(f"{step.name}: produced {y.shape}, planned {view.shape}")
                    to_bf16(y, out=view, scratch=scratch.get("narrow", y.size, np.uint32))
            return {
                name: dynamic[name].copy() if name in dynamic else from_bf16(self._views[name])
                for name in self.output_names
            }
