"""The extended-GLSL dialect: the preamble injected after a shader's `#version`.

Shaders are GLSL 450 compute shaders written once with abstract types and
helpers (the scheme of `shared/seeds/glsl-extension.md` and `glsl-extension-old.md`,
DESIGN §4) and expanded per device and per option bits (`ShaderOptions`; a
`Precision` is a named combination of them). This module builds the expanded
source text; `vkserve.devices.vulkan.compiler` hands it to glslang.

Layout of an expanded shader::

    <shader text up to and including its #version line>   (or "#version 450")
    #line 1 1                  preamble = source string 1 in glslang's messages
    #extension ... : require   16/8-bit storage, fp16/int8/int16/int64 arithmetic, printf
    #define ...                option, device, type, helper and caller macros
    <helper functions>         pack/unpack of fp16 values (unused ones are dropped)
    [layout (local_size_x_id = 233, local_size_y_id = 234, local_size_z_id = 235) in;]
    #line <n> 0                back to source string 0, at the shader's own line n
    <rest of the shader>

so glslang reports errors of the shader at the shader's own line numbers
(string 0), and errors inside the preamble as string 1.

Types. Storage (`sfp*`) follows the storage bits (fp16 storage wins over fp16
packed), arithmetic (`afp*`) the fp16 arithmetic bit, both independently:

========= ======= ============ ============  ========= ======= ==========
storage   fp32    fp16p        fp16s         arith.    fp32    fp16a
========= ======= ============ ============  ========= ======= ==========
sfp       float   uint (2 h.)  float16_t     afp       float   float16_t
sfpvec2   vec2    uint         f16vec2       afpvec2   vec2    f16vec2
sfpvec4   vec4    uvec2        f16vec4       afpvec4   vec4    f16vec4
sfpvec8   mat2x4  uvec4        f16mat2x4 [*] afpvec8   mat2x4  f16mat2x4
========= ======= ============ ============  ========= ======= ==========

[*] ``f16vec4[2]`` when neither fp16 arithmetic nor fp16 uniform is on: 16-bit
storage alone has no 16-bit matrix type. Index it the same way (``v[i][0]``).

Local (shared memory) types, both documents' tables: the new document's columns
for fp32, fp16p/fp16s only and fp16s+fp16a, and with the fp16 uniform bit the
16-bit locals of the old document's fp16a column (`Precision.FP16_ARITHMETIC`
sets it, so the built-in modes keep the old table):

======== ======= =================== ================ =============
local    fp32    fp16p / fp16s only  fp16s+fp16a      fp16u (+any)
======== ======= =================== ================ =============
lfp      float   float               float            float16_t
lfpvec4  vec4    uvec2 (4 halves)    uint64_t [#]     f16vec4
======== ======= =================== ================ =============

[#] uvec2 on a device without shaderInt64.

Images (`NCNN_image_shader` = the image_storage bit): ``imfmt1``/``imfmt4``
(and the old spellings ``imfmtc1``/``imfmtc4``) are r32f/rgba32f with fp32
storage, r16f/rgba16f with fp16 storage; ``unfp`` is highp / mediump. An
8-wide element of an image lives in two texels, x*2 and x*2+1.

Helpers (every mode): ``buffer_ld1/2/4/8(buf, i)`` -> afp*, ``buffer_st1/2/4/8(buf, i, v)``,
``buffer_cp1/2/4/8(dst, i, src, si)``, ``buffer_cp1to4(dst, i, src, ivec4 si)``,
``buffer_cp1to8(dst, i, src, ivec4 si0, ivec4 si1)``, ``buffer_cp4to8(dst, i, src, ivec2 si)``,
``buffer_cp4to1(dst, ivec4 i, src, si)``, ``buffer_cp8to1(dst, ivec4 i0, ivec4 i1, src, si)``,
``buffer_cp8to4(dst, ivec2 i, src, si)``; ``image{1,2,3}d_ld{1,4,8}(sampler, pos)``,
``image{1,2,3}d_st{1,4,8}(image, pos, v)``, ``image{1,2,3}d_cp{1,4,8}(image, pos, sampler,
spos)``; ``sfp2lfp``, ``sfp2lfpvec4``, ``lfp2afp``, ``lfp2afpvec4``, ``afp2lfp``,
``afp2lfpvec4``, ``buffer_sm1/sm4(buf, i)`` (storage element -> local type), ``psc(x)`` =
``((x) == 0 ? p.x : (x))``, and ``NCNN_LOGE`` = ``debugPrintfEXT`` when the
validation layer is on (``ncnn_enable_validation_layer`` 1; undefined otherwise, so
guard its calls with ``#if ncnn_enable_validation_layer``).

Contracts a shader author must know:

- Store/copy helpers expand to a braced block ``{ ... }``: use them as
  statements, and put braces around if/else bodies that are a single helper.
- Indices are evaluated once in store/copy helpers; loads may evaluate the
  index more than once (keep it side-effect free).
- FP16_PACKED scalars: an ``sfp`` buffer element is a uint holding two halves;
  ``buffer_ld1(buf, i)`` reads half ``i`` (``buf[i/2]``, low 16 bits for even
  ``i``). ``buffer_st1``, ``buffer_cp1``, ``buffer_cp4to1`` and ``buffer_cp8to1``
  replace one half with ``atomicAnd`` + ``atomicOr`` on the containing uint, because
  two invocations may write the two halves of one uint concurrently. The target
  buffer therefore must not be declared ``readonly``; declare it plain
  ``buffer``. ``sfp2lfp(v)`` on a packed scalar takes the *low* half; use
  ``buffer_sm1(buf, i)`` to stage element ``i`` of a scalar buffer into local
  memory in every mode.
- Local size: when the shader declares no ``local_size_*`` layout, the
  expansion adds ``layout (local_size_x_id = 233, local_size_y_id = 234,
  local_size_z_id = 235) in;``, so the dispatcher must set the work-group size
  through specialization constants 233, 234 and 235 (x, y, z; unset ones
  default to 1).
- Device macros are plain decimal integers. Values above 2^31-1 are printed
  as is (at most 4294967295, larger ones are clamped): in code they are literal
  values, but in ``#if`` glslang evaluates them as signed 32-bit (wrapped).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.shader_options import (
    LocalKind,
    ShaderOptions,
    StorageKind,
    has_float16,
    has_int64,
    has_local_memory,
)

GLSL_EXTENSION_VERSION = 1  # value of the `ncnn_glsl_version` macro
LOCAL_SIZE_SPEC_IDS = (233, 234, 235)
LOCAL_SIZE_LAYOUT = (
    "layout (local_size_x_id = 233, local_size_y_id = 234, local_size_z_id = 235) in;"
)

# VkSubgroupFeatureFlagBits -> `ncnn_subgroup_<name>` shorthand.
SUBGROUP_BITS: dict[str, int] = {
    "basic": 0x1,
    "vote": 0x2,
    "arithmetic": 0x4,
    "ballot": 0x8,
    "shuffle": 0x10,
    "shuffle_relative": 0x20,
    "clustered": 0x40,
    "quad": 0x80,
    "partitioned": 0x100,  # VK_SUBGROUP_FEATURE_PARTITIONED_BIT_NV
    "rotate": 0x200,  # VK_SUBGROUP_FEATURE_ROTATE_BIT_KHR
    "rotate_clustered": 0x400,  # VK_SUBGROUP_FEATURE_ROTATE_CLUSTERED_BIT_KHR
}

# DeviceCaps.type -> VkPhysicalDeviceType, for `ncnn_deviceType`.
DEVICE_TYPES = {"other": 0, "integrated-gpu": 1, "discrete-gpu": 2, "virtual-gpu": 3, "cpu": 4}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_VERSION_LINE = re.compile(r"^[ \t]*#[ \t]*version\b[^\n]*(\n|\Z)", re.MULTILINE)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_LOCAL_SIZE = re.compile(r"\blocal_size_[xyz](_id)?\b")
# Extensions whose use needs Vulkan 1.1 / SPIR-V 1.3.
_SPIRV13_EXT = re.compile(
    r"^[ \t]*#[ \t]*extension[ \t]+(GL_KHR_shader_subgroup\w*|GL_EXT_shader_subgroup\w*"
    r"|GL_KHR_cooperative_matrix|GL_NV_cooperative_matrix\w*)\b",
    re.MULTILINE,
)

Options = ShaderOptions | Precision


def sanitize(name: str) -> str:
    """A macro-safe identifier: invalid characters become '_', no '__' runs (reserved in GLSL)."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    out = re.sub(r"_{2,}", "_", out)
    if not out or out[0].isdigit():
        out = "_" + out
    return out


