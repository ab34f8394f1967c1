"""Read a DeviceCaps record from a Vulkan physical device."""

from __future__ import annotations

from typing import Any

from vkserve.devices.capabilities import CoopMatrixShape, DeviceCaps, DeviceKind, MemoryHeap
from vkserve.devices.vulkan.instance import Instance

_DEVICE_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}


def _struct(vk: Any, ctype: str, stype: str, pnext: Any = None) -> Any:
    init: dict[str, Any] = {"sType": getattr(vk, stype)}
    if pnext is not None:
        init["pNext"] = pnext
    return vk.ffi.new(ctype + "*", init)


def _scalar_fields(vk: Any, obj: Any, ctype: str) -> dict[str, int]:
    """Integer/bool fields of a struct (arrays and nested structs skipped)."""
    out: dict[str, int] = {}
    for name, field in vk.ffi.typeof(ctype).fields:
        if field.type.kind == "primitive" and field.type.cname not in ("float", "double", "char"):
            out[name] = int(getattr(obj, name))
    return out


# VkComponentTypeKHR -> GLSL type name (the ones the engine's shaders may use)
_COMPONENT_TYPES = {0: "float16_t", 1: "float", 2: "double", 3: "int8_t", 4: "int16_t", 5: "int",
                    7: "uint8_t", 8: "uint16_t", 9: "uint"}
_SCOPE_SUBGROUP = 3  # VK_SCOPE_SUBGROUP_KHR


