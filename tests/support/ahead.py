"""Cases of a parametrized test run one ahead, in a second thread.

A first Vulkan run on lavapipe spends most of its time in the driver compiling each pipeline
for the CPU (at its first dispatch, in the queue's own thread: one core of CI's two). Each run
opens its own device, so two runs compile on both cores: while a test checks its case, the
next selected case of the same test runs beside it, and its test then finds its result ready
(measured: densenet121's fp32 and fp16 Vulkan verifications 88 s one after the other, 49 s side
by side). Every case still runs in full and its test asserts on its own result; an error
raised in the background is raised again in its test.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest


class Ahead:
    def __init__(self, run: Callable[..., Any], keys: list[tuple[Hashable, ...]]) -> None:
        self._run = run
        self._keys = keys
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="ahead")  # this case and the next
        self._futures: dict[tuple[Hashable, ...], Future[Any]] = {}

    def result(self, *key: Hashable) -> Any:
        """``run(*key)`` (started earlier where the previous case's test started it), with the
        next case started beside it: at most two runs at a time."""
        future = self._futures.pop(key, None) or self._pool.submit(self._run, *key)
        if key in self._keys:
            i = self._keys.index(key)
            if i + 1 < len(self._keys) and self._keys[i + 1] not in self._futures:
                self._futures[self._keys[i + 1]] = self._pool.submit(self._run, *self._keys[i + 1])
        return future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def run_ahead(request: pytest.FixtureRequest, test_name: str, params: tuple[str, ...],
              run: Callable[..., Any]) -> Iterator[Ahead]:
    """An ``Ahead`` over the selected cases of ``test_name`` in the requesting module, in the
    session's order, each keyed by its values of ``params``."""
    keys = [tuple(item.callspec.params[p] for p in params) for item in request.session.items
            if getattr(item, "originalname", None) == test_name and item.module is request.module]
    ahead = Ahead(run, keys)
    try:
        yield ahead
    finally:
        ahead.close()