def _int_literal(value: int) -> str:
    if value < 0:
        return f"({max(value, -(2**31))})"
    return str(min(value, 0xFFFFFFFF))


def _value_literal(value: object) -> str | None:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return _int_literal(value)
    if isinstance(value, float):
        return f"{value:e}"
    return None


def _flag(on: bool) -> str:
    return "1" if on else "0"


# ---------------------------------------------------------------- macros


def option_macros(options: Options, caps: DeviceCaps) -> dict[str, str]:
    """NCNN_* option macros (always defined, 0 or 1), one per option bit."""
    o = ShaderOptions.coerce(options)
    return {
        "NCNN_fp16_packed": _flag(o.fp16_packed),
        "NCNN_fp16_storage": _flag(o.fp16_storage),
        "NCNN_fp16_arithmetic": _flag(o.fp16_arithmetic),
        "NCNN_fp16_uniform": _flag(o.fp16_uniform),
        "NCNN_bf16_packed": "0",
        "NCNN_bf16_storage": "0",
        "NCNN_int8_packed": _flag(o.int8_packed),
        "NCNN_int8_storage": _flag(o.int8_storage),
        "NCNN_int8_arithmetic": _flag(o.int8_arithmetic),
        "NCNN_int8_uniform": "0",
        "NCNN_int16_packed": "0",
        "NCNN_int16_storage": "0",
        "NCNN_image_shader": _flag(o.image_storage),
        "NCNN_shader_local_memory": _flag(o.shader_local_memory and has_local_memory(caps)),
        "NCNN_moltenvk": _flag("VK_KHR_portability_subset" in caps.extensions),
        "ncnn_enable_validation_layer": _flag(o.debug_printf),
        "ncnn_glsl_version": str(GLSL_EXTENSION_VERSION),
    }


