"""The option bits a shader is expanded for (ncnn's `Option` switches, seed glsl-extension.md).

Each bit is independent; the four `Precision` modes are named combinations of them
(`ShaderOptions.for_precision`). A combination is valid for a device when the device has
every feature its bits need (`ShaderOptions.problems`).

Bits (the SPIR-V cache key's `option_bits`, so they must stay stable):

===  ==========================  =====================================================
bit  option                      needs on the device
===  ==========================  =====================================================
0    fp16_packed                 nothing (packHalf2x16 is core GLSL 4.20)
1    fp16_storage                storageBuffer16BitAccess
2    fp16_arithmetic             shaderFloat16
3    fp16_uniform (fp16 locals)  shaderFloat16 (16-bit floats in shared memory)
4    int8_packed                 nothing
5    int8_storage                storageBuffer8BitAccess + uniformAndStorageBuffer8BitAccess
6    int8_arithmetic             shaderInt8
7    image_storage               storage images (16-bit `imfmt1` = r16f also needs
                                 shaderStorageImageExtendedFormats)
8    shader local memory OFF     (set when `shader_local_memory` is False: the default
                                 options keep the pre-bit keys)
9    debug_printf                the validation layer (NCNN_LOGE, VKSERVE_VALIDATION=1)
===  ==========================  =====================================================
"""

from __future__ import annotations

import dataclasses
import enum

from vkserve.devices.capabilities import DeviceCaps, DeviceKind, Precision

_BITS = {
    "fp16_packed": 0, "fp16_storage": 1, "fp16_arithmetic": 2, "fp16_uniform": 3,
    "int8_packed": 4, "int8_storage": 5, "int8_arithmetic": 6, "image_storage": 7,
    "debug_printf": 9,
}
_LOCAL_MEMORY_OFF_BIT = 8
_ALL_BITS = sum(1 << b for b in _BITS.values()) | (1 << _LOCAL_MEMORY_OFF_BIT)


class StorageKind(enum.Enum):
    """How fp values sit in buffers (the storage-type table's columns)."""

    FP32 = "fp32"
    FP16_PACKED = "fp16p"  # halves packed in uints
    FP16 = "fp16s"  # float16_t


class LocalKind(enum.Enum):
    """What `lfpvec4` is (the local-type tables' columns; `lfp` follows from it)."""

    FP32 = "vec4"
    PACKED_UVEC2 = "uvec2"  # fp16p / fp16s only
    PACKED_U64 = "uint64_t"  # fp16s + fp16a (uvec2 on a device without shaderInt64)
    FP16 = "f16vec4"  # fp16 uniform (the old document's fp16a column)