def _coop_matrix_shapes(instance: Instance, pd: Any) -> tuple[CoopMatrixShape, ...]:
    """The subgroup-scope shapes of vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR whose
    component types GLSL names."""
    vk = instance.vk
    query = vk.vkGetInstanceProcAddr(instance.handle, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    out = []
    for p in query(pd):
        types = [_COMPONENT_TYPES.get(t) for t in (p.AType, p.BType, p.CType, p.ResultType)]
        if p.scope == _SCOPE_SUBGROUP and None not in types and not p.saturatingAccumulation:
            a, b, c, r = (str(t) for t in types)
            out.append(CoopMatrixShape(int(p.MSize), int(p.NSize), int(p.KSize), a, b, c, r))
    return tuple(out)


def read_caps(instance: Instance, index: int) -> DeviceCaps:
    vk = instance.vk
    ffi, lib = vk.ffi, vk.lib
    pd = instance.physical_devices[index]

    extensions = {
        e.extensionName: e.specVersion
        for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)
    }
    base = ffi.new("VkPhysicalDeviceProperties*")
    lib.vkGetPhysicalDeviceProperties(pd, base)
    api = base.apiVersion
    has11 = api >= vk.VK_MAKE_VERSION(1, 1, 0) and instance.api_version >= vk.VK_MAKE_VERSION(1, 1, 0)

    subgroup = _struct(vk, "VkPhysicalDeviceSubgroupProperties",
                       "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES")
    driver = _struct(vk, "VkPhysicalDeviceDriverProperties",
                     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES", subgroup)
    f16 = _struct(vk, "VkPhysicalDevice16BitStorageFeatures",
                  "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES")
    f8 = _struct(vk, "VkPhysicalDevice8BitStorageFeatures",
                 "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES", f16)
    fi = _struct(vk, "VkPhysicalDeviceShaderFloat16Int8Features",
                 "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES", f8)
    memory_model = _struct(vk, "VkPhysicalDeviceVulkanMemoryModelFeatures",
                           "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES", fi)
    coop = _struct(vk, "VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
                   "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR", memory_model)
    # structs of extensions the device lacks stay out of the chain
    has_memory_model = api >= vk.VK_MAKE_VERSION(1, 2, 0) or "VK_KHR_vulkan_memory_model" in extensions
    has_coop = has_memory_model and "VK_KHR_cooperative_matrix" in extensions
    features2 = _struct(vk, "VkPhysicalDeviceFeatures2", "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2",
                        coop if has_coop else memory_model if has_memory_model else fi)
    budget = _struct(vk, "VkPhysicalDeviceMemoryBudgetPropertiesEXT",
                     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT")
    mem2 = _struct(vk, "VkPhysicalDeviceMemoryProperties2",
                   "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2",
                   budget if "VK_EXT_memory_budget" in extensions else None)
    has_driver_props = has11 and (api >= vk.VK_MAKE_VERSION(1, 2, 0)
                                  or "VK_KHR_driver_properties" in extensions)
    has_host_import = "VK_EXT_external_memory_host" in extensions
    host_import = _struct(vk, "VkPhysicalDeviceExternalMemoryHostPropertiesEXT",
                          "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT",
                          driver if has_driver_props else subgroup)
    if has11:
        props2 = _struct(vk, "VkPhysicalDeviceProperties2",
                         "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2",
                         host_import if has_host_import else driver if has_driver_props else subgroup)
        lib.vkGetPhysicalDeviceProperties2(pd, props2)
        lib.vkGetPhysicalDeviceFeatures2(pd, features2)
        lib.vkGetPhysicalDeviceMemoryProperties2(pd, mem2)
        props, feats, mem = props2.properties, features2.features, mem2.memoryProperties
    else:
        props, mem = base[0], ffi.new("VkPhysicalDeviceMemoryProperties*")[0]
        feats = ffi.new("VkPhysicalDeviceFeatures*")[0]
        lib.vkGetPhysicalDeviceFeatures(pd, ffi.addressof(feats))
        lib.vkGetPhysicalDeviceMemoryProperties(pd, ffi.addressof(mem))

    count = ffi.new("uint32_t*")
    lib.vkGetPhysicalDeviceQueueFamilyProperties(pd, count, ffi.NULL)
    families = ffi.new("VkQueueFamilyProperties[]", count[0])
    lib.vkGetPhysicalDeviceQueueFamilyProperties(pd, count, families)
    # Prefer a compute-only family (dedicated async compute), else any with compute.
    compute = [i for i in range(count[0]) if families[i].queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
    dedicated = [i for i in compute if not families[i].queueFlags & vk.VK_QUEUE_GRAPHICS_BIT]
    qfam = (dedicated or compute or [-1])[0]

    has_budget = "VK_EXT_memory_budget" in extensions and has11
    heaps = tuple(
        MemoryHeap(
            size=int(mem.memoryHeaps[i].size),
            device_local=bool(mem.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT),
            budget=int(budget.heapBudget[i]) if has_budget else None,
        )
        for i in range(mem.memoryHeapCount)
    )

    features = _scalar_fields(vk, feats, "VkPhysicalDeviceFeatures")
    if has11:
        for obj, ctype in ((f16[0], "VkPhysicalDevice16BitStorageFeatures"),
                           (f8[0], "VkPhysicalDevice8BitStorageFeatures"),
                           (fi[0], "VkPhysicalDeviceShaderFloat16Int8Features"),
                           *([(memory_model[0], "VkPhysicalDeviceVulkanMemoryModelFeatures")]
                             if has_memory_model else []),
                           *([(coop[0], "VkPhysicalDeviceCooperativeMatrixFeaturesKHR")] if has_coop else [])):
            features.update({k: v for k, v in _scalar_fields(vk, obj, ctype).items()
                             if k != "sType"})
    properties = _scalar_fields(vk, props.limits, "VkPhysicalDeviceLimits")
    properties.update(
        apiVersion=props.apiVersion, driverVersion=props.driverVersion,
        vendorID=props.vendorID, deviceID=props.deviceID, deviceType=props.deviceType,
    )
    subgroup_size = subgroup.subgroupSize if has11 else 1
    subgroup_ops = subgroup.supportedOperations if has11 else 0
    properties.update(subgroupSize=subgroup_size, supportedOperations=subgroup_ops,
                      supportedStages=subgroup.supportedStages if has11 else 0)
    if has11 and has_host_import:
        properties["minImportedHostPointerAlignment"] = int(host_import.minImportedHostPointerAlignment)
    fp16_storage = bool(features.get("storageBuffer16BitAccess"))
    int8_storage = bool(features.get("storageBuffer8BitAccess"))
    return DeviceCaps(
        index=index,
        kind=DeviceKind.VULKAN,
        name=ffi.string(props.deviceName).decode(),
        type=_DEVICE_TYPES.get(props.deviceType, "other"),
        vendor_id=props.vendorID,
        device_id=props.deviceID,
        driver_id=driver.driverID if has_driver_props else 0,
        driver_name=ffi.string(driver.driverName).decode() if has_driver_props else "",
        driver_info=ffi.string(driver.driverInfo).decode() if has_driver_props else "",
        driver_version=props.driverVersion,
        api_version=props.apiVersion,
        pipeline_cache_uuid=bytes(ffi.buffer(props.pipelineCacheUUID, 16)),
        heaps=heaps,
        compute_queue_family=qfam,
        compute_queue_count=families[qfam].queueCount if qfam >= 0 else 0,
        timestamp_period_ns=(float(props.limits.timestampPeriod)
                             if qfam >= 0 and families[qfam].timestampValidBits else 0.0),
        subgroup_size=subgroup_size,
        subgroup_operations=subgroup_ops,
        fp16_storage=fp16_storage,
        fp16_arithmetic=fp16_storage and bool(features.get("shaderFloat16")),
        int8_storage=int8_storage,
        int8_arithmetic=int8_storage and bool(features.get("shaderInt8")),
        cooperative_matrix_shapes=(_coop_matrix_shapes(instance, pd) if has11 and has_coop
                                   and features.get("cooperativeMatrix") and features.get("vulkanMemoryModel")
                                   else ()),
        cooperative_matrix=("VK_KHR_cooperative_matrix" in extensions
                            or "VK_NV_cooperative_matrix" in extensions),
        extensions=extensions,
        features=features,
        properties=properties,
    )