def device_macros(caps: DeviceCaps) -> dict[str, str]:
    """`ncnn_<extension>` = spec version, `ncnn_<feature>` = 0/1, `ncnn_<property>` = value."""
    out: dict[str, str] = {}

    def put(name: str, value: object) -> None:
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                put(f"{name}_{i}", v)
            return
        lit = _value_literal(value)
        if lit is not None:
            out["ncnn_" + sanitize(name)] = lit

    for ext, version in sorted(caps.extensions.items()):
        put(ext, int(version))
    for feat, on in sorted(caps.features.items()):
        put(feat, 1 if on else 0)
    for prop, value in sorted(caps.properties.items()):
        put(prop, value)
    # Identity from the record's own fields where the property dict lacks them.
    for name, value in (
        ("vendorID", caps.vendor_id),
        ("deviceID", caps.device_id),
        ("driverID", caps.driver_id),
        ("driverVersion", caps.driver_version),
        ("apiVersion", caps.api_version),
        ("deviceType", DEVICE_TYPES.get(caps.type, 0)),
    ):
        if "ncnn_" + name not in out:
            put(name, value)
    # Subgroup: the record's values are authoritative (discovery may have
    # replaced a bogus driver value with a vendor default).
    put("subgroupSize", caps.subgroup_size)
    put("supportedOperations", caps.subgroup_operations)
    for short, bit in SUBGROUP_BITS.items():
        put(f"subgroup_{short}", 1 if caps.subgroup_operations & bit else 0)
    put("subgroup_rotate_relative", 1 if caps.subgroup_operations & 0x400 else 0)  # ncnn's name
    return out


_STORAGE_TYPES = {
    StorageKind.FP32: ("float", "vec2", "vec4", "mat2x4"),
    StorageKind.FP16_PACKED: ("uint", "uint", "uvec2", "uvec4"),
    StorageKind.FP16: ("float16_t", "f16vec2", "f16vec4", "f16mat2x4"),
}
_ARITH_TYPES = {False: ("float", "vec2", "vec4", "mat2x4"),
                True: ("float16_t", "f16vec2", "f16vec4", "f16mat2x4")}
_LOCAL_TYPES = {LocalKind.FP32: "float", LocalKind.PACKED_UVEC2: "float",
                LocalKind.PACKED_U64: "float", LocalKind.FP16: "float16_t"}


def type_macros(options: Options, caps: DeviceCaps) -> dict[str, str]:
    """sfp*, afp*, lfp*, imfmt* and unfp for these options on this device (tables above)."""
    o = ShaderOptions.coerce(options)
    s = _STORAGE_TYPES[o.storage]
    if o.storage is StorageKind.FP16 and not _float16_types(o, caps):
        # 16-bit storage alone declares no 16-bit matrices; columns index the same way
        s = (*s[:3], "f16vec4[2]")
    a = _ARITH_TYPES[o.fp16_arithmetic]
    local = o.local(caps)
    fp32_images = o.storage is StorageKind.FP32
    return {
        "sfp": s[0], "sfpvec2": s[1], "sfpvec4": s[2], "sfpvec8": s[3],
        "afp": a[0], "afpvec2": a[1], "afpvec4": a[2], "afpvec8": a[3],
        "lfp": _LOCAL_TYPES[local], "lfpvec4": local.value,
        "imfmt1": "r32f" if fp32_images else "r16f",
        "imfmt4": "rgba32f" if fp32_images else "rgba16f",
        "imfmtc1": "r32f" if fp32_images else "r16f",
        "imfmtc4": "rgba32f" if fp32_images else "rgba16f",
        "unfp": "highp" if fp32_images else "mediump",
    }


