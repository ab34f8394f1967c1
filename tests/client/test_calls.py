"""The infer sequence both clients perform (vkserve.client.calls), driven by hand: no socket,
each step's answer (or failure) handed back as a client would."""

from __future__ import annotations

import numpy as np
import pytest

from vkserve.client import CallTimeout, NotFound, Overloaded, RetryPolicy
from vkserve.client.calls import Call, InferCall, Pause, Post, infer_steps
from vkserve.client.connection import ClientConnection
from vkserve.client.messages import InferRequest, ShmRegisterRequest, ShmUnregisterRequest, encode_infer_result
from vkserve.client.shm import MAX_REGIONS, SharedMemory

BIG = {"x": np.ones((256, 256), np.float32)}  # 256 KiB: shared memory on a Unix socket


def test_shared_memory_registers_once_then_reuses_the_region() -> None:
    conn, shm = ClientConnection(), SharedMemory()
    for first in (True, False):
        steps = infer_steps(conn, shm, InferCall("m", BIG, timeout=5.0), None)
        step = next(steps)
        if first:  # a new region: registered with its descriptor before the request
            assert isinstance(step, Call) and isinstance(step.request, ShmRegisterRequest)
            assert step.fds == (shm.regions[0].fd,) and step.request.size == shm.regions[0].size
            step = steps.send({"registered": step.request.name, "size": step.request.size})
        assert isinstance(step, Call) and isinstance(step.request, InferRequest) and step.fds == ()
        assert step.request.placed is not None and step.request.placed["x"].region == shm.regions[0].name
        assert step.wait is not None and step.wait > 5.0  # the timeout and the grace period
        with pytest.raises(StopIteration) as done:
            steps.send(encode_infer_result({"y": np.zeros(3, np.float32)}))
        assert done.value.value.outputs["y"].tolist() == [0, 0, 0]
    assert len(shm.regions) == 1
    shm.close()


def test_outputs_seen_once_get_room_in_the_next_region() -> None:
    """Small inputs, large outputs: the first request goes inline (nothing known of its
    outputs), the next one through a region with room for what the first got back."""
    conn, shm = ClientConnection(), SharedMemory()
    small, big_out = {"x": np.ones(16, np.float32)}, {"y": np.ones((3, 512, 512), np.float32)}
    first = infer_steps(conn, shm, InferCall("m", small), None)
    step = next(first)
    assert isinstance(step, Call) and isinstance(step.request, InferRequest) and step.request.placed is None
    with pytest.raises(StopIteration):
        first.send(encode_infer_result(big_out))
    second = infer_steps(conn, shm, InferCall("m", small), None)
    register = next(second)
    assert isinstance(register, Call) and isinstance(register.request, ShmRegisterRequest)
    step = second.send({})
    assert isinstance(step, Call) and isinstance(step.request, InferRequest)
    assert step.request.outputs_shm is not None and step.request.outputs_shm.size >= big_out["y"].nbytes
    # another input shape is another kind of request: inline again
    other = infer_steps(conn, shm, InferCall("m", {"x": np.ones(8, np.float32)}), None)
    step = next(other)
    assert isinstance(step, Call) and isinstance(step.request, InferRequest) and step.request.placed is None
    shm.close()


def test_a_failed_shared_memory_request_gives_its_region_up() -> None:
    conn, shm = ClientConnection(), SharedMemory()
    steps = infer_steps(conn, shm, InferCall("m", BIG), None)
    register = next(steps)
    assert isinstance(register, Call)
    sent = steps.send({})
    assert isinstance(sent, Call)
    name = shm.regions[0].name
    # the wait is interrupted: the daemon may still write into the region, so it is dropped
    # and the daemon told (best effort), then the interruption goes on
    step = steps.throw(KeyboardInterrupt())
    assert isinstance(step, Post) and isinstance(step.request, ShmUnregisterRequest)
    assert step.request.name == name and shm.regions == []
    with pytest.raises(KeyboardInterrupt):
        steps.send(None)