@dataclasses.dataclass(frozen=True)
class ShaderOptions:
    fp16_packed: bool = False
    fp16_storage: bool = False
    fp16_arithmetic: bool = False
    fp16_uniform: bool = False
    int8_packed: bool = False
    int8_storage: bool = False
    int8_arithmetic: bool = False
    image_storage: bool = False
    shader_local_memory: bool = True
    debug_printf: bool = False

    @classmethod
    def for_precision(cls, precision: Precision | str) -> ShaderOptions:
        p = Precision(precision)
        if p is Precision.FP16_PACKED:
            return cls(fp16_packed=True)
        if p is Precision.FP16_STORAGE:
            return cls(fp16_storage=True)
        if p is Precision.FP16_ARITHMETIC:
            return cls(fp16_storage=True, fp16_arithmetic=True, fp16_uniform=True)
        return cls()

    @classmethod
    def coerce(cls, value: ShaderOptions | Precision | str) -> ShaderOptions:
        return value if isinstance(value, ShaderOptions) else cls.for_precision(value)

    @property
    def bits(self) -> int:
        out = sum(1 << bit for name, bit in _BITS.items() if getattr(self, name))
        if not self.shader_local_memory:
            out |= 1 << _LOCAL_MEMORY_OFF_BIT
        return out

    @classmethod
    def from_bits(cls, bits: int) -> ShaderOptions:
        if bits & ~_ALL_BITS:
            raise ValueError(f"unknown shader option bits {bits & ~_ALL_BITS:#x} in {bits:#x}")
        flags = {name: bool(bits >> bit & 1) for name, bit in _BITS.items()}
        return cls(**flags, shader_local_memory=not bits >> _LOCAL_MEMORY_OFF_BIT & 1)

    def replace(self, **changes: bool) -> ShaderOptions:
        return dataclasses.replace(self, **changes)

    @property
    def label(self) -> str:
        """Short name for logs: the set bits, e.g. 'fp16p+fp16a'."""
        short = {"fp16_packed": "fp16p", "fp16_storage": "fp16s", "fp16_arithmetic": "fp16a",
                 "fp16_uniform": "fp16u", "int8_packed": "int8p", "int8_storage": "int8s",
                 "int8_arithmetic": "int8a", "image_storage": "image", "debug_printf": "printf"}
        parts = [s for name, s in short.items() if getattr(self, name)]
        if not self.shader_local_memory:
            parts.append("nolocal")
        return "+".join(parts) or "fp32"

    # -- what the bits resolve to --------------------------------------------------------

    @property
    def storage(self) -> StorageKind:
        if self.fp16_storage:
            return StorageKind.FP16
        return StorageKind.FP16_PACKED if self.fp16_packed else StorageKind.FP32

    def local(self, caps: DeviceCaps) -> LocalKind:
        if self.fp16_uniform:
            return LocalKind.FP16
        if self.storage is StorageKind.FP16 and self.fp16_arithmetic:
            return LocalKind.PACKED_U64 if has_int64(caps) else LocalKind.PACKED_UVEC2
        if self.storage is StorageKind.FP32:
            return LocalKind.FP32
        return LocalKind.PACKED_UVEC2

    def problems(self, caps: DeviceCaps) -> list[str]:
        """Why this combination cannot run on `caps` (empty: it can)."""
        if caps.kind is DeviceKind.CPU:
            return ([] if self.bits == 0 else
                    ["it is a CPU device (no Vulkan), only the fp32 defaults exist there"])
        out = []
        if self.fp16_storage and not caps.fp16_storage:
            out.append("fp16 storage needs 16-bit storage (storageBuffer16BitAccess, "
                       "VK_KHR_16bit_storage)")
        if self.fp16_arithmetic and not has_float16(caps):
            out.append("fp16 arithmetic needs shaderFloat16 (VK_KHR_shader_float16_int8)")
        if self.fp16_uniform and not has_float16(caps):
            out.append("fp16 uniform (fp16 shared memory) needs shaderFloat16 "
                       "(VK_KHR_shader_float16_int8)")
        if self.int8_storage and not (caps.int8_storage and caps.features.get(
                "uniformAndStorageBuffer8BitAccess")):
            # SPIR-V 1.0 declares storage buffers as Uniform + BufferBlock: glslang then asks
            # for UniformAndStorageBuffer8BitAccess (16-bit storage has no such split)
            out.append("int8 storage needs storageBuffer8BitAccess and "
                       "uniformAndStorageBuffer8BitAccess (VK_KHR_8bit_storage)")
        if self.int8_arithmetic and not (caps.int8_arithmetic or caps.features.get("shaderInt8")):
            out.append("int8 arithmetic needs shaderInt8 (VK_KHR_shader_float16_int8)")
        if (self.image_storage and self.storage is not StorageKind.FP32
                and not caps.features.get("shaderStorageImageExtendedFormats")):
            out.append("fp16 image storage (r16f) needs shaderStorageImageExtendedFormats")
        return out


def has_float16(caps: DeviceCaps) -> bool:
    return caps.fp16_arithmetic or bool(caps.features.get("shaderFloat16"))


def has_int64(caps: DeviceCaps) -> bool:
    return bool(caps.features.get("shaderInt64"))


def has_local_memory(caps: DeviceCaps) -> bool:
    """The device's own shared-memory size (maxComputeSharedMemorySize), not its type."""
    return int(caps.properties.get("maxComputeSharedMemorySize", 0)) > 0