# Pack/unpack functions (values only; buffers cannot be function arguments).
# glslang drops the ones a shader does not use; the 16-bit and 64-bit ones are
# emitted only when their extension is on.
_PACK_FUNCTIONS = """\
uvec2 _vks_pack4(vec4 v) { return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)); }
vec4 _vks_unpack4(uvec2 v) { return vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y)); }
uvec4 _vks_pack8(mat2x4 v) { return uvec4(_vks_pack4(v[0]), _vks_pack4(v[1])); }
mat2x4 _vks_unpack8(uvec4 v) { return mat2x4(_vks_unpack4(v.xy), _vks_unpack4(v.zw)); }
"""
_PACK_FUNCTIONS_F16 = """\
uvec2 _vks_pack4h(f16vec4 v) { return uvec2(packFloat2x16(v.xy), packFloat2x16(v.zw)); }
f16vec4 _vks_unpack4h(uvec2 v) { return f16vec4(unpackFloat2x16(v.x), unpackFloat2x16(v.y)); }
uvec4 _vks_pack8h(f16mat2x4 v) { return uvec4(_vks_pack4h(v[0]), _vks_pack4h(v[1])); }
f16mat2x4 _vks_unpack8h(uvec4 v) { return f16mat2x4(_vks_unpack4h(v.xy), _vks_unpack4h(v.zw)); }
"""
_PACK_FUNCTIONS_U64 = """\
uint64_t _vks_h4_to_u64(f16vec4 v) { return packUint2x32(_vks_pack4h(v)); }
f16vec4 _vks_u64_to_h4(uint64_t v) { return _vks_unpack4h(unpackUint2x32(v)); }
"""

# Conversions storage value -> arithmetic value (`_vks_s2aN(x)`) and back
# (`_vks_a2sN(v)`), N = 2, 4, 8, per (storage kind, fp16 arithmetic). Scalars
# of packed storage are halves of a uint and have helpers of their own.
_CONVERT: dict[tuple[StorageKind, bool], dict[str, str]] = {
    (StorageKind.FP32, False): {
        "s2a1": "(x)", "s2a2": "(x)", "s2a4": "(x)", "s2a8": "(x)",
        "a2s1": "float(v)", "a2s2": "vec2(v)", "a2s4": "vec4(v)", "a2s8": "mat2x4(v)",
    },
    (StorageKind.FP32, True): {
        "s2a1": "float16_t(x)", "s2a2": "f16vec2(x)", "s2a4": "f16vec4(x)",
        "s2a8": "f16mat2x4(f16vec4((x)[0]), f16vec4((x)[1]))",
        "a2s1": "float(v)", "a2s2": "vec2(v)", "a2s4": "vec4(v)",
        "a2s8": "mat2x4(vec4((v)[0]), vec4((v)[1]))",
    },
    (StorageKind.FP16, False): {
        "s2a1": "float(x)", "s2a2": "vec2(x)", "s2a4": "vec4(x)",
        "s2a8": "mat2x4(vec4((x)[0]), vec4((x)[1]))",
        "a2s1": "float16_t(v)", "a2s2": "f16vec2(v)", "a2s4": "f16vec4(v)",
    },
    (StorageKind.FP16, True): {
        "s2a1": "(x)", "s2a2": "(x)", "s2a4": "(x)", "s2a8": "(x)",
        "a2s1": "float16_t(v)", "a2s2": "f16vec2(v)", "a2s4": "f16vec4(v)", "a2s8": "(v)",
    },
    (StorageKind.FP16_PACKED, False): {
        "s2a2": "unpackHalf2x16(x)", "s2a4": "_vks_unpack4(x)", "s2a8": "_vks_unpack8(x)",
        "a2s2": "packHalf2x16(vec2(v))", "a2s4": "_vks_pack4(vec4(v))", "a2s8": "_vks_pack8(v)",
    },
    (StorageKind.FP16_PACKED, True): {
        "s2a2": "unpackFloat2x16(x)", "s2a4": "_vks_unpack4h(x)", "s2a8": "_vks_unpack8h(x)",
        "a2s2": "packFloat2x16(f16vec2(v))", "a2s4": "_vks_pack4h(f16vec4(v))",
        "a2s8": "_vks_pack8h(v)",
    },
}

# Replace half k of buf's uint with the low 16 bits of `bits`, atomically: the
# other half may be written concurrently.
_STHALF = ("{uint _vks_hk = uint(k); uint _vks_hb = uint(bits) & 0xffffu; "
           "uint _vks_hs = (_vks_hk & 1u) << 4; "
           "atomicAnd(buf[_vks_hk >> 1], ~(0xffffu << _vks_hs)); "
           "atomicOr(buf[_vks_hk >> 1], _vks_hb << _vks_hs);}")
_IDX8 = "ivec4 _vks_a = ivec4(i0); ivec4 _vks_b = ivec4(i1);"


