"""The capability record of one device, read once at discovery.

It is plain data (no Vulkan handles), so it can be printed, serialised to JSON,
compared across processes (the pipeline cache keys its files on it) and handed
to the GLSL compiler, which turns `extensions`, `features` and `properties`
into `ncnn_<name>` device macros.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class DeviceKind(str, enum.Enum):
    VULKAN = "vulkan"
    CPU = "cpu"


class Precision(str, enum.Enum):
    """Storage/arithmetic mode a shader is expanded for (DESIGN §4)."""

    FP32 = "fp32"
    FP16_PACKED = "fp16p"  # fp16 packed two to a uint, fp32 arithmetic
    FP16_STORAGE = "fp16s"  # float16_t storage, fp32 arithmetic
    FP16_ARITHMETIC = "fp16sa"  # float16_t storage and arithmetic


@dataclasses.dataclass(frozen=True)
class MemoryHeap:
    size: int
    device_local: bool
    budget: int | None = None  # VK_EXT_memory_budget, when the driver reports it


@dataclasses.dataclass(frozen=True)
class CoopMatrixShape:
    """One VkCooperativeMatrixPropertiesKHR entry of subgroup scope: A is m x k, B k x n, C and
    the result m x n; component types by their GLSL names (``float16_t``, ``float``, ...)."""

    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str


@dataclasses.dataclass(frozen=True)
class DeviceCaps:
    index: int
    kind: DeviceKind
    name: str
    type: str  # "discrete-gpu", "integrated-gpu", "virtual-gpu", "cpu", "other"
    vendor_id: int = 0
    device_id: int = 0
    driver_id: int = 0
    driver_name: str = ""
    driver_info: str = ""
    driver_version: int = 0
    api_version: int = 0
    pipeline_cache_uuid: bytes = b""
    heaps: tuple[MemoryHeap, ...] = ()
    compute_queue_family: int = -1
    compute_queue_count: int = 0
    timestamp_period_ns: float = 0.0  # 0: no timestamps on the compute queue
    subgroup_size: int = 1
    subgroup_operations: int = 0  # VkSubgroupFeatureFlags bits
    fp16_storage: bool = False
    fp16_arithmetic: bool = False
    int8_storage: bool = False
    int8_arithmetic: bool = False
    cooperative_matrix: bool = False
    # VK_KHR_cooperative_matrix's subgroup-scope shapes, when the device enables the extension
    cooperative_matrix_shapes: tuple[CoopMatrixShape, ...] = ()
    # Everything the GLSL device macros need: extension -> spec version,
    # feature name -> 0/1, property/limit name -> int.
    extensions: dict[str, int] = dataclasses.field(default_factory=dict)
    features: dict[str, int] = dataclasses.field(default_factory=dict)
    properties: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def is_software(self) -> bool:
        """lavapipe/llvmpipe and friends: usable, but ranked below real GPUs."""
        return self.kind is DeviceKind.VULKAN and self.type == "cpu"

    @property
    def subgroup_arithmetic(self) -> bool:
        return bool(self.subgroup_operations & 0x4)  # VK_SUBGROUP_FEATURE_ARITHMETIC_BIT

    def has_coop_matrix(self, m: int, n: int, k: int, ab: str, acc: str) -> bool:
        """Whether a subgroup-scope m x n x k cooperative matrix product with A and B of type
        `ab` and accumulator and result of type `acc` is offered."""
        return any((c.m, c.n, c.k, c.a, c.b, c.c, c.result) == (m, n, k, ab, ab, acc, acc)
                   for c in self.cooperative_matrix_shapes)

    def supported_precisions(self) -> list[Precision]:
        if self.kind is DeviceKind.CPU:
            return [Precision.FP32]
        modes = [Precision.FP32, Precision.FP16_PACKED]
        if self.fp16_storage:
            modes.append(Precision.FP16_STORAGE)
            if self.fp16_arithmetic:
                modes.append(Precision.FP16_ARITHMETIC)
        return modes

    @staticmethod
    def version_string(v: int) -> str:
        return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"

    def summary(self) -> dict[str, Any]:
        """The `vkserve devices --json` object."""
        return {
            "index": self.index,
            "kind": self.kind.value,
            "name": self.name,
            "type": self.type,
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
            "driver_id": self.driver_id,
            "driver_name": self.driver_name,
            "driver_info": self.driver_info,
            "driver_version": self.driver_version,
            "api_version": self.version_string(self.api_version) if self.api_version else "",
            "pipeline_cache_uuid": self.pipeline_cache_uuid.hex(),
            "fp16_storage": self.fp16_storage,
            "fp16_arithmetic": self.fp16_arithmetic,
            "int8_storage": self.int8_storage,
            "int8_arithmetic": self.int8_arithmetic,
            "subgroup_size": self.subgroup_size,
            "subgroup_arithmetic": self.subgroup_arithmetic,
            "cooperative_matrix": self.cooperative_matrix,
            "cooperative_matrix_shapes": [dataclasses.asdict(c) for c in self.cooperative_matrix_shapes],
            "software": self.is_software,
            "precisions": [p.value for p in self.supported_precisions()],
            "heaps": [
                {"size": h.size, "device_local": h.device_local, "budget": h.budget}
                for h in self.heaps
            ],
        }
