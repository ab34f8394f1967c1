"""Just enough SPIR-V reflection to build a pipeline layout: which bindings a module uses
(storage buffers, or the dialect's samplers and storage images) and how many bytes of push
constants it reads."""

from __future__ import annotations

import dataclasses
import enum
import struct

SPIRV_MAGIC = 0x07230203
_OP_NAME = {21: "int", 22: "float", 23: "vector", 25: "image", 27: "sampled_image",
            30: "struct", 32: "pointer", 59: "variable", 71: "decorate", 72: "member_decorate"}
_DECORATION_BINDING = 33
_DECORATION_OFFSET = 35
_STORAGE_PUSH_CONSTANT = 9


class DescriptorKind(enum.Enum):
    STORAGE_BUFFER = "storage_buffer"
    SAMPLED_IMAGE = "combined_image_sampler"  # GLSL `uniform samplerND`
    STORAGE_IMAGE = "storage_image"  # GLSL `uniform imageND`


@dataclasses.dataclass(frozen=True)
class ShaderLayout:
    bindings: tuple[int, ...]  # binding numbers used by the module, sorted
    push_constant_size: int  # bytes
    images: tuple[tuple[int, DescriptorKind], ...] = ()  # (binding, kind) of image bindings

    def kind(self, binding: int) -> DescriptorKind:
        return dict(self.images).get(binding, DescriptorKind.STORAGE_BUFFER)

    @property
    def binding_count(self) -> int:
        return self.bindings[-1] + 1 if self.bindings else 0


def reflect(spirv: bytes) -> ShaderLayout:
    if len(spirv) < 20 or len(spirv) % 4:
        raise ValueError(f"not a SPIR-V module: {len(spirv)} bytes")
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    if words[0] != SPIRV_MAGIC:
        raise ValueError(f"not a SPIR-V module: magic {words[0]:#010x}")
    scalar_bytes: dict[int, int] = {}
    vectors: dict[int, tuple[int, int]] = {}
    structs: dict[int, list[int]] = {}
    pointers: dict[int, int] = {}
    member_offsets: dict[tuple[int, int], int] = {}
    bindings: list[int] = []
    binding_of: dict[int, int] = {}  # variable id -> binding
    variable_type: dict[int, int] = {}  # variable id -> its pointer type
    image_kinds: dict[int, DescriptorKind] = {}  # type id -> kind
    push_vars: list[int] = []  # pointer types of push-constant variables
    i = 5
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise ValueError(f"malformed SPIR-V: zero-length instruction at word {i}")
        ops = words[i + 1 : i + count]
        kind = _OP_NAME.get(opcode)
        if kind in ("int", "float"):
            scalar_bytes[ops[0]] = ops[1] // 8
        elif kind == "vector":
            vectors[ops[0]] = (ops[1], ops[2])
        elif kind == "struct":
            structs[ops[0]] = list(ops[1:])
        elif kind == "image":  # OpTypeImage: id, sampled type, dim, depth, arrayed, ms, sampled
            image_kinds[ops[0]] = (DescriptorKind.STORAGE_IMAGE if ops[6] == 2
                                   else DescriptorKind.SAMPLED_IMAGE)
        elif kind == "sampled_image":
            image_kinds[ops[0]] = DescriptorKind.SAMPLED_IMAGE
        elif kind == "pointer":
            pointers[ops[0]] = ops[2]
        elif kind == "variable":  # OpVariable: result type (a pointer), result id, class
            variable_type[ops[1]] = ops[0]
            if ops[2] == _STORAGE_PUSH_CONSTANT:
                push_vars.append(ops[0])
        elif kind == "decorate" and ops[1] == _DECORATION_BINDING:
            bindings.append(ops[2])
            binding_of[ops[0]] = ops[2]
        elif kind == "member_decorate" and ops[2] == _DECORATION_OFFSET:
            member_offsets[(ops[0], ops[1])] = ops[3]
        i += count

    def size_of(type_id: int) -> int:
        if type_id in scalar_bytes:
            return scalar_bytes[type_id]
        if type_id in vectors:
            comp, n = vectors[type_id]
            return size_of(comp) * n
        if type_id in structs:
            return max((member_offsets.get((type_id, m), 0) + size_of(t)
                        for m, t in enumerate(structs[type_id])), default=0)
        raise ValueError(f"unsupported push-constant member type %{type_id}")

    push_size = max((size_of(pointers[ptr]) for ptr in push_vars), default=0)
    images = sorted((binding, image_kinds[pointers[variable_type[var]]])
                    for var, binding in binding_of.items()
                    if pointers.get(variable_type.get(var, -1)) in image_kinds)
    return ShaderLayout(tuple(sorted(set(bindings))), push_size, tuple(images))