def _packed_buffer_helpers(fp16a: bool) -> dict[str, str]:
    unpack2 = "unpackFloat2x16" if fp16a else "unpackHalf2x16"
    pair = "_vks_ldpair(sbuf, _vks_{0}.{1}, _vks_{0}.{2})"
    # index component <- packed word (low half, then high half)
    sources = [("a.x", "x"), ("a.y", "x >> 16"), ("a.z", "y"), ("a.w", "y >> 16"),
               ("b.x", "z"), ("b.y", "z >> 16"), ("b.z", "w"), ("b.w", "w >> 16")]
    halves = " ".join(f"_vks_sthalf(buf, _vks_{d}, _vks_p.{w})" for d, w in sources)
    return {
        # Raw 16 bits of half i in the low bits (upper bits are garbage).
        "_vks_ldhalf(buf,i)": "(buf[(i) >> 1] >> (uint((i) & 1) << 4))",
        "_vks_ldpair(buf,i,j)": "((_vks_ldhalf(buf, i) & 0xffffu) | (_vks_ldhalf(buf, j) << 16))",
        "_vks_sthalf(buf,k,bits)": _STHALF,
        "buffer_ld1(buf,i)": f"({unpack2}(buf[(i) >> 1])[(i) & 1])",
        "buffer_st1(buf,i,v)": "_vks_sthalf(buf, i, packHalf2x16(vec2(float(v), 0.0)))",
        "buffer_cp1(buf,i,sbuf,si)": "_vks_sthalf(buf, i, _vks_ldhalf(sbuf, si))",
        "buffer_cp1to4(buf,i,sbuf,si4)": (
            "{ivec4 _vks_a = ivec4(si4); "
            f"buf[i] = uvec2({pair.format('a', 'x', 'y')}, {pair.format('a', 'z', 'w')});}}"
        ),
        "buffer_cp1to8(buf,i,sbuf,i0,i1)": (
            f"{{{_IDX8} buf[i] = uvec4({pair.format('a', 'x', 'y')}, {pair.format('a', 'z', 'w')}, "
            f"{pair.format('b', 'x', 'y')}, {pair.format('b', 'z', 'w')});}}"
        ),
        "buffer_cp4to8(buf,i,sbuf,si2)": (
            "{ivec2 _vks_s = ivec2(si2); buf[i] = uvec4(sbuf[_vks_s.x], sbuf[_vks_s.y]);}"
        ),
        "buffer_cp4to1(buf,i4,sbuf,si)": (
            "{ivec4 _vks_a = ivec4(i4); uvec2 _vks_p = sbuf[si]; "
            "_vks_sthalf(buf, _vks_a.x, _vks_p.x) _vks_sthalf(buf, _vks_a.y, _vks_p.x >> 16) "
            "_vks_sthalf(buf, _vks_a.z, _vks_p.y) _vks_sthalf(buf, _vks_a.w, _vks_p.y >> 16)}"
        ),
        "buffer_cp8to1(buf,i0,i1,sbuf,si)": f"{{{_IDX8} uvec4 _vks_p = sbuf[si]; {halves}}}",
        "buffer_cp8to4(buf,i2,sbuf,si)": (
            "{ivec2 _vks_d = ivec2(i2); uvec4 _vks_p = sbuf[si]; "
            "buf[_vks_d.x] = _vks_p.xy; buf[_vks_d.y] = _vks_p.zw;}"
        ),
    }


