"""VKSERVE_VALIDATION=1: the Khronos validation layer, with debug printf into the log.

When the variable is set and VK_LAYER_KHRONOS_validation is installed (Debian:
vulkan-validationlayers), the process's VkInstance enables the layer, its debug-printf
feature and a VK_EXT_debug_utils messenger that logs every message under
`vkserve.vulkan.validation`: layer errors at ERROR, warnings at WARNING, shader
`NCNN_LOGE(...)` output (GL_EXT_debug_printf) at WARNING as "NCNN_LOGE: ...", the rest at
DEBUG. Shaders are then compiled with the `debug_printf` option bit
(`ncnn_enable_validation_layer` 1, `NCNN_LOGE` = `debugPrintfEXT`). When the layer is
missing the instance is created without it and one ERROR line says so.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

log = logging.getLogger("vkserve.vulkan.validation")

ENV = "VKSERVE_VALIDATION"
LAYER = "VK_LAYER_KHRONOS_validation"
_SEVERITY_ERROR = 0x1000
_SEVERITY_WARNING = 0x100
_ALL_SEVERITIES = 0x1111  # verbose, info, warning, error
_ALL_TYPES = 0x7  # general, validation, performance
_PRINTF_IDS = ("DEBUG-PRINTF",)  # suffix of the layer's message id for debugPrintfEXT output


def requested() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _log_message(ffi: Any, severity: int, _types: int, data: Any, _user: Any) -> int:
    """PFN_vkDebugUtilsMessengerCallbackEXT: one log line per message."""
    message = ffi.string(data.pMessage).decode(errors="replace") if data.pMessage else ""
    ident = ffi.string(data.pMessageIdName).decode(errors="replace") if data.pMessageIdName else ""
    if ident.endswith(_PRINTF_IDS):
        log.warning("NCNN_LOGE: %s", message)
    elif severity & _SEVERITY_ERROR:
        log.error("%s: %s", ident, message)
    elif severity & _SEVERITY_WARNING:
        log.warning("%s: %s", ident, message)
    else:
        log.debug("%s: %s", ident, message)
    return 0  # VK_FALSE: never abort the call


class ValidationSetup:
    """Layer, extensions and the pNext chain for VkInstanceCreateInfo (kept alive here)."""

    def __init__(self, vk: Any) -> None:
        ffi = vk.ffi
        self._on_message = functools.partial(_log_message, ffi)
        self.layers = [LAYER]
        self.extensions = ["VK_EXT_debug_utils"]
        layer_exts = {e.extensionName for e in vk.vkEnumerateInstanceExtensionProperties(LAYER)}
        if "VK_EXT_validation_features" in layer_exts:
            self.extensions.append("VK_EXT_validation_features")
        self._enables = ffi.new("VkValidationFeatureEnableEXT[]",
                                [vk.VK_VALIDATION_FEATURE_ENABLE_DEBUG_PRINTF_EXT])
        self._features = ffi.new("VkValidationFeaturesEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
            "enabledValidationFeatureCount": 1, "pEnabledValidationFeatures": self._enables})
        self._messenger_info = self._info(vk, self._features)
        self.pnext = ffi.addressof(self._messenger_info)  # messages of vkCreateInstance too
        self.messenger: Any = None

    def _info(self, vk: Any, pnext: Any) -> Any:
        return vk.VkDebugUtilsMessengerCreateInfoEXT(
            pNext=pnext, messageSeverity=_ALL_SEVERITIES, messageType=_ALL_TYPES,
            pfnUserCallback=self._on_message)

    def start(self, vk: Any, instance: Any) -> None:
        """Create the messenger that logs everything after vkCreateInstance."""
        create = vk.vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT")
        self.messenger = create(instance, self._info(vk, None), None)
        log.info("Vulkan validation layer on (%s), NCNN_LOGE prints into this log", LAYER)

    def stop(self, vk: Any, instance: Any) -> None:
        if self.messenger is not None:
            destroy = vk.vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT")
            destroy(instance, self.messenger, None)
            self.messenger = None


def setup(vk: Any) -> ValidationSetup | None:
    """The validation setup when VKSERVE_VALIDATION asks for it and the layer exists."""
    if not requested():
        return None
    layers = {p.layerName for p in vk.vkEnumerateInstanceLayerProperties()}
    if LAYER not in layers:
        log.error("%s=1 but the Vulkan validation layer %s is not installed (Debian: apt install "
                  "vulkan-validationlayers); running without it, NCNN_LOGE is off", ENV, LAYER)
        return None
    return ValidationSetup(vk)
