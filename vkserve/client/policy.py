"""How long client calls wait, and how infer retries an OVERLOADED answer (both clients)."""

from __future__ import annotations

import enum
import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["DEFAULT", "DEFAULT_TIMEOUT", "Default", "RetryPolicy", "Timeout", "resolve_timeout"]

#: Seconds a call waits for its answer (and a connect for its connection) unless the client
#: was connected with another ``timeout``; ``None`` there means wait indefinitely.
DEFAULT_TIMEOUT = 30.0


class Default(enum.Enum):
    """Marks a ``timeout`` argument left out: the client's own timeout applies."""

    TIMEOUT = "the client's timeout"


DEFAULT = Default.TIMEOUT
#: A call's ``timeout``: seconds, ``None`` (no limit) or :data:`DEFAULT` (the client's).
Timeout = float | None | Default


def resolve_timeout(given: Timeout, client_default: float | None) -> float | None:
    """The seconds a call waits: ``given`` unless it is :data:`DEFAULT`."""
    if isinstance(given, Default):
        return client_default
    if given is not None and given < 0:
        raise ValueError(f"timeout {given}: give seconds >= 0, or None for no limit")
    return given


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry an infer the daemon answered ``OVERLOADED`` (its queue for the model was full).

    Up to ``attempts`` retries after the first try; the first pause is ``backoff`` seconds,
    each next one ``multiplier`` times longer, at most ``max_backoff``, each scattered by up
    to ``jitter`` (a fraction) so that clients refused together do not come back together.
    A retry never starts past the call's timeout or deadline: the OVERLOADED error is raised
    then. Other errors are never retried (an infer may have run when they arrive).
    """

    attempts: int = 3
    backoff: float = 0.05
    multiplier: float = 2.0
    max_backoff: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.backoff < 0 or self.multiplier < 1 or self.max_backoff < 0:
            raise ValueError(f"{self}: attempts, backoff and max_backoff must be >= 0 and "
                             "multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"{self}: jitter is a fraction in 0..1")

    def pauses(self) -> Iterator[float]:
        """The pause before each retry, in order (``attempts`` of them)."""
        pause = self.backoff
        for _ in range(self.attempts):
            yield min(pause, self.max_backoff) * (1 + random.uniform(-self.jitter, self.jitter))
            pause *= self.multiplier