def _plain_buffer_helpers(storage: StorageKind) -> dict[str, str]:
    """Scalar and repacking helpers of fp32 and float16_t storage.

    float16_t storage without fp16 arithmetic may only load, store and convert
    16-bit values, never build vectors of them: the repacking copies store
    component by component (fine for fp32 too, but a constructor is one store).
    """
    comps = [f"[{c}].{x}" for c in (0, 1) for x in "xyzw"]
    src8 = [f"_vks_a.{x}" for x in "xyzw"] + [f"_vks_b.{x}" for x in "xyzw"]
    if storage is StorageKind.FP32:
        cp1to4 = ("{ivec4 _vks_a = ivec4(si4); buf[i] = vec4(sbuf[_vks_a.x], sbuf[_vks_a.y], "
                  "sbuf[_vks_a.z], sbuf[_vks_a.w]);}")
        cp1to8 = (f"{{{_IDX8} buf[i] = mat2x4("
                  + ", ".join(f"sbuf[{s}]" for s in src8) + ");}")
    else:
        cp1to4 = ("{int _vks_i = int(i); ivec4 _vks_a = ivec4(si4); "
                  + " ".join(f"buf[_vks_i].{x} = sbuf[_vks_a.{x}];" for x in "xyzw") + "}")
        cp1to8 = (f"{{int _vks_i = int(i); {_IDX8} "
                  + " ".join(f"buf[_vks_i]{c} = sbuf[{s}];" for c, s in zip(comps, src8)) + "}")
    out = {
        "buffer_ld1(buf,i)": "_vks_s2a1(buf[i])",
        "buffer_st1(buf,i,v)": "{buf[i] = _vks_a2s1(v);}",
        "buffer_cp1(buf,i,sbuf,si)": "{buf[i] = sbuf[si];}",
        "buffer_cp1to4(buf,i,sbuf,si4)": cp1to4,
        "buffer_cp1to8(buf,i,sbuf,i0,i1)": cp1to8,
        "buffer_cp4to8(buf,i,sbuf,si2)": (
            "{int _vks_i = int(i); ivec2 _vks_s = ivec2(si2); "
            "buf[_vks_i][0] = sbuf[_vks_s.x]; buf[_vks_i][1] = sbuf[_vks_s.y];}"
        ),
        "buffer_cp4to1(buf,i4,sbuf,si)": (
            "{ivec4 _vks_a = ivec4(i4); int _vks_s = int(si); "
            + " ".join(f"buf[_vks_a.{x}] = sbuf[_vks_s].{x};" for x in "xyzw") + "}"
        ),
        "buffer_cp8to1(buf,i0,i1,sbuf,si)": (
            f"{{{_IDX8} int _vks_s = int(si); "
            + " ".join(f"buf[{d}] = sbuf[_vks_s]{c};" for c, d in zip(comps, src8)) + "}"
        ),
        "buffer_cp8to4(buf,i2,sbuf,si)": (
            "{ivec2 _vks_d = ivec2(i2); int _vks_s = int(si); "
            "buf[_vks_d.x] = sbuf[_vks_s][0]; buf[_vks_d.y] = sbuf[_vks_s][1];}"
        ),
    }
    if storage is StorageKind.FP16:  # sfpvec8 may be f16vec4[2]: copied by columns
        out["buffer_cp8(buf,i,sbuf,si)"] = (
            "{int _vks_i = int(i); int _vks_s = int(si); "
            "buf[_vks_i][0] = sbuf[_vks_s][0]; buf[_vks_i][1] = sbuf[_vks_s][1];}")
    return out


def _store8(storage: StorageKind, fp16a: bool) -> str:
    if storage is StorageKind.FP16 and not fp16a:
        # no f16mat2x4 value can be built without fp16 arithmetic: store by columns
        return ("{int _vks_i = int(i); mat2x4 _vks_v = (v); "
                "buf[_vks_i][0] = f16vec4(_vks_v[0]); buf[_vks_i][1] = f16vec4(_vks_v[1]);}")
    return "{buf[i] = _vks_a2s8(v);}"


def _local_helpers(o: ShaderOptions, local: LocalKind) -> dict[str, str]:
    s, fp16a = o.storage, o.fp16_arithmetic
    lfp16 = local is LocalKind.FP16
    if s is StorageKind.FP16_PACKED:
        unpack = "unpackFloat2x16" if lfp16 else "unpackHalf2x16"
        sfp2lfp = f"{unpack}(v).x"  # the low half; see the module docstring
        sm1 = f"({unpack}(buf[(i) >> 1])[(i) & 1])"
    else:
        sfp2lfp = "float16_t(v)" if lfp16 else "float(v)"
        sm1 = "sfp2lfp(buf[i])"
    sfp2lfpvec4 = {
        LocalKind.FP32: "(v)",
        LocalKind.PACKED_UVEC2: "(v)" if s is StorageKind.FP16_PACKED else "_vks_pack4(vec4(v))",
        LocalKind.PACKED_U64: "_vks_h4_to_u64(v)",
        LocalKind.FP16: {StorageKind.FP32: "f16vec4(v)", StorageKind.FP16: "(v)",
                         StorageKind.FP16_PACKED: "_vks_unpack4h(v)"}[s],
    }[local]
    lfp2afpvec4 = {
        LocalKind.FP32: "f16vec4(v)" if fp16a else "(v)",
        LocalKind.PACKED_UVEC2: "_vks_unpack4h(v)" if fp16a else "_vks_unpack4(v)",
        LocalKind.PACKED_U64: "_vks_u64_to_h4(v)",
        LocalKind.FP16: "(v)" if fp16a else "vec4(v)",
    }[local]
    afp2lfpvec4 = {
        LocalKind.FP32: "vec4(v)",
        LocalKind.PACKED_UVEC2: "_vks_pack4h(f16vec4(v))" if fp16a else "_vks_pack4(vec4(v))",
        LocalKind.PACKED_U64: "_vks_h4_to_u64(f16vec4(v))",
        LocalKind.FP16: "f16vec4(v)",
    }[local]
    return {
        "sfp2lfp(v)": sfp2lfp,
        "sfp2lfpvec4(v)": sfp2lfpvec4,
        "lfp2afp(v)": "afp(v)",
        "lfp2afpvec4(v)": lfp2afpvec4,
        "afp2lfp(v)": "lfp(v)",
        "afp2lfpvec4(v)": afp2lfpvec4,
        "buffer_sm1(buf,i)": sm1,
        "buffer_sm4(buf,i)": "sfp2lfpvec4(buf[i])",
    }


