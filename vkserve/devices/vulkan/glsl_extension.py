"""The extended-GLSL dialect: the preamble injected after a shader's `#version`.

Shaders are GLSL 450 compute shaders written once with abstract types and
helpers (the scheme of `shared/seeds/glsl-extension.md`, DESIGN §4) and
expanded per device and per precision mode. This module builds the expanded
source text; `vkserve.devices.vulkan.compiler` hands it to glslang.

Layout of an expanded shader::

    <shader text up to and including its #version line>   (or "#version 450")
    #line 1 1                  preamble = source string 1 in glslang's messages
    #extension ... : require   16-bit storage / fp16 arithmetic / int16 / int64
    #define ...                option, device, type, helper and caller macros
    [layout (local_size_x_id = 233, local_size_y_id = 234, local_size_z_id = 235) in;]
    #line <n> 0                back to source string 0, at the shader's own line n
    <rest of the shader>

so glslang reports errors of the shader at the shader's own line numbers
(string 0), and errors inside the preamble as string 1.

Types per mode (`Precision`):

======== ========= ============= ============ =============
macro    FP32      FP16_PACKED   FP16_STORAGE FP16_ARITHMETIC
======== ========= ============= ============ =============
sfp      float     uint (2 half) float16_t    float16_t
sfpvec2  vec2      uint          f16vec2      f16vec2
sfpvec4  vec4      uvec2         f16vec4      f16vec4
afp      float     float         float        float16_t
afpvec2  vec2      vec2          vec2         f16vec2
afpvec4  vec4      vec4          vec4         f16vec4
lfp      float     float         float        float16_t
lfpvec4  vec4      uvec2 (4 h.)  uvec2 (4 h.) f16vec4
======== ========= ============= ============ =============

Helpers (all modes): ``buffer_ld1/2/4(buf, i)`` -> afp*, ``buffer_st1/2/4(buf, i, v)``,
``buffer_cp1/2/4(dst, i, src, si)``, ``buffer_cp1to4(dst, i, src, ivec4 si)``,
``buffer_cp4to1(dst, ivec4 i, src, si)``, ``sfp2lfp``, ``sfp2lfpvec4``, ``lfp2afp``,
``lfp2afpvec4``, ``afp2lfp``, ``afp2lfpvec4``, ``buffer_sm1/sm4(buf, i)`` (storage
element -> local type), and ``psc(x)`` = ``((x) == 0 ? p.x : (x))``.

Contracts a shader author must know:

- Store/copy helpers expand to a braced block ``{ ... }``: use them as
  statements, and put braces around if/else bodies that are a single helper.
- Indices are evaluated once in store/copy helpers; in ``buffer_ld1`` of
  FP16_PACKED the index is evaluated twice (keep it side-effect free).
- FP16_PACKED scalars: an ``sfp`` buffer element is a uint holding two halves;
  ``buffer_ld1(buf, i)`` reads half ``i`` (``buf[i/2]``, low 16 bits for even
  ``i``). ``buffer_st1``, ``buffer_cp1`` and ``buffer_cp4to1`` replace one half
  with ``atomicAnd`` + ``atomicOr`` on the containing uint, because two
  invocations may write the two halves of one uint concurrently. The target
  buffer therefore must not be declared ``readonly``; declare it plain
  ``buffer`` (glslang and spirv-val accept ``writeonly`` too, but an atomic
  also reads, so plain is the portable choice). ``sfp2lfp(v)`` on a packed
  scalar takes the *low* half; use ``buffer_sm1(buf, i)`` to stage element
  ``i`` of a scalar buffer into local memory in every mode.
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


# ---------------------------------------------------------------- macros


def option_macros(precision: Precision, caps: DeviceCaps) -> dict[str, str]:
    """NCNN_* option macros (always defined, 0 or 1)."""
    p = Precision(precision)
    return {
        "NCNN_fp16_packed": "1" if p is Precision.FP16_PACKED else "0",
        "NCNN_fp16_storage": "1" if p in (Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC) else "0",
        "NCNN_fp16_arithmetic": "1" if p is Precision.FP16_ARITHMETIC else "0",
        "NCNN_fp16_uniform": "0",
        "NCNN_bf16_packed": "0",
        "NCNN_bf16_storage": "0",
        "NCNN_int8_packed": "0",
        "NCNN_int8_storage": "0",
        "NCNN_int8_arithmetic": "0",
        "NCNN_int8_uniform": "0",
        "NCNN_int16_packed": "0",
        "NCNN_int16_storage": "0",
        "NCNN_shader_local_memory": "1" if caps.type == "discrete-gpu" else "0",
        "NCNN_moltenvk": "1" if "VK_KHR_portability_subset" in caps.extensions else "0",
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


def type_macros(precision: Precision) -> dict[str, str]:
    p = Precision(precision)
    if p is Precision.FP32:
        s = ("float", "vec2", "vec4")
        a = ("float", "vec2", "vec4")
        lo = ("float", "vec4")
    elif p is Precision.FP16_PACKED:
        s = ("uint", "uint", "uvec2")
        a = ("float", "vec2", "vec4")
        lo = ("float", "uvec2")
    elif p is Precision.FP16_STORAGE:
        s = ("float16_t", "f16vec2", "f16vec4")
        a = ("float", "vec2", "vec4")
        lo = ("float", "uvec2")
    else:
        s = ("float16_t", "f16vec2", "f16vec4")
        a = ("float16_t", "f16vec2", "f16vec4")
        lo = ("float16_t", "f16vec4")
    return {
        "sfp": s[0], "sfpvec2": s[1], "sfpvec4": s[2],
        "afp": a[0], "afpvec2": a[1], "afpvec4": a[2],
        "lfp": lo[0], "lfpvec4": lo[1],
    }


# Helper functions (values only; buffers cannot be function arguments) that
# some modes' macros call. glslang drops the ones a shader does not use.
_PACK_FUNCTIONS = """\
uvec2 _vks_pack4(vec4 v) { return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)); }
vec4 _vks_unpack4(uvec2 v) { return vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y)); }
"""


_PLAIN_COPIES = {
    "buffer_cp1(buf,i,sbuf,si)": "{buf[i] = sbuf[si];}",
    "buffer_cp2(buf,i,sbuf,si)": "{buf[i] = sbuf[si];}",
    "buffer_cp4(buf,i,sbuf,si)": "{buf[i] = sbuf[si];}",
}


def helper_macros(precision: Precision) -> dict[str, str]:
    """Function-like macros, keyed by their `name(params)` head."""
    p = Precision(precision)
    m: dict[str, str] = {"psc(x)": "((x) == 0 ? p.x : (x))"}
    if p is Precision.FP32:
        m.update({
            "buffer_ld1(buf,i)": "buf[i]",
            "buffer_ld2(buf,i)": "buf[i]",
            "buffer_ld4(buf,i)": "buf[i]",
            "buffer_st1(buf,i,v)": "{buf[i] = float(v);}",
            "buffer_st2(buf,i,v)": "{buf[i] = vec2(v);}",
            "buffer_st4(buf,i,v)": "{buf[i] = vec4(v);}",
            **_PLAIN_COPIES,
            "buffer_cp1to4(buf,i,sbuf,si4)": (
                "{ivec4 _vks_si4 = ivec4(si4); buf[i] = vec4(sbuf[_vks_si4.x], sbuf[_vks_si4.y], "
                "sbuf[_vks_si4.z], sbuf[_vks_si4.w]);}"
            ),
            "buffer_cp4to1(buf,i4,sbuf,si)": (
                "{ivec4 _vks_i4 = ivec4(i4); vec4 _vks_v = sbuf[si]; buf[_vks_i4.x] = _vks_v.x; "
                "buf[_vks_i4.y] = _vks_v.y; buf[_vks_i4.z] = _vks_v.z; buf[_vks_i4.w] = _vks_v.w;}"
            ),
            "sfp2lfp(v)": "(v)",
            "sfp2lfpvec4(v)": "(v)",
            "lfp2afp(v)": "(v)",
            "lfp2afpvec4(v)": "(v)",
            "afp2lfp(v)": "float(v)",
            "afp2lfpvec4(v)": "vec4(v)",
            "buffer_sm1(buf,i)": "buf[i]",
            "buffer_sm4(buf,i)": "buf[i]",
        })
    elif p is Precision.FP16_PACKED:
        m.update({
            # Raw 16 bits of half i in the low bits (upper bits are garbage).
            "_vks_ldhalf(buf,i)": "(buf[(i) >> 1] >> (uint((i) & 1) << 4))",
            # Replace half k of buf's uint with the low 16 bits of `bits`,
            # atomically: the other half may be written concurrently.
            "_vks_sthalf(buf,k,bits)": (
                "{uint _vks_hk = uint(k); uint _vks_hb = uint(bits) & 0xffffu; "
                "uint _vks_hs = (_vks_hk & 1u) << 4; "
                "atomicAnd(buf[_vks_hk >> 1], ~(0xffffu << _vks_hs)); "
                "atomicOr(buf[_vks_hk >> 1], _vks_hb << _vks_hs);}"
            ),
            "buffer_ld1(buf,i)": "(unpackHalf2x16(buf[(i) >> 1])[(i) & 1])",
            "buffer_ld2(buf,i)": "unpackHalf2x16(buf[i])",
            "buffer_ld4(buf,i)": "_vks_unpack4(buf[i])",
            "buffer_st1(buf,i,v)": "_vks_sthalf(buf, i, packHalf2x16(vec2(float(v), 0.0)))",
            "buffer_st2(buf,i,v)": "{buf[i] = packHalf2x16(vec2(v));}",
            "buffer_st4(buf,i,v)": "{buf[i] = _vks_pack4(vec4(v));}",
            "buffer_cp1(buf,i,sbuf,si)": "_vks_sthalf(buf, i, _vks_ldhalf(sbuf, si))",
            "buffer_cp2(buf,i,sbuf,si)": "{buf[i] = sbuf[si];}",
            "buffer_cp4(buf,i,sbuf,si)": "{buf[i] = sbuf[si];}",
            "buffer_cp1to4(buf,i,sbuf,si4)": (
                "{ivec4 _vks_si4 = ivec4(si4); "
                "buf[i] = uvec2((_vks_ldhalf(sbuf, _vks_si4.x) & 0xffffu) | (_vks_ldhalf(sbuf, _vks_si4.y) << 16), "
                "(_vks_ldhalf(sbuf, _vks_si4.z) & 0xffffu) | (_vks_ldhalf(sbuf, _vks_si4.w) << 16));}"
            ),
            "buffer_cp4to1(buf,i4,sbuf,si)": (
                "{ivec4 _vks_i4 = ivec4(i4); uvec2 _vks_p = sbuf[si]; "
                "_vks_sthalf(buf, _vks_i4.x, _vks_p.x) _vks_sthalf(buf, _vks_i4.y, _vks_p.x >> 16) "
                "_vks_sthalf(buf, _vks_i4.z, _vks_p.y) _vks_sthalf(buf, _vks_i4.w, _vks_p.y >> 16)}"
            ),
            "sfp2lfp(v)": "unpackHalf2x16(v).x",  # low half; see module docstring
            "sfp2lfpvec4(v)": "(v)",
            "lfp2afp(v)": "(v)",
            "lfp2afpvec4(v)": "_vks_unpack4(v)",
            "afp2lfp(v)": "float(v)",
            "afp2lfpvec4(v)": "_vks_pack4(vec4(v))",
            "buffer_sm1(buf,i)": "buffer_ld1(buf, i)",
            "buffer_sm4(buf,i)": "buf[i]",
        })
    elif p is Precision.FP16_STORAGE:
        # 16-bit storage without fp16 arithmetic: f16 values may only be
        # copied or converted to/from fp32, never computed with.
        m.update({
            "buffer_ld1(buf,i)": "float(buf[i])",
            "buffer_ld2(buf,i)": "vec2(buf[i])",
            "buffer_ld4(buf,i)": "vec4(buf[i])",
            "buffer_st1(buf,i,v)": "{buf[i] = float16_t(v);}",
            "buffer_st2(buf,i,v)": "{buf[i] = f16vec2(v);}",
            "buffer_st4(buf,i,v)": "{buf[i] = f16vec4(v);}",
            **_PLAIN_COPIES,
            "buffer_cp1to4(buf,i,sbuf,si4)": (
                "{int _vks_i = int(i); ivec4 _vks_si4 = ivec4(si4); "
                "buf[_vks_i].x = sbuf[_vks_si4.x]; buf[_vks_i].y = sbuf[_vks_si4.y]; "
                "buf[_vks_i].z = sbuf[_vks_si4.z]; buf[_vks_i].w = sbuf[_vks_si4.w];}"
            ),
            "buffer_cp4to1(buf,i4,sbuf,si)": (
                "{ivec4 _vks_i4 = ivec4(i4); int _vks_si = int(si); "
                "buf[_vks_i4.x] = sbuf[_vks_si].x; buf[_vks_i4.y] = sbuf[_vks_si].y; "
                "buf[_vks_i4.z] = sbuf[_vks_si].z; buf[_vks_i4.w] = sbuf[_vks_si].w;}"
            ),
            "sfp2lfp(v)": "float(v)",
            "sfp2lfpvec4(v)": "_vks_pack4(vec4(v))",
            "lfp2afp(v)": "(v)",
            "lfp2afpvec4(v)": "_vks_unpack4(v)",
            "afp2lfp(v)": "float(v)",
            "afp2lfpvec4(v)": "_vks_pack4(vec4(v))",
            "buffer_sm1(buf,i)": "float(buf[i])",
            "buffer_sm4(buf,i)": "_vks_pack4(vec4(buf[i]))",
        })
    else:
        m.update({
            "buffer_ld1(buf,i)": "buf[i]",
            "buffer_ld2(buf,i)": "buf[i]",
            "buffer_ld4(buf,i)": "buf[i]",
            "buffer_st1(buf,i,v)": "{buf[i] = float16_t(v);}",
            "buffer_st2(buf,i,v)": "{buf[i] = f16vec2(v);}",
            "buffer_st4(buf,i,v)": "{buf[i] = f16vec4(v);}",
            **_PLAIN_COPIES,
            "buffer_cp1to4(buf,i,sbuf,si4)": (
                "{ivec4 _vks_si4 = ivec4(si4); buf[i] = f16vec4(sbuf[_vks_si4.x], sbuf[_vks_si4.y], "
                "sbuf[_vks_si4.z], sbuf[_vks_si4.w]);}"
            ),
            "buffer_cp4to1(buf,i4,sbuf,si)": (
                "{ivec4 _vks_i4 = ivec4(i4); f16vec4 _vks_v = sbuf[si]; buf[_vks_i4.x] = _vks_v.x; "
                "buf[_vks_i4.y] = _vks_v.y; buf[_vks_i4.z] = _vks_v.z; buf[_vks_i4.w] = _vks_v.w;}"
            ),
            "sfp2lfp(v)": "(v)",
            "sfp2lfpvec4(v)": "(v)",
            "lfp2afp(v)": "(v)",
            "lfp2afpvec4(v)": "(v)",
            "afp2lfp(v)": "float16_t(v)",
            "afp2lfpvec4(v)": "f16vec4(v)",
            "buffer_sm1(buf,i)": "buf[i]",
            "buffer_sm4(buf,i)": "buf[i]",
        })
    return m


def required_extensions(precision: Precision, caps: DeviceCaps) -> list[str]:
    """GLSL extensions enabled automatically for this mode and device."""
    p = Precision(precision)
    exts: list[str] = []
    if caps.features.get("shaderInt64"):
        exts.append("GL_EXT_shader_explicit_arithmetic_types_int64")
    if caps.features.get("shaderInt16"):
        exts.append("GL_EXT_shader_explicit_arithmetic_types_int16")
    if p in (Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC):
        exts.append("GL_EXT_shader_16bit_storage")
    if p is Precision.FP16_ARITHMETIC:
        exts.append("GL_EXT_shader_explicit_arithmetic_types_float16")
    return exts


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
    precision: Precision,
    defines: Mapping[str, int | str] | None = None,
    local_size: bool = False,
) -> str:
    user = _user_defines(defines)
    lines = [f"#extension {e} : require" for e in required_extensions(precision, caps)]
    groups: Iterable[dict[str, str]] = (
        option_macros(precision, caps),
        device_macros(caps),
        type_macros(precision),
        helper_macros(precision),
    )
    for group in groups:
        for head, body in group.items():
            if _macro_name(head) not in user:  # the caller's value wins
                lines.append(f"#define {head} {body}")
    lines.extend(f"#define {name} {text}" for name, text in user.items())
    if Precision(precision) in (Precision.FP16_PACKED, Precision.FP16_STORAGE):
        lines.extend(_PACK_FUNCTIONS.splitlines())
    if local_size:
        lines.append(LOCAL_SIZE_LAYOUT)
    return "\n".join(lines) + "\n"


def expand(
    source: str,
    *,
    caps: DeviceCaps,
    precision: Precision,
    defines: Mapping[str, int | str] | None = None,
) -> ExpandedShader:
    """Insert the preamble after `#version`, with `#line` directives (see module docstring)."""
    inject_local_size = not declares_local_size(source)
    preamble = build_preamble(caps=caps, precision=precision, defines=defines, local_size=inject_local_size)
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
