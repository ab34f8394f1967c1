"""Jobs, results and input validation.

A Job ends exactly once: ``finish`` records the first outcome (outputs or an error) and
ignores every later one. That single gate is what makes races harmless — a caller whose
deadline fires while the device is still running, a cancelled caller, a failover retry and a
worker finishing late all call ``finish``; only the first counts, the rest are discarded.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping

import numpy as np
import trio

from vkserve.client.meaning import Meaning
from vkserve.devices.output_room import OutputRoom
from vkserve.devices.timing import StageTimes
from vkserve.scheduler.errors import BadInput, SchedulerError
from vkserve.scheduler.shapes import InputSpec, ShapeKey

__all__ = ["InferResult", "Job", "validate_inputs"]

_ids = itertools.count(1)


@dataclasses.dataclass
class InferResult:
    outputs: dict[str, np.ndarray]
    device: str  # the device's name
    queue_seconds: float  # from admission to the start of the (last) run
    run_seconds: float  # the run that produced the outputs
    device_index: int = -1
    job_id: int = 0
    attempts: int = 1  # 2 when a device failure moved the job
    batch_size: int = 1  # jobs that ran together in the execution that answered this one
    stages: StageTimes | None = None  # where that execution's time went (all its jobs together)
    meanings: tuple[Meaning, ...] = ()  # [postprocess]: one per item (vkserve.processing)


class Job:
    """One admitted inference request, from admission until it ends."""

    def __init__(self, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None,
                 priority: int, deadline: float | None, key: ShapeKey = (),
                 room: OutputRoom | None = None) -> None:
        self.id = next(_ids)
        self.model = model
        self.inputs = inputs
        self.room = room  # where the engine writes the outputs (a shared-memory client's slot)
        self.key = key  # the input shapes, in the model's input order: which Plans run it
        self.outputs = outputs
        self.priority = priority
        self.deadline = deadline  # trio clock, or None
        self.submitted = trio.current_time()
        self.dispatched: float | None = None
        self.attempts = 0  # runs started
        self.excluded: set[int] = set()  # devices that failed this job
        self.last_fault: str = ""
        self.result: InferResult | None = None
        self.error: SchedulerError | None = None
        self.done = trio.Event()
        # called in the loop once the job ended (Scheduler.submit's jobs, which nobody awaits)
        self.on_done: Callable[[Job], None] | None = None

    def sort_key(self) -> tuple[int, int]:
        """Higher priority first, then FIFO (ids grow with admission; a retried job keeps
        its id, so it goes back ahead of everything admitted after it)."""
        return (-self.priority, self.id)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def finish(self, result: InferResult | None = None,
               error: SchedulerError | None = None) -> bool:
        """Record the outcome; False (and nothing changes) when the job already ended. From
        here no run writes into the job's room (one writing now is waited for)."""
        if self.done.is_set():
            return False
        if self.room is not None:
            self.room.close()
        self.result, self.error = result, error
        self.done.set()
        return True


def validate_inputs(model: str, expected: Mapping[str, InputSpec],
                    inputs: object) -> dict[str, np.ndarray]:
    """Check names, dtypes and shapes (``InputSpec.problem``); return C-contiguous float32
    arrays.

    float16 widens exactly. float64 narrows when every finite value stays finite in float32
    (precision loss is what float32 models expect; overflow to inf is not). Integers, bools
    and complex are rejected rather than guessed at.
    """
    if not isinstance(inputs, Mapping):
        raise BadInput(f"model '{model}': inputs must be a mapping of input name to array")
    missing = [n for n in expected if n not in inputs]
    unknown = [n for n in inputs if n not in expected]
    names = ", ".join(expected)
    if unknown:
        raise BadInput(f"model '{model}': unknown input {', '.join(map(repr, unknown))} "
                       f"(the model's inputs: {names})")
    if missing:
        raise BadInput(f"model '{model}': missing input {', '.join(map(repr, missing))} "
                       f"(the model's inputs: {names})")
    arrays: dict[str, np.ndarray] = {}
    for name, spec in expected.items():
        value = inputs[name]
        if not isinstance(value, np.ndarray):
            raise BadInput(f"input '{name}': expected a numpy array, got {type(value).__name__}")
        if value.dtype == np.float32:
            arr = value
        elif value.dtype in (np.float16, np.float64):
            with np.errstate(over="ignore"):
                arr = value.astype(np.float32)
            if value.dtype == np.float64 and not np.array_equal(
                    np.isfinite(arr), np.isfinite(value)):
                raise BadInput(f"input '{name}': float64 values out of float32 range "
                               "(send float32)")
        else:
            raise BadInput(f"input '{name}': dtype {value.dtype} is not supported (send "
                           "float32; float16 and float64 are converted; uint8 images need a "
                           "[preprocess] table for this input in the model's config.toml)")
        problem = spec.problem(value.shape)  # after the dtype: an image's shape says little
        if problem is not None:
            raise BadInput(f"input '{name}': {problem}")
        arrays[name] = np.ascontiguousarray(arr)
    return arrays


def client_batch(model: str, expected: Mapping[str, InputSpec], inputs: object,
                 max_batch_size: int) -> list[dict[str, np.ndarray]] | None:
    """The items of a client's batch (every input an array with one leading dimension more
    than its input's known rank, the same length N for all), or None when ``inputs`` are one
    request. Inputs of open rank are never read as a batch."""
    if not isinstance(inputs, Mapping) or set(inputs) != set(expected) or not expected:
        return None
    arrays: dict[str, np.ndarray] = {}
    for name, spec in expected.items():
        value, rank = inputs[name], len(spec.dims())
        if not (isinstance(value, np.ndarray) and rank and value.ndim == rank + 1):
            return None
        arrays[name] = value
    sizes = {a.shape[0] for a in arrays.values()}
    if len(sizes) != 1:
        raise BadInput(f"model '{model}': a batch needs one leading size for every input, got "
                       + ", ".join(f"{n}: {a.shape[0]}" for n, a in arrays.items()))
    (n_items,) = sizes
    if not 1 <= n_items <= max_batch_size:
        raise BadInput(f"model '{model}': a batch of {n_items}; the model takes 1 to "
                       f"{max_batch_size} (max_batch_size in its config.toml)")
    return [{n: a[i] for n, a in arrays.items()} for i in range(n_items)]
