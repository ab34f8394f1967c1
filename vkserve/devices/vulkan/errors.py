"""Vulkan errors that name the VkResult."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator

from vkserve.devices.vulkan.loader import vulkan_module


class VulkanError(RuntimeError):
    """A Vulkan call failed; `result` is the VkResult name, e.g. VK_ERROR_DEVICE_LOST."""

    def __init__(self, what: str, result: str, code: int | None = None) -> None:
        super().__init__(f"{what} failed: {result}")
        self.what = what
        self.result = result
        self.code = code

    @property
    def device_lost(self) -> bool:
        return self.result == "VK_ERROR_DEVICE_LOST"


@functools.cache
def _result_names() -> dict[int, str]:
    vk = vulkan_module()
    names: dict[int, str] = {}
    for name in dir(vk):
        if not (name.startswith("VK_ERROR_") or name in _SUCCESS_CODES):
            continue
        value = getattr(vk, name)
        # Keep the shortest (core, un-suffixed) name of aliased codes.
        if isinstance(value, int) and (value not in names or len(name) < len(names[value])):
            names[value] = name
    return names


_SUCCESS_CODES = {"VK_SUCCESS", "VK_NOT_READY", "VK_TIMEOUT", "VK_EVENT_SET", "VK_EVENT_RESET",
                  "VK_INCOMPLETE", "VK_SUBOPTIMAL_KHR"}


def result_name(code: int) -> str:
    return _result_names().get(code, f"VkResult({code})")


def check(code: int, what: str) -> None:
    """Raise VulkanError unless `code` is VK_SUCCESS (for raw `vk.lib` calls)."""
    if code != 0:
        raise VulkanError(what, result_name(code), code)


def _class_to_result(cls: type) -> str:
    # vulkan's exception classes are CamelCase VkResult names: VkErrorDeviceLost.
    words = re.findall(r"[A-Z][a-z0-9]*", cls.__name__[2:])
    return "VK_" + "_".join(w.upper() for w in words)


@contextlib.contextmanager
def vk_errors(what: str) -> Iterator[None]:
    """Turn the bindings' exceptions (bare classes, no message) into VulkanError."""
    vk = vulkan_module()
    try:
        yield
    except (vk.VkError, vk.VkException) as exc:
        name = _class_to_result(type(exc))
        code = next((c for c, n in _result_names().items() if n == name), None)
        raise VulkanError(what, name, code) from exc
