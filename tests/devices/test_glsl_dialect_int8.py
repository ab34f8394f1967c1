"""The int8 option bits: NCNN_int8_packed/storage/arithmetic follow each bit, the 8-bit
extensions and SPIR-V capabilities come with them, and one shader written for all of them
runs on the Vulkan device in every combination with the same numbers."""

import dataclasses
import struct
from pathlib import Path

import numpy as np
import pytest

from vkserve.devices.vulkan.compiler import UnsupportedPrecision, compile_glsl
from vkserve.devices.vulkan.dispatch import dispatch
from vkserve.devices.vulkan.shader_options import ShaderOptions

SOURCE = (Path(__file__).parent / "shaders" / "dialect_int8.comp").read_text()
QUADS = 45
CAP_INT8 = 39
# StorageBuffer8BitAccess; SPIR-V 1.0 declares storage buffers as Uniform + BufferBlock, so
# glslang asks for UniformAndStorageBuffer8BitAccess there
CAP_8BIT_ACCESS = {4448, 4449}

COMBINATIONS = [ShaderOptions(int8_packed=p, int8_storage=s, int8_arithmetic=a)
                for p in (False, True) for s in (False, True) for a in (False, True)]


def capabilities(spirv: bytes) -> set[int]:
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    caps, i = set(), 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if op == 17:  # OpCapability
            caps.add(words[i + 1])
        i += count
    return caps


@pytest.mark.parametrize("options", COMBINATIONS, ids=lambda o: o.label)
def test_int8_bits_compile_and_run(vulkan_caps, vulkan_ctx, options):
    assert not options.problems(vulkan_caps), options.problems(vulkan_caps)
    spirv = compile_glsl(SOURCE, caps=vulkan_caps, precision=options, name="dialect_int8.comp")
    used = capabilities(spirv)
    assert (CAP_INT8 in used) == options.int8_arithmetic
    assert bool(CAP_8BIT_ACCESS & used) == options.int8_storage

    a = np.random.default_rng(3).integers(-50, 51, QUADS * 4).astype(np.int8)
    if options.int8_storage:
        src, out = a, np.zeros_like(a)
    elif options.int8_packed:
        src, out = a.view(np.int32), np.zeros(QUADS, np.int32)
    else:
        src, out = a.astype(np.int32), np.zeros(QUADS * 4, np.int32)
    _, b = dispatch(vulkan_ctx, spirv, [src, out], global_size=QUADS, local_size=16,
                    push_constants=np.array([QUADS], np.int32), spec_constants=[QUADS])
    got = b.view(np.int8) if options.int8_packed and not options.int8_storage else b
    np.testing.assert_array_equal(got.astype(np.int32), a.astype(np.int32) * 2 + 1)


def test_int8_bits_refused_where_the_device_lacks_them(vulkan_caps):
    bare = dataclasses.replace(vulkan_caps, int8_storage=False, int8_arithmetic=False,
                               features={**vulkan_caps.features, "shaderInt8": 0})
    with pytest.raises(UnsupportedPrecision, match="int8 storage needs storageBuffer8BitAccess"):
        compile_glsl(SOURCE, caps=bare, precision=ShaderOptions(int8_storage=True))
    with pytest.raises(UnsupportedPrecision, match="int8 arithmetic needs shaderInt8"):
        compile_glsl(SOURCE, caps=bare, precision=ShaderOptions(int8_arithmetic=True))
    compile_glsl(SOURCE, caps=bare, precision=ShaderOptions(int8_packed=True))
