"""One name per device, everywhere: ``cpu`` and ``vulkan:N``.

``N`` is the Vulkan device's index in the loader's order (what `vkserve devices` lists, what
the engines open). The CLI flags, JSON output, metric labels, protocol replies, the daemon's
status and its log lines all use these names; command-line flags also take a plain integer as
a Vulkan index (``--device 0`` is ``vulkan:0``). The scheduler's own device numbers (Vulkan
GPUs first, then the CPU) stay internal: `device_name` turns one into its name.
"""

from __future__ import annotations

import dataclasses
import functools

from vkserve.devices.capabilities import DeviceKind

__all__ = ["CPU", "DeviceName", "DeviceNameError", "device_name", "parse_device"]

CPU = "cpu"
_VULKAN_PREFIX = "vulkan:"


class DeviceNameError(ValueError):
    """A device name that is neither ``cpu``, ``vulkan:N`` nor a Vulkan index ``N``."""


@dataclasses.dataclass(frozen=True)
class DeviceName:
    """A parsed device name: the CPU, or Vulkan device ``index``."""

    kind: DeviceKind
    index: int = 0  # the Vulkan index; 0 for the CPU

    @property
    def is_cpu(self) -> bool:
        return self.kind is DeviceKind.CPU

    def __str__(self) -> str:
        return CPU if self.is_cpu else f"{_VULKAN_PREFIX}{self.index}"


@functools.cache  # asked per request (replies, metrics): a few names, made once
def device_name(kind: DeviceKind | str, index: int) -> str:
    """The name of a device of ``kind`` (``"cpu"``/``"vulkan"`` or the enum) and ``index``."""
    return str(DeviceName(DeviceKind(kind), 0 if DeviceKind(kind) is DeviceKind.CPU else index))


def parse_device(text: str) -> DeviceName:
    """``cpu``, ``vulkan:N`` or ``N`` (a Vulkan index); raises DeviceNameError naming the text."""
    value = text.strip().lower()
    if value == CPU:
        return DeviceName(DeviceKind.CPU)
    digits = value[len(_VULKAN_PREFIX):] if value.startswith(_VULKAN_PREFIX) else value
    if digits.isascii() and digits.isdigit() and len(digits) <= 6:
        return DeviceName(DeviceKind.VULKAN, int(digits))
    raise DeviceNameError(f"device {text!r}: expected cpu, vulkan:N or a Vulkan device index N")
