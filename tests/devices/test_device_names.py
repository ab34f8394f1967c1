"""One name per device (vkserve.devices.names): cpu, vulkan:N, and a plain N in flags."""

from __future__ import annotations

import pytest

from vkserve.devices.capabilities import DeviceKind
from vkserve.devices.names import DeviceName, DeviceNameError, device_name, parse_device


@pytest.mark.parametrize(("text", "parsed"), [
    ("cpu", DeviceName(DeviceKind.CPU)),
    (" CPU ", DeviceName(DeviceKind.CPU)),
    ("vulkan:0", DeviceName(DeviceKind.VULKAN, 0)),
    ("Vulkan:12", DeviceName(DeviceKind.VULKAN, 12)),
    ("0", DeviceName(DeviceKind.VULKAN, 0)),  # a plain integer is a Vulkan index
    ("3", DeviceName(DeviceKind.VULKAN, 3)),
])
def test_parse(text: str, parsed: DeviceName) -> None:
    assert parse_device(text) == parsed
    assert parse_device(str(parsed)) == parsed  # the name reads back as itself


@pytest.mark.parametrize("text", ["", "gpu", "vulkan", "vulkan:", "vulkan:x", "-1", "1.5",
                                  "vulkan:-1", "1234567", "٣", "cpu0", "vulkan0"])
def test_parse_refuses_other_text_naming_it(text: str) -> None:
    with pytest.raises(DeviceNameError, match="expected cpu, vulkan:N or a Vulkan device index N") as e:
        parse_device(text)
    assert repr(text) in str(e.value)


def test_format() -> None:
    assert device_name(DeviceKind.VULKAN, 1) == device_name("vulkan", 1) == "vulkan:1"
    # the CPU is `cpu` whatever number discovery gave it (the one after the GPUs')
    assert device_name(DeviceKind.CPU, 2) == device_name("cpu", 0) == "cpu"
    assert str(DeviceName(DeviceKind.VULKAN, 4)) == "vulkan:4" and DeviceName(DeviceKind.CPU).is_cpu
