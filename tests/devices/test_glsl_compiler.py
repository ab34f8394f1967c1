"""The extended-GLSL compiler: expansion, SPIR-V output, errors, threads (no GPU needed)."""

from __future__ import annotations

import re
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from vkserve.devices.capabilities import DeviceCaps, DeviceKind, Precision
from vkserve.devices.vulkan import glsl_extension
from vkserve.devices.vulkan.compiler import (
    SPIRV_MAGIC,
    ShaderCompileError,
    UnsupportedPrecision,
    compile_expanded,
    compile_glsl,
    expand_glsl,
)
from vkserve.devices.vulkan.glsl_extension import expand, sanitize

ALL_MODES = list(Precision)


def make_caps(**kw: object) -> DeviceCaps:
    base: dict[str, object] = dict(
        index=0,
        kind=DeviceKind.VULKAN,
        name="Fake GPU",
        type="discrete-gpu",
        vendor_id=0x10DE,
        device_id=0x2330,
        api_version=(1 << 22) | (3 << 12),
        subgroup_size=8,
        subgroup_operations=0x7F,  # basic..clustered
        fp16_storage=True,
        fp16_arithmetic=True,
        extensions={"VK_KHR_16bit_storage": 1, "VK_KHR_shader_float16_int8": 1, "VK_EXT_weird-name.x": 3},
        features={"robustBufferAccess": 1, "shaderInt64": 1, "shaderInt16": 0, "storageBuffer16BitAccess": 1},
        properties={
            "vendorID": 0x10DE,
            "maxComputeWorkGroupSize": (1024, 1024, 64),
            "maxStorageBufferRange": 2**32 - 1,
            "maxMemoryAllocationSize": 2**40,
            "minTexelOffset": -8,
        },
    )
    base.update(kw)
    return DeviceCaps(**base)  # type: ignore[arg-type]


CAPS = make_caps()
FP32_ONLY = make_caps(name="Old GPU", fp16_storage=False, fp16_arithmetic=False)
STORAGE_ONLY = make_caps(name="Mid GPU", fp16_arithmetic=False)

# Every type and every helper, in a shader that must compile in every mode.
ALL_HELPERS = """\
#version 450

layout (constant_id = 0) const int n = 0;

layout (binding = 0) readonly buffer a_blob { sfp a_data[]; };
layout (binding = 1) readonly buffer b_blob { sfpvec2 b_data[]; };
layout (binding = 2) readonly buffer c_blob { sfpvec4 c_data[]; };
layout (binding = 3) buffer d_blob { sfp d_data[]; };
layout (binding = 4) writeonly buffer e_blob { sfpvec2 e_data[]; };
layout (binding = 5) buffer f_blob { sfpvec4 f_data[]; };
layout (binding = 6) buffer g_blob { sfpvec8 g_data[]; };

layout (push_constant) uniform parameter { int n; } p;

shared lfp tmp1[64];
shared lfpvec4 tmp4[64];

void main()
{
    const int gx = int(gl_GlobalInvocationID.x);
    const int lx = int(gl_LocalInvocationID.x);
    const uint ux = gl_GlobalInvocationID.x;
    if (gx >= psc(n)) return;

    afp x = buffer_ld1(a_data, gx) + buffer_ld1(a_data, ux);
    afpvec2 y = buffer_ld2(b_data, gx);
    afpvec4 z = buffer_ld4(c_data, gx);

    tmp1[lx] = sfp2lfp(a_data[gx]);
    tmp4[lx] = sfp2lfpvec4(c_data[gx]);
    tmp1[lx] = buffer_sm1(a_data, gx);
    tmp4[lx] = buffer_sm4(c_data, gx);
    barrier();
    afp x2 = lfp2afp(tmp1[lx]);
    afpvec4 z2 = lfp2afpvec4(tmp4[lx]);
    tmp1[lx] = afp2lfp(x2);
    tmp4[lx] = afp2lfpvec4(z2);

    buffer_st1(d_data, gx, x + x2);
    buffer_st1(d_data, ux, afp(1));
    buffer_st2(e_data, gx, y * afp(2));
    buffer_st4(f_data, gx, z + z2);
    buffer_cp1(d_data, gx + 1, a_data, gx);
    buffer_cp2(e_data, gx + 1, b_data, gx);
    buffer_cp4(f_data, gx + 1, c_data, gx);
    buffer_cp1to4(f_data, gx + 2, a_data, ivec4(gx, gx + 1, gx + 2, gx + 3));
    buffer_cp4to1(d_data, ivec4(gx, gx + 1, gx + 2, gx + 3), c_data, gx);

    afpvec8 w = buffer_ld8(g_data, gx);
    buffer_st8(g_data, gx + 1, w);
    buffer_cp8(g_data, gx + 2, g_data, gx);
    buffer_cp1to8(g_data, gx + 3, a_data, ivec4(gx), ivec4(gx + 1));
    buffer_cp4to8(g_data, gx + 4, c_data, ivec2(gx, gx + 1));
    buffer_cp8to1(d_data, ivec4(gx), ivec4(gx + 1), g_data, gx);
    buffer_cp8to4(f_data, ivec2(gx, gx + 1), g_data, gx);
}
"""


