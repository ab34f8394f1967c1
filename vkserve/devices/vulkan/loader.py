"""Lazy access to the `vulkan` cffi bindings.

Importing `vulkan` dlopens `libvulkan.so.1` at import time and raises OSError
when the loader is missing, and MemoryError where writable+executable memory is
forbidden (systemd's MemoryDenyWriteExecute=: the binding builds cffi callbacks at
import); discovery must survive both, so nothing imports the bindings at module
level: callers go through `vulkan_module()`.
"""

from __future__ import annotations

import functools
import types


class VulkanUnavailable(RuntimeError):
    """No usable Vulkan loader, ICD or instance; the message says why."""


@functools.cache
def _load() -> types.ModuleType | str:
    try:
        import vulkan  # noqa: PLC0415  (deliberately lazy)
    except OSError as exc:
        return f"Vulkan loader (libvulkan.so.1) not found: {exc}"
    except MemoryError as exc:  # cffi: "Cannot allocate write+execute memory for ffi.callback()"
        return f"the vulkan binding cannot load without write+execute memory (MemoryDenyWriteExecute=?): {exc}"
    return vulkan


def vulkan_module() -> types.ModuleType:
    mod = _load()
    if isinstance(mod, str):
        raise VulkanUnavailable(mod)
    return mod