@pytest.mark.parametrize("answered", [True, False])
def test_an_error_answer_keeps_the_region_no_answer_drops_it(answered: bool) -> None:
    conn, shm = ClientConnection(), SharedMemory()
    steps = infer_steps(conn, shm, InferCall("m", BIG), None)
    next(steps)
    steps.send({})
    region = shm.regions[0]
    error = NotFound("no model 'm'") if answered else CallTimeout("no answer from the server within 1 s")
    if answered:  # the daemon is done with the region: free for the next request
        with pytest.raises(NotFound):
            steps.throw(error)
        assert shm.take(InferRequest(0, "m", BIG)) == (region, False)
    else:
        step = steps.throw(error)
        assert isinstance(step, Post) and step.request == ShmUnregisterRequest(step.request.id, region.name)
        with pytest.raises(CallTimeout):
            steps.send(None)
        assert shm.regions == []
    shm.close()


def test_a_refused_region_turns_shared_memory_off() -> None:
    conn, shm = ClientConnection(), SharedMemory()
    steps = infer_steps(conn, shm, InferCall("m", BIG), None)
    next(steps)
    step = steps.throw(Overloaded("too many regions"))  # any server error refuses it
    assert isinstance(step, Call) and isinstance(step.request, InferRequest)
    assert step.request.placed is None and "too many regions" in (shm.off or "")
    assert shm.regions == [] and not shm.wanted(InferRequest(0, "m", BIG))


def test_overloaded_is_retried_with_the_time_left() -> None:
    conn = ClientConnection()
    retry = RetryPolicy(attempts=2, backoff=0.5, multiplier=3, jitter=0)
    steps = infer_steps(conn, None, InferCall("m", {"x": np.ones(2)}, timeout=60.0), retry)
    ids, pauses = [], []
    step = next(steps)
    for _ in range(2):
        assert isinstance(step, Call) and isinstance(step.request, InferRequest)
        ids.append(step.request.id)
        pause = steps.throw(Overloaded("queue full"))
        assert isinstance(pause, Pause)
        pauses.append(pause.seconds)
        step = steps.send(None)
    assert isinstance(step, Call) and isinstance(step.request, InferRequest)
    assert pauses == [0.5, 1.5] and len({*ids, step.request.id}) == 3  # a fresh id each try
    assert step.request.timeout is not None and step.request.timeout <= 60.0
    with pytest.raises(Overloaded):  # out of retries
        steps.throw(Overloaded("queue full"))


def test_no_retry_starts_past_the_deadline() -> None:
    steps = infer_steps(ClientConnection(), None, InferCall("m", {"x": np.ones(2)}, timeout=1.0),
                        RetryPolicy(attempts=5, backoff=2.0, jitter=0))
    next(steps)
    with pytest.raises(Overloaded):
        steps.throw(Overloaded("queue full"))


def test_retry_policy_checks_its_numbers() -> None:
    with pytest.raises(ValueError, match="multiplier >= 1"):
        RetryPolicy(multiplier=0.5)
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=2)
    pauses = list(RetryPolicy(attempts=4, backoff=1, multiplier=2, max_backoff=3, jitter=0.1).pauses())
    assert len(pauses) == 4 and all(0.9 <= p <= 3.3 for p in pauses)


def test_requests_beyond_the_regions_a_connection_may_have_go_inline() -> None:
    """With MAX_REGIONS regions busy (the daemon's limit per connection), one more request in
    flight sends its tensors inline instead of registering a region the daemon would refuse,
    and shared memory stays on for the others."""
    conn, shm = ClientConnection(), SharedMemory()
    busy = [infer_steps(conn, shm, InferCall("m", BIG), None) for _ in range(MAX_REGIONS)]
    for steps in busy:
        assert isinstance(next(steps).request, ShmRegisterRequest)
        steps.send({})  # registered; the infer request is in flight
    extra = infer_steps(conn, shm, InferCall("m", BIG), None)
    step = next(extra)
    assert isinstance(step.request, InferRequest) and step.request.inputs is not None
    assert len(shm.regions) == MAX_REGIONS and shm.off is None
    shm.close()
    # requests abandoned after the connection closed drop their (closed) regions once more
    for steps in busy:
        steps.close()