def spirv_words(spv: bytes) -> tuple[int, ...]:
    assert len(spv) % 4 == 0
    return struct.unpack(f"<{len(spv) // 4}I", spv)


# ------------------------------------------------------------------ compile


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)
def test_every_mode_compiles_every_type_and_helper(mode: Precision, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VKSERVE_VALIDATE_SPIRV", "1")  # also run spirv-val on the output
    spv = compile_glsl(ALL_HELPERS, caps=CAPS, precision=mode, name="all.comp")
    words = spirv_words(spv)
    assert words[0] == SPIRV_MAGIC
    assert words[1] == 0x00010000  # SPIR-V 1.0: no subgroup use


def test_spirv_starts_with_magic() -> None:
    spv = compile_glsl("#version 450\nvoid main() {}\n", caps=CAPS, precision=Precision.FP32)
    assert isinstance(spv, bytes) and len(spv) % 4 == 0
    assert spv[:4] == struct.pack("<I", 0x07230203)


def test_subgroup_shader_targets_spirv_1_3() -> None:
    src = """#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require
layout (binding = 0) buffer b { sfp data[]; };
void main()
{
    afp v = buffer_ld1(data, int(gl_GlobalInvocationID.x));
    v = subgroupAdd(v);
    buffer_st1(data, int(gl_GlobalInvocationID.x), v);
}
"""
    for mode in (Precision.FP32, Precision.FP16_STORAGE):
        words = spirv_words(compile_glsl(src, caps=CAPS, precision=mode, name="sg.comp"))
        assert words[1] == 0x00010300


def test_subgroup_mention_in_comment_does_not_raise_target() -> None:
    src = "#version 450\n// #extension GL_KHR_shader_subgroup_basic : require\nvoid main() {}\n"
    assert spirv_words(compile_glsl(src, caps=CAPS, precision=Precision.FP32))[1] == 0x00010000


# ------------------------------------------------------------------ expansion


def test_macros_right_after_version_line() -> None:
    src = "// a leading comment\n#version 450\nvoid main() {}\n"
    text = expand_glsl(src, caps=CAPS, precision=Precision.FP16_ARITHMETIC)
    lines = text.splitlines()
    assert lines[0] == "// a leading comment"
    assert lines[1] == "#version 450"
    assert lines[2].startswith("#line")
    assert lines[3] == "#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require"
    assert "#extension GL_EXT_shader_16bit_storage : require" in lines
    assert "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require" in lines
    # Everything between #version and the shader's own code is preamble.
    first_code = lines.index("void main() {}")
    assert lines[first_code - 1] == "#line 3 0"
    helper_function = re.compile(r"(uvec2|uvec4|vec4|mat2x4|f16vec4|f16mat2x4|uint64_t) _vks_\w+\(")
    assert all(line.startswith(("#", "layout")) or helper_function.match(line)
               for line in lines[2:first_code])
    assert "#define sfp float16_t" in lines and "#define afpvec4 f16vec4" in lines


def test_source_without_version_gets_450() -> None:
    text = expand_glsl("void main() {}\n", caps=CAPS, precision=Precision.FP32)
    assert text.startswith("#version 450\n#line 1 1\n")
    assert "#line 1 0\nvoid main() {}" in text


@pytest.mark.parametrize(
    ("mode", "packed", "storage", "arith", "exts"),
    [
        (Precision.FP32, 0, 0, 0, []),
        (Precision.FP16_PACKED, 1, 0, 0, []),
        (Precision.FP16_STORAGE, 0, 1, 0, ["GL_EXT_shader_16bit_storage"]),
        (Precision.FP16_ARITHMETIC, 0, 1, 1,
         ["GL_EXT_shader_16bit_storage", "GL_EXT_shader_explicit_arithmetic_types_float16"]),
    ],
)
def test_option_macros_and_extensions(mode: Precision, packed: int, storage: int, arith: int,
                                      exts: list[str]) -> None:
    text = expand_glsl("#version 450\nvoid main() {}\n", caps=CAPS, precision=mode)
    assert f"#define NCNN_fp16_packed {packed}\n" in text
    assert f"#define NCNN_fp16_storage {storage}\n" in text
    assert f"#define NCNN_fp16_arithmetic {arith}\n" in text
    for name in ("NCNN_int8_packed", "NCNN_int8_storage", "NCNN_int8_arithmetic"):
        assert f"#define {name} 0\n" in text
    enabled = re.findall(r"^#extension (\w+) : require$", text, re.MULTILINE)
    assert [e for e in enabled if "16bit" in e or "float16" in e] == exts
    assert "GL_EXT_shader_explicit_arithmetic_types_int64" in enabled  # shaderInt64 = 1
    assert "GL_EXT_shader_explicit_arithmetic_types_int16" not in enabled  # shaderInt16 = 0


def test_type_table() -> None:
    expect = {
        Precision.FP32: ("float", "vec2", "vec4", "float", "vec4"),
        Precision.FP16_PACKED: ("uint", "uint", "uvec2", "float", "vec4"),
        Precision.FP16_STORAGE: ("float16_t", "f16vec2", "f16vec4", "float", "vec4"),
        Precision.FP16_ARITHMETIC: ("float16_t", "f16vec2", "f16vec4", "float16_t", "f16vec4"),
    }
    for mode, (sfp, sfp2, sfp4, afp, afp4) in expect.items():
        t = glsl_extension.type_macros(mode, CAPS)
        assert (t["sfp"], t["sfpvec2"], t["sfpvec4"], t["afp"], t["afpvec4"]) == (sfp, sfp2, sfp4, afp, afp4)


def test_device_macros() -> None:
    m = glsl_extension.device_macros(CAPS)
    assert m["ncnn_VK_KHR_16bit_storage"] == "1"
    assert m["ncnn_VK_EXT_weird_name_x"] == "3"  # sanitized
    assert m["ncnn_robustBufferAccess"] == "1"
    assert m["ncnn_shaderInt16"] == "0"
    assert m["ncnn_vendorID"] == str(0x10DE)
    assert m["ncnn_deviceID"] == str(0x2330)
    assert m["ncnn_deviceType"] == "2"
    assert m["ncnn_subgroupSize"] == "8"
    assert m["ncnn_supportedOperations"] == str(0x7F)
    assert m["ncnn_subgroup_arithmetic"] == "1"
    assert m["ncnn_subgroup_quad"] == "0"
    assert m["ncnn_maxComputeWorkGroupSize_2"] == "64"
    assert m["ncnn_maxStorageBufferRange"] == "4294967295"
    assert m["ncnn_maxMemoryAllocationSize"] == "4294967295"  # clamped to 32 bits
    assert m["ncnn_minTexelOffset"] == "(-8)"
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and "__" not in k for k in m)


