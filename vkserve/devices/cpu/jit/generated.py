"""Kernels written out as Python source by a generator (register tiles and row runs unrolled
for one shape each: ``bf16dot``, ``dwrows``, ``poolrows``), compiled by numba. numba caches no
exec'd code: the cached kernels that call these inline them and are cached with them."""

from __future__ import annotations

from collections.abc import Mapping

from numba import njit
from numba.core.registry import CPUDispatcher


def compile_source(source: str, entry: str, label: str, names: Mapping[str, object],
                   inline: bool) -> CPUDispatcher:
    """``source``'s function ``entry`` compiled with numba, ``names`` (the intrinsics and
    constants it calls) its globals; ``label`` names it in tracebacks. ``inline``: inlined
    into the kernels calling it, rather than called."""
    scope = dict(names)
    exec(compile(source, f"<{label}>", "exec"), scope)  # noqa: S102
    return njit(error_model="numpy", inline="always" if inline else "never")(scope[entry])
