"""The process-wide VkInstance and the physical devices it sees."""

from __future__ import annotations

import atexit
import threading
from typing import Any

from vkserve.devices.vulkan.errors import VulkanError, vk_errors
from vkserve.devices.vulkan.loader import VulkanUnavailable, vulkan_module
from vkserve.devices.vulkan.validation import setup as validation_setup

_lock = threading.Lock()
_instance: "Instance | None" = None


class Instance:
    """A VkInstance at the highest API version the loader offers (at most 1.3); with the
    validation layer when VKSERVE_VALIDATION=1 asks for it (`validation`)."""

    def __init__(self) -> None:
        vk = vulkan_module()
        self.vk = vk
        try:
            loader_version = vk.lib.vkEnumerateInstanceVersion  # noqa: B018 (presence check)
        except AttributeError:
            loader_version = None
        if loader_version is not None:
            p = vk.ffi.new("uint32_t*")
            vk.lib.vkEnumerateInstanceVersion(p)
            api = min(p[0], vk.VK_MAKE_VERSION(1, 3, 0))
        else:
            api = vk.VK_MAKE_VERSION(1, 0, 0)
        self.api_version = api
        app = vk.VkApplicationInfo(
            pApplicationName="vkserve",
            applicationVersion=1,
            pEngineName="vkserve",
            engineVersion=1,
            apiVersion=api,
        )
        self._validation = validation_setup(vk)
        self.validation = self._validation is not None
        v = self._validation
        info = vk.VkInstanceCreateInfo(
            pNext=v.pnext if v else None, pApplicationInfo=app,
            enabledLayerCount=len(v.layers) if v else 0, ppEnabledLayerNames=v.layers if v else None,
            enabledExtensionCount=len(v.extensions) if v else 0,
            ppEnabledExtensionNames=v.extensions if v else None)
        try:
            with vk_errors("vkCreateInstance"):
                self.handle = vk.vkCreateInstance(info, None)
        except VulkanError as exc:
            hint = (" (the loader found no Vulkan driver/ICD)"
                    if exc.result == "VK_ERROR_INCOMPATIBLE_DRIVER" else "")
            raise VulkanUnavailable(f"{exc}{hint}") from exc
        if v is not None:
            v.start(vk, self.handle)
        with vk_errors("vkEnumeratePhysicalDevices"):
            self.physical_devices: list[Any] = list(vk.vkEnumeratePhysicalDevices(self.handle))

    def destroy(self) -> None:
        if self.handle is not None:
            if self._validation is not None:
                self._validation.stop(self.vk, self.handle)
            self.vk.vkDestroyInstance(self.handle, None)
            self.handle = None


def get_instance() -> Instance:
    """The shared instance, created on first use and destroyed at exit."""
    global _instance
    with _lock:
        if _instance is None:
            _instance = Instance()
            atexit.register(_instance.destroy)
        return _instance