def test_sanitize() -> None:
    assert sanitize("VK_EXT_a-b.c") == "VK_EXT_a_b_c"
    assert sanitize("a__b") == "a_b"
    assert sanitize("3d") == "_3d"


def test_device_macros_usable_in_preprocessor() -> None:
    src = """#version 450
layout (binding = 0) buffer b { int data[]; };
void main()
{
#if ncnn_subgroupSize == 8 && ncnn_subgroup_arithmetic && ncnn_VK_KHR_16bit_storage >= 1 && ncnn_glsl_version >= 1
    data[0] = ncnn_subgroupSize;
#else
    #error device macros missing
#endif
#if ncnn_supportedOperations & 4
    data[1] = ncnn_maxComputeWorkGroupSize_0;
#endif
}
"""
    compile_glsl(src, caps=CAPS, precision=Precision.FP32, name="macros.comp")
    with pytest.raises(ShaderCompileError, match="device macros missing"):
        compile_glsl(src, caps=make_caps(subgroup_size=32), precision=Precision.FP32, name="macros.comp")


def test_caller_defines_and_override() -> None:
    src = "#version 450\nlayout (binding = 0) buffer b { int data[]; };\nvoid main() { data[0] = KSIZE; }\n"
    text = expand_glsl(src, caps=CAPS, precision=Precision.FP32, defines={"KSIZE": 3, "NCNN_moltenvk": "1"})
    assert "#define KSIZE 3\n" in text
    assert text.count("#define NCNN_moltenvk") == 1 and "#define NCNN_moltenvk 1\n" in text
    compile_glsl(src, caps=CAPS, precision=Precision.FP32, defines={"KSIZE": 3})
    with pytest.raises(ValueError):
        expand_glsl(src, caps=CAPS, precision=Precision.FP32, defines={"bad name": 1})


