"""The ``--device`` flag of the commands that run a model in-process (run, verify, profile,
tune, cache warm): ``cpu``, ``vulkan:N`` or ``N`` (`vkserve.devices.names`)."""

from __future__ import annotations

import argparse

from vkserve.devices.names import DeviceName, DeviceNameError, parse_device

__all__ = ["device_arg", "vulkan_device_arg"]


def device_arg(text: str) -> DeviceName:
    """argparse ``type=``: any device."""
    try:
        return parse_device(text)
    except DeviceNameError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def vulkan_device_arg(text: str) -> DeviceName:
    """argparse ``type=``: a Vulkan device (the command has no CPU path)."""
    device = device_arg(text)
    if device.is_cpu:
        raise argparse.ArgumentTypeError("this command needs a Vulkan device (vulkan:N or N), "
                                         "not the CPU")
    return device
