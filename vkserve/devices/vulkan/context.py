"""A Vulkan device context: logical device, one compute queue, buffers, submission.

cffi releases the GIL on every C call, so the queue and the command pool (both
externally synchronised objects in Vulkan) are guarded by locks here. Every
object the context creates is counted in `live_objects`, so tests can prove that
teardown leaks nothing.
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from vkserve.devices.capabilities import DeviceCaps
from vkserve.devices.vulkan.errors import VulkanError, check, result_name, vk_errors
from vkserve.devices.vulkan.instance import get_instance

log = logging.getLogger(__name__)

#: how long a fence wait polls the fence before it blocks in the driver, on a GPU. NVIDIA's
#: vkWaitForFences with a long timeout (it sleeps) made a run 50-115 us longer than one with
#: short timeouts, which returns at once (H200, Plan.run of alexnet / resnet18 / squeezenet /
#: vgg16 / mobilenet_v2: 0.23-0.52 ms runs 1.1-1.3x as long as with polling; RESULTS.md,
#: issue 17, fifteenth session); PyTorch's synchronisation spins likewise by default. Not on
#: CPU devices (lavapipe), whose own threads need the cores: polling made a lavapipe run 1.9x
#: slower. ``VKSERVE_FENCE_POLL_US`` sets it (0: never poll).
FENCE_POLL_US = 2000
FENCE_POLL_SLICE_NS = 50_000


def fence_poll_seconds(caps: DeviceCaps, env: Mapping[str, str]) -> float:
    """How long a wait on this device polls its fence before blocking (see FENCE_POLL_US)."""
    raw = env.get("VKSERVE_FENCE_POLL_US")
    if raw is not None:
        try:
            us = int(raw)
        except ValueError:
            us = -1
        if us >= 0:
            return us / 1e6
        log.warning("VKSERVE_FENCE_POLL_US=%r is not a whole number of microseconds >= 0: "
                    "the default (%d on GPUs, 0 on CPU devices) is used", raw, FENCE_POLL_US)
    return 0.0 if caps.is_software else FENCE_POLL_US / 1e6

# Process-wide count of live objects of every context, by type (for leak tests).
LIVE_OBJECTS: collections.Counter[str] = collections.Counter()
_live_lock = threading.Lock()


def _track(kind: str, delta: int) -> None:
    with _live_lock:
        LIVE_OBJECTS[kind] += delta


class MemoryKind(enum.Enum):
    DEVICE = "device"  # device-local; host-visible only if the device happens to offer it
    HOST = "host"  # host-visible, for staging and readback


_DEVICE_FEATURE_STRUCTS = (
    # (ctype, sType, extension that provides it before it became core, its fields)
    ("VkPhysicalDevice16BitStorageFeatures",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES", "VK_KHR_16bit_storage",
     ("storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess", "storagePushConstant16")),
    ("VkPhysicalDevice8BitStorageFeatures",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES", "VK_KHR_8bit_storage",
     ("storageBuffer8BitAccess", "uniformAndStorageBuffer8BitAccess", "storagePushConstant8")),
    ("VkPhysicalDeviceShaderFloat16Int8Features",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES",
     "VK_KHR_shader_float16_int8", ("shaderFloat16", "shaderInt8")),
    # cooperative-matrix shaders use the Vulkan memory model (GL_KHR_memory_scope_semantics)
    ("VkPhysicalDeviceVulkanMemoryModelFeatures",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES", "VK_KHR_vulkan_memory_model",
     ("vulkanMemoryModel",)),
    ("VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR", "VK_KHR_cooperative_matrix",
     ("cooperativeMatrix",)),
)
_OPTIONAL_EXTENSIONS = ("VK_EXT_memory_budget", "VK_KHR_16bit_storage", "VK_KHR_8bit_storage",
                        "VK_KHR_shader_float16_int8", "VK_KHR_storage_buffer_storage_class",
                        "VK_KHR_vulkan_memory_model",
                        "VK_KHR_shader_non_semantic_info",  # debug printf (VKSERVE_VALIDATION)
                        "VK_EXT_external_memory_host")  # clients' shared memory read in place
#: enabled on Vulkan 1.2+ too
_NEVER_CORE = ("VK_EXT_memory_budget", "VK_KHR_cooperative_matrix", "VK_EXT_external_memory_host")


class Buffer:
    """A VkBuffer bound to its own VkDeviceMemory; host-visible ones stay mapped. With
    ``host_pointer`` the memory is the host's own pages from that address on, imported
    (VK_EXT_external_memory_host: ``size`` a multiple of the device's import alignment, the
    pages mapped for as long as the buffer lives; the caller sees to both), not mapped again."""

    def __init__(self, ctx: "VulkanContext", size: int, memory: MemoryKind,
                 host_pointer: int | None = None) -> None:
        vk = ctx.vk
        self.ctx = ctx
        self.size = size
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        imported = None if host_pointer is None else vk.VkExternalMemoryBufferCreateInfo(
            handleTypes=vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT)
        info = vk.VkBufferCreateInfo(pNext=imported, size=max(size, 4), usage=usage,
                                     sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        with vk_errors("vkCreateBuffer"):
            self.handle = vk.vkCreateBuffer(ctx.device, info, None)
        _track("VkBuffer", +1)
        self.memory = None
        self._mapped: Any = None
        try:
            req = vk.vkGetBufferMemoryRequirements(ctx.device, self.handle)
            bits, nbytes, source = req.memoryTypeBits, req.size, None
            if host_pointer is not None:
                bits &= ctx.host_pointer_memory_types(host_pointer)
                nbytes = size
                source = vk.VkImportMemoryHostPointerInfoEXT(
                    handleType=vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
                    pHostPointer=vk.ffi.cast("void *", host_pointer))
            type_index, flags = ctx.pick_memory_type(bits, memory)
            self.host_visible = bool(flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
            self.coherent = bool(flags & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
            if source is not None and not self.coherent:  # it is never mapped here to flush it
                raise VulkanError(f"importing {size} bytes of host memory", "no host-coherent memory type")
            alloc = vk.VkMemoryAllocateInfo(pNext=source, allocationSize=nbytes, memoryTypeIndex=type_index)
            what = "imported host memory" if source is not None else memory.value
            with vk_errors(f"vkAllocateMemory({nbytes} bytes, {what})"):
                self.memory = vk.vkAllocateMemory(ctx.device, alloc, None)
            _track("VkDeviceMemory", +1)
            self.allocation_size = int(nbytes)
            with vk_errors("vkBindBufferMemory"):
                vk.vkBindBufferMemory(ctx.device, self.handle, self.memory, 0)
            if self.host_visible and source is None:
                with vk_errors("vkMapMemory"):
                    self._mapped = vk.vkMapMemory(ctx.device, self.memory, 0, req.size, 0)
        except BaseException:
            self.destroy()
            raise

    @property
    def view(self) -> memoryview:
        """The mapped bytes (host-visible buffers only)."""
        if self._mapped is None:
            raise ValueError("buffer is not host-visible")
        return memoryview(self._mapped)[: self.size]

    def array(self, dtype: Any, count: int | None = None, offset: int = 0) -> np.ndarray:
        """A numpy view of the mapped memory (no copy)."""
        dt = np.dtype(dtype)
        n = (self.size - offset) // dt.itemsize if count is None else count
        return np.frombuffer(self.view, dtype=dt, count=n, offset=offset)

    def _ranges(self, offset: int, size: int | None) -> Any:
        vk = self.ctx.vk
        atom = self.ctx.caps.properties.get("nonCoherentAtomSize", 1) or 1
        start = offset // atom * atom
        end = self.allocation_size if size is None else min(
            self.allocation_size, -(-(offset + size) // atom) * atom)
        return vk.VkMappedMemoryRange(memory=self.memory, offset=start, size=end - start)

    def flush(self, offset: int = 0, size: int | None = None) -> None:
        """Make host writes visible to the device (no-op on coherent memory)."""
        if not self.coherent:
            with vk_errors("vkFlushMappedMemoryRanges"):
                self.ctx.vk.vkFlushMappedMemoryRanges(self.ctx.device, 1, [self._ranges(offset, size)])

    def invalidate(self, offset: int = 0, size: int | None = None) -> None:
        """Make device writes visible to the host (no-op on coherent memory)."""
        if not self.coherent:
            with vk_errors("vkInvalidateMappedMemoryRanges"):
                self.ctx.vk.vkInvalidateMappedMemoryRanges(self.ctx.device, 1,
                                                           [self._ranges(offset, size)])

    def destroy(self) -> None:
        vk, dev = self.ctx.vk, self.ctx.device
        if self._mapped is not None:
            vk.vkUnmapMemory(dev, self.memory)
            self._mapped = None
        if self.handle is not None:
            vk.vkDestroyBuffer(dev, self.handle, None)
            self.handle = None
            _track("VkBuffer", -1)
        if self.memory is not None:
            vk.vkFreeMemory(dev, self.memory, None)
            self.memory = None
            _track("VkDeviceMemory", -1)


class VulkanContext:
    """Logical device with one compute queue for one discovered device."""

    def __init__(self, caps: DeviceCaps) -> None:
        if caps.compute_queue_family < 0:
            raise VulkanError(f"device {caps.index} ({caps.name})", "no compute queue family")
        self.instance = get_instance()
        vk = self.vk = self.instance.vk
        self.caps = caps
        self.physical_device = self.instance.physical_devices[caps.index]
        self.queue_lock = threading.Lock()
        self.pool_lock = threading.Lock()
        self.fence_poll_s = fence_poll_seconds(caps, os.environ)
        #: held by the one wait that polls (others block at once: several threads polling
        #: would each take a core and contend for the GIL with the daemon's event loop)
        self._poll_lock = threading.Lock()
        self.device = None
        self.command_pool = None
        self._host_pointer_properties: Any = None  # vkGetMemoryHostPointerPropertiesEXT, looked up once
        self._create_device()
        try:
            self.queue = vk.vkGetDeviceQueue(self.device, caps.compute_queue_family, 0)
            info = vk.VkCommandPoolCreateInfo(
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                queueFamilyIndex=caps.compute_queue_family)
            with vk_errors("vkCreateCommandPool"):
                self.command_pool = vk.vkCreateCommandPool(self.device, info, None)
            _track("VkCommandPool", +1)
            self._memory_types = vk.vkGetPhysicalDeviceMemoryProperties(self.physical_device)
        except BaseException:
            self.destroy()
            raise

    def _create_device(self) -> None:
        vk, ffi, caps = self.vk, self.vk.ffi, self.caps
        api12 = caps.api_version >= vk.VK_MAKE_VERSION(1, 2, 0)
        api13 = caps.api_version >= vk.VK_MAKE_VERSION(1, 3, 0)
        extensions = [e for e in _OPTIONAL_EXTENSIONS if e in caps.extensions and
                      (e in _NEVER_CORE or not api12
                       or (e == "VK_KHR_shader_non_semantic_info" and not api13))]
        if caps.cooperative_matrix_shapes:  # read_caps found the extension and its features usable
            extensions.append("VK_KHR_cooperative_matrix")
        chain = ffi.NULL
        keep = []
        for ctype, stype, ext, fields in _DEVICE_FEATURE_STRUCTS:
            if not (api12 or ext in caps.extensions):
                continue
            values = {f: 1 for f in fields if caps.features.get(f)}
            if ext == "VK_KHR_cooperative_matrix" and not caps.cooperative_matrix_shapes:
                continue
            if not values:
                continue
            s = ffi.new(ctype + "*", {"sType": getattr(vk, stype), "pNext": chain, **values})
            keep.append(s)
            chain = s
        features2 = ffi.new("VkPhysicalDeviceFeatures2*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": chain})
        for name in ("shaderInt64", "shaderInt16", "shaderFloat64", "robustBufferAccess"):
            if caps.features.get(name):
                setattr(features2.features, name, 1)
        queue_info = vk.VkDeviceQueueCreateInfo(
            queueFamilyIndex=caps.compute_queue_family, queueCount=1, pQueuePriorities=[1.0])
        info = vk.VkDeviceCreateInfo(
            pNext=features2 if caps.api_version >= vk.VK_MAKE_VERSION(1, 1, 0) else None,
            queueCreateInfoCount=1, pQueueCreateInfos=[queue_info],
            enabledExtensionCount=len(extensions), ppEnabledExtensionNames=extensions)
        with vk_errors(f"vkCreateDevice({caps.name})"):
            self.device = vk.vkCreateDevice(self.physical_device, info, None)
        _track("VkDevice", +1)
        self.enabled_extensions = extensions

    def pick_memory_type(self, type_bits: int, kind: MemoryKind) -> tuple[int, int]:
        vk = self.vk
        props = self._memory_types
        visible = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
        if kind is MemoryKind.DEVICE:
            want = [vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT]
        else:  # in order of preference
            coherent = visible | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            want = [coherent | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, coherent, visible]
        for flags in want:
            for i in range(props.memoryTypeCount):
                have = props.memoryTypes[i].propertyFlags
                if type_bits & (1 << i) and have & flags == flags:
                    return i, have
        raise VulkanError(f"allocating {kind.value} memory", "no suitable memory type")

    def create_buffer(self, size: int, memory: MemoryKind = MemoryKind.DEVICE) -> Buffer:
        return Buffer(self, size, memory)

    @property
    def host_import_alignment(self) -> int:
        """Address and size alignment of host memory the device imports; 0 where it cannot
        (VK_EXT_external_memory_host not enabled)."""
        if "VK_EXT_external_memory_host" not in self.enabled_extensions:
            return 0
        return int(self.caps.properties.get("minImportedHostPointerAlignment", 0))

    def import_host(self, address: int, size: int) -> Buffer:
        """A buffer over ``size`` bytes of this process's memory at ``address`` (both aligned
        to ``host_import_alignment``): the device reads and writes those pages themselves."""
        return Buffer(self, size, MemoryKind.HOST, host_pointer=address)

    def host_pointer_memory_types(self, address: int) -> int:
        """Memory type bits that can import the host memory at ``address``."""
        vk = self.vk
        if self._host_pointer_properties is None:
            self._host_pointer_properties = vk.vkGetDeviceProcAddr(self.device, "vkGetMemoryHostPointerPropertiesEXT")
        with vk_errors("vkGetMemoryHostPointerPropertiesEXT"):
            props = self._host_pointer_properties(
                self.device, vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
                vk.ffi.cast("void *", address))
        return int(props.memoryTypeBits)

    # -- commands ---------------------------------------------------------------------------

    def allocate_command_buffer(self) -> Any:
        vk = self.vk
        info = vk.VkCommandBufferAllocateInfo(
            commandPool=self.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            commandBufferCount=1)
        with self.pool_lock, vk_errors("vkAllocateCommandBuffers"):
            cmd = vk.vkAllocateCommandBuffers(self.device, info)[0]
        _track("VkCommandBuffer", +1)
        return cmd

    def free_command_buffer(self, cmd: Any) -> None:
        with self.pool_lock:
            self.vk.vkFreeCommandBuffers(self.device, self.command_pool, 1, [cmd])
        _track("VkCommandBuffer", -1)

    def record(self, cmd: Any, body: Callable[[Any], None], one_time: bool = False) -> None:
        """Record `body(cmd)` into `cmd` (resetting whatever it held)."""
        vk = self.vk
        flags = vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT if one_time else 0
        with self.pool_lock:  # command buffers from one pool share its synchronisation
            with vk_errors("vkBeginCommandBuffer"):
                vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=flags))
            body(cmd)
            with vk_errors("vkEndCommandBuffer"):
                vk.vkEndCommandBuffer(cmd)

    def create_fence(self) -> Any:
        with vk_errors("vkCreateFence"):
            fence = self.vk.vkCreateFence(self.device, self.vk.VkFenceCreateInfo(), None)
        _track("VkFence", +1)
        return fence

    def destroy_fence(self, fence: Any) -> None:
        self.vk.vkDestroyFence(self.device, fence, None)
        _track("VkFence", -1)

    def submit(self, cmd: Any, fence: Any) -> None:
        vk = self.vk
        info = vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])
        with self.queue_lock, vk_errors("vkQueueSubmit"):
            vk.vkQueueSubmit(self.queue, 1, [info], fence)

    def wait_fence(self, fence: Any, timeout_s: float | None = None,
                   between_waits: Callable[[], None] | None = None) -> None:
        """Wait for `fence`: polled first for up to ``fence_poll_s`` (by one waiting thread at a
        time), then in blocking slices so a caller (e.g. a trio worker thread) can cancel in
        between: `between_waits` runs after each 50 ms slice and may raise to abandon the wait."""
        lib, ffi = self.vk.lib, self.vk.ffi
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self.fence_poll_s > 0 and self._poll_lock.acquire(blocking=False):
            try:
                poll = self.fence_poll_s if timeout_s is None else min(self.fence_poll_s, timeout_s)
                if self._poll_fence(fence, poll):
                    return
            finally:
                self._poll_lock.release()
        fences = ffi.new("VkFence[1]", [fence])
        while True:
            code = lib.vkWaitForFences(self.device, 1, fences, 1, 50_000_000)
            if code == 0:
                return
            if code != self.vk.VK_TIMEOUT:
                check(code, "vkWaitForFences")
            if deadline is not None and time.monotonic() > deadline:
                raise VulkanError("vkWaitForFences", result_name(code), code)
            if between_waits is not None:
                between_waits()

    def _poll_fence(self, fence: Any, seconds: float) -> bool:
        """Whether `fence` signalled within `seconds` of polling it: vkWaitForFences in slices
        of FENCE_POLL_SLICE_NS, which return as soon as the fence signals (measured on the
        H200: as fast as vkGetFenceStatus in a loop) and hold the calling thread outside
        Python, so it seldom asks for the GIL (a vkGetFenceStatus loop, re-taking the GIL every
        microsecond, cost the daemon's event loop up to 30 % of its throughput under load)."""
        lib, ffi = self.vk.lib, self.vk.ffi
        fences = ffi.new("VkFence[1]", [fence])
        end = time.perf_counter() + seconds
        while True:
            code = lib.vkWaitForFences(self.device, 1, fences, 1, FENCE_POLL_SLICE_NS)
            if code == 0:
                return True
            if code != self.vk.VK_TIMEOUT:
                check(code, "vkWaitForFences")
            if time.perf_counter() > end:
                return False

    def reset_fence(self, fence: Any) -> None:
        with vk_errors("vkResetFences"):
            self.vk.vkResetFences(self.device, 1, [fence])

    def run_once(self, body: Callable[[Any], None], timeout_s: float | None = 60.0) -> None:
        """Record `body` into a fresh command buffer, submit it and wait."""
        cmd = self.allocate_command_buffer()
        fence = self.create_fence()
        try:
            self.record(cmd, body, one_time=True)
            self.submit(cmd, fence)
            self.wait_fence(fence, timeout_s)
        finally:
            self.destroy_fence(fence)
            self.free_command_buffer(cmd)

    def copy(self, src: Buffer, dst: Buffer, size: int, src_offset: int = 0,
             dst_offset: int = 0) -> None:
        vk = self.vk
        region = vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=size)
        self.run_once(lambda cmd: vk.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1, [region]))

    def upload(self, dst: Buffer, data: np.ndarray, offset: int = 0) -> None:
        """Copy host bytes into a buffer, through a staging buffer unless it is mapped."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if dst.host_visible:
            dst.array(np.uint8, raw.size, offset)[...] = raw  # frombuffer view is writable here
            dst.flush(offset, raw.size)
            return
        staging = self.create_buffer(raw.size, MemoryKind.HOST)
        try:
            staging.array(np.uint8, raw.size)[...] = raw
            staging.flush()
            self.copy(staging, dst, raw.size, 0, offset)
        finally:
            staging.destroy()

    def download(self, src: Buffer, dtype: Any, count: int, offset: int = 0) -> np.ndarray:
        """Copy `count` elements out of a buffer into a new numpy array."""
        nbytes = np.dtype(dtype).itemsize * count
        if src.host_visible:
            src.invalidate(offset, nbytes)
            return src.array(dtype, count, offset).copy()
        staging = self.create_buffer(nbytes, MemoryKind.HOST)
        try:
            self.copy(src, staging, nbytes, offset, 0)
            staging.invalidate()
            return staging.array(dtype, count).copy()
        finally:
            staging.destroy()

    def destroy(self) -> None:
        vk = self.vk
        if self.device is None:
            return
        with self.queue_lock:
            vk.vkDeviceWaitIdle(self.device)
        if self.command_pool is not None:
            vk.vkDestroyCommandPool(self.device, self.command_pool, None)
            self.command_pool = None
            _track("VkCommandPool", -1)
        vk.vkDestroyDevice(self.device, None)
        self.device = None
        _track("VkDevice", -1)

    def __enter__(self) -> "VulkanContext":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