def test_psc_expansion() -> None:
    src = """#version 450
layout (constant_id = 0) const int w = 0;
layout (push_constant) uniform parameter { int w; } p;
layout (binding = 0) buffer b { int data[]; };
void main() { data[0] = psc(w); }
"""
    text = expand_glsl(src, caps=CAPS, precision=Precision.FP32)
    assert "#define psc(x) ((x) == 0 ? p.x : (x))" in text
    compile_glsl(src, caps=CAPS, precision=Precision.FP32)


def test_local_size_injection() -> None:
    no_size = "#version 450\nvoid main() {}\n"
    e = expand(no_size, caps=CAPS, options=Precision.FP32)
    assert e.injected_local_size
    assert glsl_extension.LOCAL_SIZE_LAYOUT in e.text
    spv = spirv_words(compile_glsl(no_size, caps=CAPS, precision=Precision.FP32))
    # OpDecorate <id> SpecId <233|234|235>: opcode 71, decoration SpecId = 1.
    spec_ids = {spv[i + 3] for i in range(5, len(spv) - 3) if spv[i] == (4 << 16 | 71) and spv[i + 2] == 1}
    assert {233, 234, 235} <= spec_ids

    with_size = "#version 450\nlayout (local_size_x = 64) in;\nvoid main() {}\n"
    assert not expand(with_size, caps=CAPS, options=Precision.FP32).injected_local_size
    compile_glsl(with_size, caps=CAPS, precision=Precision.FP32)
    commented = "#version 450\n// layout (local_size_x = 64) in;\nvoid main() {}\n"
    assert expand(commented, caps=CAPS, options=Precision.FP32).injected_local_size


# ------------------------------------------------------------------ errors


BROKEN = """#version 450
#extension GL_GOOGLE_include_directive : enable

layout (binding = 0) buffer b { sfp data[]; };

void main()
{
    int gx = int(gl_GlobalInvocationID.x);
    afp a = buffer_ld1(data, gx);

    // the next line is line 12
    afp y = x + 1;
    buffer_st1(data, gx, y);
}
"""


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)
def test_error_reports_shader_line(mode: Precision) -> None:
    with pytest.raises(ShaderCompileError) as info:
        compile_glsl(BROKEN, caps=CAPS, precision=mode, name="foo.comp")
    err = info.value
    assert err.shader_name == "foo.comp"
    assert err.line == 12
    assert err.source_line == "afp y = x + 1;"
    assert str(err).startswith("shader 'foo.comp' line 12: 'x' : undeclared identifier")
    assert str(err).splitlines()[1] == "    12 | afp y = x + 1;"
    assert "undeclared identifier" in err.log


def test_error_line_without_version_and_with_crlf() -> None:
    src = "void main()\r\n{\r\n    int a = nope;\r\n}\r\n"
    with pytest.raises(ShaderCompileError) as info:
        compile_glsl(src, caps=CAPS, precision=Precision.FP32, name="crlf.comp")
    assert info.value.line == 3
    assert info.value.source_line == "int a = nope;"


def test_link_error_has_no_line() -> None:
    with pytest.raises(ShaderCompileError) as info:
        compile_glsl("#version 450\nvoid notmain() {}\n", caps=CAPS, precision=Precision.FP32, name="x.comp")
    assert info.value.line is None
    assert "x.comp" in str(info.value)


