"""The progress hooks of long engine work (Plan pipelines, verification, tuning).

``ProgressFn``: ``progress(done, total, what)``, ``done`` of ``total`` steps finished, ``what``
the last one; it may be called from worker threads. ``Progress`` adds ``stage(text)``, a new
phase of the work. The CLI's reporter (``vkserve.cli.progress``) is both and draws them on
stderr.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["Progress", "ProgressFn"]

ProgressFn = Callable[[int, int, str], None]


class Progress(Protocol):
    def stage(self, text: str) -> None: ...

    def __call__(self, done: int, total: int, what: str = "") -> None: ...
