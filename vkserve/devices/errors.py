"""Errors shared by the engines (CPU and Vulkan)."""

from __future__ import annotations


class UnsupportedError(ValueError):
    """A layer, or one of its parameter forms, that an engine cannot run."""


class JitUnavailable(RuntimeError):
    """The process may not allocate executable memory, which the CPU kernels' compiler (numba)
    needs; raised when the CPU engine's kernels are first imported."""