def test_unsupported_precision_refused() -> None:
    src = "#version 450\nvoid main() {}\n"
    with pytest.raises(UnsupportedPrecision, match=r"Old GPU.*fp16s.*16-bit storage"):
        compile_glsl(src, caps=FP32_ONLY, precision=Precision.FP16_STORAGE)
    with pytest.raises(UnsupportedPrecision, match=r"Mid GPU.*fp16sa.*shaderFloat16"):
        compile_glsl(src, caps=STORAGE_ONLY, precision=Precision.FP16_ARITHMETIC)
    with pytest.raises(UnsupportedPrecision):
        expand_glsl(src, caps=FP32_ONLY, precision=Precision.FP16_ARITHMETIC)
    assert isinstance(UnsupportedPrecision("x"), ValueError)
    # Packed fp16 needs no device feature.
    compile_glsl(ALL_HELPERS, caps=FP32_ONLY, precision=Precision.FP16_PACKED)
    compile_glsl(ALL_HELPERS, caps=STORAGE_ONLY, precision=Precision.FP16_STORAGE)


def test_packed_store_is_atomic() -> None:
    text = expand_glsl(ALL_HELPERS, caps=CAPS, precision=Precision.FP16_PACKED)
    st1 = next(line for line in text.splitlines() if line.startswith("#define _vks_sthalf"))
    assert "atomicAnd" in st1 and "atomicOr" in st1
    # A readonly target cannot take the atomic read-modify-write.
    src = ("#version 450\nlayout (binding = 0) readonly buffer b { sfp data[]; };\n"
           "void main() { buffer_st1(data, 0, 1.0); }\n")
    with pytest.raises(ShaderCompileError) as info:
        compile_glsl(src, caps=CAPS, precision=Precision.FP16_PACKED, name="ro.comp")
    assert info.value.line == 3


# ------------------------------------------------------------------ threads


def test_parallel_compiles() -> None:
    jobs = [(mode, i) for i in range(6) for mode in ALL_MODES]
    expected = {mode: compile_glsl(ALL_HELPERS, caps=CAPS, precision=mode) for mode in ALL_MODES}
    barrier = threading.Barrier(4)

    def work(job: tuple[Precision, int]) -> tuple[Precision, bytes]:
        mode, i = job
        if i == 0:
            barrier.wait(timeout=30)  # make the first four start together
        if i == 5:  # errors in parallel must not disturb the others
            with pytest.raises(ShaderCompileError):
                compile_glsl(BROKEN, caps=CAPS, precision=mode, name="foo.comp")
        return mode, compile_glsl(ALL_HELPERS, caps=CAPS, precision=mode, defines={"UNUSED": i})

    with ThreadPoolExecutor(max_workers=4) as pool:
        for mode, spv in pool.map(work, jobs):
            assert spv == expected[mode]


def test_compile_expanded_validate_flag() -> None:
    e = expand(ALL_HELPERS, caps=CAPS, options=Precision.FP16_PACKED)
    spv = compile_expanded(e, source=ALL_HELPERS, name="all.comp", validate=True)
    assert spirv_words(spv)[0] == SPIRV_MAGIC


# ------------------------------------------------------------------ real device caps


@pytest.fixture(scope="module")
def real_caps(vulkan_caps: DeviceCaps) -> DeviceCaps:
    """Caps read from the first Vulkan device (lavapipe in CI; its absence fails the test)."""
    return vulkan_caps


def test_real_device_caps_compile_every_supported_mode(real_caps: DeviceCaps) -> None:
    assert real_caps.supported_precisions()
    for mode in real_caps.supported_precisions():
        spv = compile_expanded(expand(ALL_HELPERS, caps=real_caps, options=mode),
                               source=ALL_HELPERS, name="all.comp", validate=True)
        assert spirv_words(spv)[0] == SPIRV_MAGIC
    # Every device macro (hundreds of them) is a valid #define with a usable value.
    text = expand_glsl("#version 450\nvoid main() {}\n", caps=real_caps, precision=Precision.FP32)
    src = (f"#version 450\nlayout (binding = 0) buffer b {{ int data[]; }};\n"
           f"void main() {{\n#if ncnn_subgroupSize == {real_caps.subgroup_size}\n"
           f"    data[0] = ncnn_subgroupSize + ncnn_vendorID;\n#else\n#error wrong subgroup size\n#endif\n}}\n")
    compile_glsl(src, caps=real_caps, precision=Precision.FP32, name="real.comp")
    assert text.count("#define ncnn_") > 20
