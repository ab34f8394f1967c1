"""Where the scheduler applies a model's ``[preprocess]`` and ``[postprocess]``
(``vkserve.processing``): before a request's tensors are validated and after its result is in.
Image work runs in a worker thread, never on the event loop (a top-k over a score vector is
cheap and runs inline). A ProcessingError is the request's BAD_REQUEST."""

from __future__ import annotations

import numpy as np
import trio

from vkserve.client.meaning import MeaningKind
from vkserve.processing.errors import ProcessingError
from vkserve.processing.postprocess import explain
from vkserve.processing.preprocess import Geometry, prepare_inputs, wants_preprocessing
from vkserve.scheduler.errors import BadInput
from vkserve.scheduler.jobs import InferResult, client_batch
from vkserve.scheduler.registry import ModelSpec

__all__ = ["explain_now", "explain_result", "explains_in_a_thread", "needs_preparing", "prepare_request"]

Geometries = tuple[Geometry, ...]


def needs_preparing(spec: ModelSpec, inputs: dict[str, np.ndarray]) -> bool:
    """Does the request carry an image (uint8) for ``spec``'s preprocessed input?"""
    return spec.preprocess is not None and wants_preprocessing(inputs.get(spec.preprocess.input))


async def prepare_request(spec: ModelSpec, inputs: dict[str, np.ndarray]
                          ) -> tuple[dict[str, np.ndarray], Geometries | None]:
    """The request's inputs with an image (uint8) for the preprocessed input converted, and
    each image's geometry; ``(inputs, None)`` when there is nothing to convert."""
    pre = spec.preprocess
    if pre is None or not needs_preparing(spec, inputs):
        return inputs, None
    try:
        return await trio.to_thread.run_sync(prepare_inputs, pre, inputs, spec.name)
    except ProcessingError as exc:
        raise BadInput(str(exc)) from None


def explains_in_a_thread(spec: ModelSpec) -> bool:
    """Is ``spec``'s postprocessing image work (a segmentation mask), run in a worker thread?"""
    return spec.postprocess is not None and spec.postprocess.kind is MeaningKind.SEGMENTATION


def explain_now(spec: ModelSpec, result: InferResult, inputs: dict[str, np.ndarray],
                geometries: Geometries | None, *, one_item: bool = False) -> InferResult:
    """``result`` with its meanings (``spec.postprocess``), computed in the calling thread;
    ``inputs`` are the tensors that ran (``one_item``: known not to be a client's batch, as a
    submitted job's). A float tensor sent for a preprocessed input maps boxes to its own
    pixels. Raises BadInput where the output cannot be explained."""
    post = spec.postprocess
    if post is None or post.output not in result.outputs:
        return result
    items = None if one_item else client_batch(spec.name, spec.inputs, inputs, spec.max_batch_size)
    count = 1 if items is None else len(items)
    per_item: tuple[Geometry | None, ...] = (None,) * count
    if geometries is not None:
        per_item = geometries
    elif spec.preprocess is not None:
        h, w = inputs[spec.preprocess.input].shape[-2:]
        per_item = (Geometry.identity(h, w),) * count
    try:
        meanings = explain(post, result.outputs, per_item, items is not None, spec.name)
    except ProcessingError as exc:
        raise BadInput(str(exc)) from None
    result.meanings = meanings  # (the caller's own result: no copy)
    return result


async def explain_result(spec: ModelSpec, result: InferResult, inputs: dict[str, np.ndarray],
                         geometries: Geometries | None) -> InferResult:
    """``explain_now``, in a worker thread where that is image work."""
    if explains_in_a_thread(spec):
        return await trio.to_thread.run_sync(explain_now, spec, result, inputs, geometries)
    return explain_now(spec, result, inputs, geometries)