_IMAGE_COORD = {
    1: ("int(p)", "(int(p) * 2 + k)"),
    2: ("ivec2(p)", "ivec2(ivec2(p).x * 2 + k, ivec2(p).y)"),
    3: ("ivec3(p)", "ivec3(ivec3(p).x * 2 + k, ivec3(p).yz)"),
}


def _image_helpers(fp16a: bool) -> dict[str, str]:
    """image{1,2,3}d_{ld,st,cp}{1,4,8}: texelFetch from samplers, imageStore to images."""
    m = {
        "_vks_t2a1(x)": "float16_t((x).r)" if fp16a else "(x).r",
        "_vks_t2a4(x)": "f16vec4(x)" if fp16a else "(x)",
        "_vks_t2a8(x,y)": "f16mat2x4(f16vec4(x), f16vec4(y))" if fp16a else "mat2x4(x, y)",
    }
    for d, (coord, coord8) in _IMAGE_COORD.items():
        m[f"_vks_c{d}(p)"] = coord
        m[f"_vks_c{d}x8(p,k)"] = coord8
        fetch = f"texelFetch(tex, _vks_c{d}(p), 0)"
        fetch8 = f"texelFetch(tex, _vks_c{d}x8(p, 0), 0), texelFetch(tex, _vks_c{d}x8(p, 1), 0)"
        m[f"image{d}d_ld1(tex,p)"] = f"_vks_t2a1({fetch})"
        m[f"image{d}d_ld4(tex,p)"] = f"_vks_t2a4({fetch})"
        m[f"image{d}d_ld8(tex,p)"] = f"_vks_t2a8({fetch8})"
        m[f"image{d}d_st1(img,p,v)"] = f"{{imageStore(img, _vks_c{d}(p), vec4(float(v)));}}"
        m[f"image{d}d_st4(img,p,v)"] = f"{{imageStore(img, _vks_c{d}(p), vec4(v));}}"
        m[f"image{d}d_st8(img,p,v)"] = (
            f"{{afpvec8 _vks_v8 = (v); imageStore(img, _vks_c{d}x8(p, 0), vec4(_vks_v8[0])); "
            f"imageStore(img, _vks_c{d}x8(p, 1), vec4(_vks_v8[1]));}}")
        copy = f"{{imageStore(img, _vks_c{d}(p), texelFetch(tex, _vks_c{d}(sp), 0));}}"
        m[f"image{d}d_cp1(img,p,tex,sp)"] = copy
        m[f"image{d}d_cp4(img,p,tex,sp)"] = copy
        m[f"image{d}d_cp8(img,p,tex,sp)"] = (
            f"{{imageStore(img, _vks_c{d}x8(p, 0), texelFetch(tex, _vks_c{d}x8(sp, 0), 0)); "
            f"imageStore(img, _vks_c{d}x8(p, 1), texelFetch(tex, _vks_c{d}x8(sp, 1), 0));}}")
    return m


def helper_macros(options: Options, caps: DeviceCaps) -> dict[str, str]:
    """Function-like macros, keyed by their `name(params)` head."""
    o = ShaderOptions.coerce(options)
    s, fp16a = o.storage, o.fp16_arithmetic
    m: dict[str, str] = {"psc(x)": "((x) == 0 ? p.x : (x))"}
    for name, body in _CONVERT[(s, fp16a)].items():
        m[f"_vks_{name}({'x' if name.startswith('s2a') else 'v'})"] = body
    for n in (2, 4, 8):
        m[f"buffer_ld{n}(buf,i)"] = f"_vks_s2a{n}(buf[i])"
        m[f"buffer_cp{n}(buf,i,sbuf,si)"] = "{buf[i] = sbuf[si];}"
    m["buffer_st2(buf,i,v)"] = "{buf[i] = _vks_a2s2(v);}"
    m["buffer_st4(buf,i,v)"] = "{buf[i] = _vks_a2s4(v);}"
    m["buffer_st8(buf,i,v)"] = _store8(s, fp16a)
    if s is StorageKind.FP16_PACKED:
        m.update(_packed_buffer_helpers(fp16a))
    else:
        m.update(_plain_buffer_helpers(s))
    m.update(_local_helpers(o, o.local(caps)))
    m.update(_image_helpers(fp16a))
    if o.debug_printf:  # otherwise undefined: guard its use with ncnn_enable_validation_layer
        m["NCNN_LOGE"] = "debugPrintfEXT"
    return m


