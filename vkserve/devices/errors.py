"""Errors shared by the engines (CPU and Vulkan)."""

from __future__ import annotations


class UnsupportedError(ValueError):
    """A layer, or one of its parameter forms, that an engine cannot run."""
