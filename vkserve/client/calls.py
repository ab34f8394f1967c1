"""What an infer call sends, in order, sans-I/O: the one place both clients take the sequence
from (shared-memory registration, the request, giving a region up, retries on OVERLOADED).

:func:`infer_steps` is a generator of :data:`Step` values. A client performs each step with
its own I/O and sends back the step's result (a :class:`Call`'s answer, ``None`` otherwise),
or throws in the exception the step raised; the generator's return value is the call's
:class:`~vkserve.client.messages.InferReply`. :func:`run_steps` and :func:`arun_steps` are
those loops, blocking and async.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from .connection import ClientConnection, answer_wait_budget
from .errors import CallTimeout, Overloaded, ServerError
from .messages import InferReply, InferRequest, Request, ShmRegisterRequest, ShmUnregisterRequest, decode_infer_reply
from .policy import RetryPolicy
from .shm import SharedInputs, SharedMemory

__all__ = ["Call", "InferCall", "Pause", "Post", "Step", "arun_steps", "infer_steps", "run_steps"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Call:
    """Send ``request`` (``fds`` with its frame, SCM_RIGHTS) and wait up to ``wait`` seconds
    (``None``: no limit) for its answer; the step's result is the answer's ``result``."""

    request: Request
    wait: float | None
    fds: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Post:
    """Send ``request`` and do not wait for its answer; best effort (a dead connection is fine)."""

    request: Request


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep ``seconds`` (the backoff before a retry)."""

    seconds: float


Step = Call | Post | Pause


@dataclass(frozen=True, slots=True)
class InferCall:
    """An infer call's arguments, as the client's caller gave them (timeout resolved)."""

    model: str
    inputs: Mapping[str, npt.ArrayLike]
    priority: int = 0
    deadline: float | None = None
    timeout: float | None = None
    outputs: list[str] | None = None


def infer_steps(conn: ClientConnection, shm: SharedMemory | None, call: InferCall,
                retry: RetryPolicy | None) -> Generator[Step, Any, InferReply]:
    """The steps of one infer call, retried on OVERLOADED as ``retry`` allows.

    Each try sends what is left of the timeout as the request's own ``timeout`` (the daemon
    drops a request it cannot answer in time), and waits that long plus the grace period.
    """
    started = time.monotonic()
    pauses = retry.pauses() if retry is not None else iter(())
    attempt = 1
    while True:
        left = None if call.timeout is None else max(0.0, call.timeout - (time.monotonic() - started))
        request = conn.infer_request(call.model, call.inputs, priority=call.priority,
                                     deadline=call.deadline, timeout=left, outputs=call.outputs)
        try:
            reply = yield from _one_try(conn, shm, request)
            return dataclasses.replace(reply, attempts=attempt) if attempt > 1 else reply
        except Overloaded as exc:
            pause = next(pauses, None)
            if pause is None or not _time_for(pause, call, started):
                raise
            log.info("%s: %s; retry %d in %.3f s", call.model, exc, attempt, pause)
            attempt += 1
        yield Pause(pause)


def _time_for(pause: float, call: InferCall, started: float) -> bool:
    """Whether a retry after ``pause`` still starts before the call's timeout and deadline."""
    if call.timeout is not None and time.monotonic() - started + pause >= call.timeout:
        return False
    return call.deadline is None or time.time() + pause < call.deadline


def _one_try(conn: ClientConnection, shm: SharedMemory | None,
             request: InferRequest) -> Generator[Step, Any, InferReply]:
    """One infer request; on a Unix socket (``shm``) its tensors go through a shared-memory
    region when ``shm`` wants them (registering a new region first: a refusal turns shared
    memory off, with a log line, and the request goes inline), and the size of the outputs it
    got back is kept for the next such request's room."""
    wait = answer_wait_budget(request.deadline, request.timeout)
    if shm is None:
        return decode_infer_reply((yield Call(request, wait)))
    reply = yield from _shared_try(conn, shm, request, wait)
    shm.learn(request, reply.outputs)
    return reply


def _shared_try(conn: ClientConnection, shm: SharedMemory, request: InferRequest,
                wait: float | None) -> Generator[Step, Any, InferReply]:
    """``_one_try`` on a Unix socket: through a region when ``shm`` wants the request."""
    taken = shm.take(request) if shm.wanted(request) else None
    if taken is None:
        return decode_infer_reply((yield Call(request, wait)))
    region, new = taken
    if new:
        try:
            yield Call(ShmRegisterRequest(conn.next_id(), region.name, region.size), wait, (region.fd,))
        except ServerError as exc:
            log.warning("shared memory off for this connection, tensors go inline: %s", exc)
            shm.refused(region, str(exc))
            return decode_infer_reply((yield Call(request, wait)))
    shared = SharedInputs(region, request.inputs)
    try:
        reply = decode_infer_reply((yield Call(shared.request(request), wait)), shared)
    except GeneratorExit:
        shm.drop(region)
        raise
    except BaseException as exc:
        if isinstance(exc, ServerError) and not isinstance(exc, CallTimeout):
            shm.put(region)  # the daemon answered (an error): it is done with the region
        else:
            # No answer (out of time, cancelled, connection lost): the daemon may still write
            # into the region, so it is never reused; the daemon frees it with the connection
            # anyway, the unregister only comes sooner.
            shm.drop(region)
            yield Post(ShmUnregisterRequest(conn.next_id(), region.name))
        raise
    shm.put(region)
    return reply


@dataclass(frozen=True, slots=True)
class _Done:
    reply: InferReply


def _advance(steps: Generator[Step, Any, InferReply], result: Any,
             failure: BaseException | None) -> Step | _Done:
    """The generator's next step after a step's ``result`` (or ``failure``), or its reply."""
    try:
        return steps.send(result) if failure is None else steps.throw(failure)
    except StopIteration as stop:
        return _Done(stop.value)


def run_steps(steps: Generator[Step, Any, InferReply], perform: Callable[[Step], Any]) -> InferReply:
    """Drive ``steps`` to the end with a blocking ``perform``; an exception a step raised goes
    back into the generator, which handles or re-raises it."""
    step = _advance(steps, None, None)
    while not isinstance(step, _Done):
        try:
            result = perform(step)
        except BaseException as exc:  # handed to the generator: it decides
            step = _advance(steps, None, exc)
        else:
            step = _advance(steps, result, None)
    return step.reply


async def arun_steps(steps: Generator[Step, Any, InferReply],
                     perform: Callable[[Step], Awaitable[Any]]) -> InferReply:
    """:func:`run_steps` with an async ``perform``."""
    step = _advance(steps, None, None)
    while not isinstance(step, _Done):
        try:
            result = await perform(step)
        except BaseException as exc:  # handed to the generator: it decides
            step = _advance(steps, None, exc)
        else:
            step = _advance(steps, result, None)
    return step.reply