def required_extensions(options: Options, caps: DeviceCaps) -> list[str]:
    """GLSL extensions enabled automatically for these options and this device."""
    o = ShaderOptions.coerce(options)
    exts: list[str] = []
    if has_int64(caps):
        exts.append("GL_EXT_shader_explicit_arithmetic_types_int64")
    if caps.features.get("shaderInt16"):
        exts.append("GL_EXT_shader_explicit_arithmetic_types_int16")
    if o.fp16_storage:
        exts.append("GL_EXT_shader_16bit_storage")
    if _float16_types(o, caps):
        exts.append("GL_EXT_shader_explicit_arithmetic_types_float16")
    if o.int8_storage:
        exts.append("GL_EXT_shader_8bit_storage")
    if o.int8_arithmetic:
        exts.append("GL_EXT_shader_explicit_arithmetic_types_int8")
    if o.debug_printf:
        exts.append("GL_EXT_debug_printf")
    return exts


def _float16_types(o: ShaderOptions, caps: DeviceCaps) -> bool:
    """16-bit float values in registers: fp16 arithmetic or fp16 locals."""
    return (o.fp16_arithmetic or o.fp16_uniform) and has_float16(caps)


def helper_functions(options: Options, caps: DeviceCaps) -> str:
    o = ShaderOptions.coerce(options)
    text = _PACK_FUNCTIONS
    if _float16_types(o, caps):
        text += _PACK_FUNCTIONS_F16
        if has_int64(caps):
            text += _PACK_FUNCTIONS_U64
    return text


# ---------------------------------------------------------------- expansion


@dataclasses.dataclass(frozen=True)
class ExpandedShader:
    text: str
    spirv_1_3: bool  # target Vulkan 1.1 / SPIR-V 1.3 (subgroup or cooperative-matrix use)
    injected_local_size: bool
    preamble: str  # the injected lines (source string 1 in glslang's messages)


def _macro_name(head: str) -> str:
    return head.split("(", 1)[0]


def _user_defines(defines: Mapping[str, int | str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in (defines or {}).items():
        if not _IDENT.match(name):
            raise ValueError(f"invalid macro name {name!r}")
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, int):
            text = str(value)
        elif isinstance(value, str):
            if "\n" in value or "\r" in value:
                raise ValueError(f"macro {name!r}: value must be one line")
            text = value
        else:
            raise TypeError(f"macro {name!r}: value must be int or str, not {type(value).__name__}")
        out[name] = text
    return out


def strip_comments(source: str) -> str:
    return _COMMENTS.sub(" ", source)


def uses_spirv_1_3(source: str) -> bool:
    """The shader enables subgroup or cooperative-matrix extensions (need Vulkan 1.1)."""
    return _SPIRV13_EXT.search(strip_comments(source)) is not None


def declares_local_size(source: str) -> bool:
    return _LOCAL_SIZE.search(strip_comments(source)) is not None


def build_preamble(
    *,
    caps: DeviceCaps,
    options: Options,
    defines: Mapping[str, int | str] | None = None,
    local_size: bool = False,
) -> str:
    user = _user_defines(defines)
    lines = [f"#extension {e} : require" for e in required_extensions(options, caps)]
    groups: Iterable[dict[str, str]] = (
        option_macros(options, caps),
        device_macros(caps),
        type_macros(options, caps),
        helper_macros(options, caps),
    )
    for group in groups:
        for head, body in group.items():
            if _macro_name(head) not in user:  # the caller's value wins
                lines.append(f"#define {head} {body}")
    lines.extend(f"#define {name} {text}" for name, text in user.items())
    lines.extend(helper_functions(options, caps).splitlines())
    if local_size:
        lines.append(LOCAL_SIZE_LAYOUT)
    return "\n".join(lines) + "\n"


def expand(
    source: str,
    *,
    caps: DeviceCaps,
    options: Options,
    defines: Mapping[str, int | str] | None = None,
) -> ExpandedShader:
    """Insert the preamble after `#version`, with `#line` directives (see module docstring)."""
    inject_local_size = not declares_local_size(source)
    preamble = build_preamble(caps=caps, options=options, defines=defines,
                              local_size=inject_local_size)
    m = _VERSION_LINE.search(source)
    if m is None:
        head, rest, next_line = "#version 450\n", source, 1
    else:
        head, rest = source[: m.end()], source[m.end():]
        if not head.endswith("\n"):
            head += "\n"
        next_line = head.count("\n") + 1  # the shader's own number of its line after #version
    text = f"{head}#line 1 1\n{preamble}#line {next_line} 0\n{rest}"
    return ExpandedShader(
        text=text,
        spirv_1_3=uses_spirv_1_3(source),
        injected_local_size=inject_local_size,
        preamble=preamble,
    )
