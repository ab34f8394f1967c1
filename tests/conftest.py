import pytest

from devices.capabilities import DeviceCaps, DeviceKind
from devices.discovery import discover_devices


@pytest.fixture(scope="session")
def vulkan_caps() -> DeviceCaps:
    """The first Vulkan device (lavapipe in CI). Its absence is a failure, not a skip:
    the test command installs the driver, so a missing device is a broken environment."""
    gpus = [d for d in discover_devices() if d.kind is DeviceKind.VULKAN]
    assert gpus, "no Vulkan device found: is mesa-vulkan-drivers (lavapipe) installed?"
    return gpus[0]


@pytest.fixture(scope="session")
def vulkan_ctx(vulkan_caps):
    from devices.vulkan.context import VulkanContext

    ctx = VulkanContext(vulkan_caps)
    yield ctx
    ctx.destroy()
