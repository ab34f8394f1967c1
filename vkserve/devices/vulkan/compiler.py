"""Extended GLSL -> SPIR-V, in-process through glslang's C API (DESIGN §4).

    spirv = compile_glsl(source, caps=caps, precision=Precision.FP16_STORAGE,
                         defines={"KERNEL": 3}, name="relu.comp")
    spirv = compile_glsl(source, caps=caps,
                         precision=ShaderOptions(fp16_packed=True, fp16_arithmetic=True))

- `precision` is a `Precision` mode or any `ShaderOptions` combination of option bits.

- The shader is expanded by `vkserve.devices.vulkan.glsl_extension` (types, helpers,
  option/device macros after `#version`; see that module for the dialect).
- Work-group size contract: a shader that declares no `local_size_*` layout
  gets ``layout (local_size_x_id = 233, local_size_y_id = 234,
  local_size_z_id = 235) in;`` -- the dispatcher sets the local size through
  specialization constants 233, 234, 235.
- Target: Vulkan 1.1 / SPIR-V 1.3 when the shader enables a
  GL_KHR_shader_subgroup* (or GL_EXT_shader_subgroup*, cooperative-matrix)
  extension, else Vulkan 1.0 / SPIR-V 1.0. No SPIR-V optimisation (drivers
  optimise anyway); set VKSERVE_VALIDATE_SPIRV=1 to run spirv-val on the output.
- Errors: `UnsupportedPrecision` before any work if the device lacks the mode or an
  option bit's feature;
  `ShaderCompileError` with the shader's own line number and source line.
- Thread-safe: each call creates and deletes its own glslang objects; cffi
  releases the GIL, so compiles in several threads run in parallel.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from vkserve.devices.capabilities import DeviceCaps, DeviceKind, Precision
from vkserve.devices.vulkan import glslang_api as g
from vkserve.devices.vulkan.glsl_extension import ExpandedShader, expand
from vkserve.devices.vulkan.shader_options import ShaderOptions

SPIRV_MAGIC = 0x07230203

_ERROR_LINE = re.compile(r"^ERROR: (\d+):(\d+): (.*?)\s*$", re.MULTILINE)
_ANY_ERROR = re.compile(r"^ERROR: (.*?)\s*$", re.MULTILINE)


class ShaderCompileError(Exception):
    """glslang rejected a shader.

    `line` is 1-based in the shader's own source (None when the error is not
    in it: link errors, errors inside the generated preamble, SPIR-V
    validation), `source_line` that line's text (stripped), `log` the full
    glslang log.
    """

    def __init__(self, message: str, *, shader_name: str, line: int | None,
                 source_line: str | None, log: str) -> None:
        super().__init__(message)
        self.shader_name = shader_name
        self.line = line
        self.source_line = source_line
        self.log = log


class UnsupportedPrecision(ValueError):
    """The device cannot run the requested precision mode or option bits."""


def _missing_feature(caps: DeviceCaps, precision: Precision) -> str:
    if caps.kind is DeviceKind.CPU:
        return "it is a CPU device (no Vulkan), only fp32 exists there"
    if not caps.fp16_storage:
        return "it lacks 16-bit storage (storageBuffer16BitAccess, VK_KHR_16bit_storage)"
    if precision is Precision.FP16_ARITHMETIC and not caps.fp16_arithmetic:
        return "it lacks fp16 arithmetic (shaderFloat16, VK_KHR_shader_float16_int8)"
    return "the mode is not among its supported precisions"


def check_precision(caps: DeviceCaps, precision: Precision) -> Precision:
    """Return `precision` as a Precision, or raise UnsupportedPrecision naming device and feature."""
    p = Precision(precision)
    supported = caps.supported_precisions()
    if p not in supported:
        raise UnsupportedPrecision(
            f"device {caps.index} {caps.name!r} does not support precision {p.value}: "
            f"{_missing_feature(caps, p)} (supported: {', '.join(x.value for x in supported)})"
        )
    return p


def check_options(caps: DeviceCaps, options: ShaderOptions | Precision) -> ShaderOptions:
    """The options as ShaderOptions, or UnsupportedPrecision naming device and missing features."""
    if not isinstance(options, ShaderOptions):
        options = ShaderOptions.for_precision(check_precision(caps, options))
    problems = options.problems(caps)
    if problems:
        raise UnsupportedPrecision(
            f"device {caps.index} {caps.name!r} does not support shader options "
            f"{options.label}: {'; '.join(problems)}")
    return options


def expand_glsl(source: str, *, caps: DeviceCaps, precision: ShaderOptions | Precision,
                defines: Mapping[str, int | str] | None = None) -> str:
    """The expanded source glslang would compile (for debugging and tests)."""
    options = check_options(caps, precision)
    return expand(source, caps=caps, options=options, defines=defines).text


_LINE_DIRECTIVE = re.compile(r"\s*#\s*line\s+(\d+)(?:\s+(\d+))?\s*$")


def _source_line(source: str, string_no: int, line: int) -> str | None:
    """The text glslang calls line `line` of source string `string_no`, following the
    ``#line`` directives in `source` (built-in shaders' expanded headers: string 2)."""
    at_string, at_line = 0, 1
    for text in source.splitlines():
        m = _LINE_DIRECTIVE.match(text)
        if m is not None:
            at_line = int(m.group(1))
            at_string = int(m.group(2)) if m.group(2) is not None else at_string
            continue
        if (at_string, at_line) == (string_no, line):
            return text.strip()
        at_line += 1
    return None


def _error_from_log(log: str, source: str, name: str, expanded: ExpandedShader) -> ShaderCompileError:
    m = _ERROR_LINE.search(log)
    if m is not None:
        string_no, line, msg = int(m.group(1)), int(m.group(2)), m.group(3)
        if string_no != 1:  # the shader (0) or a header it includes (2)
            text = _source_line(source, string_no, line)
            where = f"line {line}" if string_no == 0 else f"included header line {line}"
            message = f"shader {name!r} {where}: {msg}"
            if text is not None:
                message += f"\n    {line} | {text}"
            return ShaderCompileError(message, shader_name=name, line=line if string_no == 0 else None,
                                      source_line=text, log=log)
        plines = expanded.preamble.splitlines()
        text = plines[line - 1].strip() if 1 <= line <= len(plines) else None
        message = f"shader {name!r}, generated preamble line {line}: {msg}"
        if text is not None:
            message += f"\n    preamble {line} | {text}"
        return ShaderCompileError(message, shader_name=name, line=None, source_line=None, log=log)
    m = _ANY_ERROR.search(log)
    msg = m.group(1) if m is not None else (log.strip() or "unknown glslang error")
    return ShaderCompileError(f"shader {name!r}: {msg}", shader_name=name, line=None,
                              source_line=None, log=log)


def _validate_requested() -> bool:
    return os.environ.get("VKSERVE_VALIDATE_SPIRV", "") not in ("", "0")


def compile_expanded(expanded: ExpandedShader, *, source: str, name: str = "<shader>",
                     validate: bool | None = None) -> bytes:
    """Compile an already expanded shader (`source` is the original, for error messages)."""
    api = g.api()
    lib, ffi = api.glslang, g.ffi
    if validate is None:
        validate = _validate_requested()
    messages = g.MSG_SPV_RULES | g.MSG_VULKAN_RULES

    code = ffi.new("char[]", expanded.text.encode("utf-8"))
    inp = ffi.new("glslang_input_t*")
    inp.language = g.SOURCE_GLSL
    inp.stage = g.STAGE_COMPUTE
    inp.client = g.CLIENT_VULKAN
    inp.client_version = g.TARGET_VULKAN_1_1 if expanded.spirv_1_3 else g.TARGET_VULKAN_1_0
    inp.target_language = g.TARGET_SPV
    inp.target_language_version = g.TARGET_SPV_1_3 if expanded.spirv_1_3 else g.TARGET_SPV_1_0
    inp.code = code
    inp.default_version = 100  # Vulkan GLSL dialect version; the shader's #version rules
    inp.default_profile = g.NO_PROFILE
    inp.force_default_version_and_profile = 0
    inp.forward_compatible = 0
    inp.messages = messages
    inp.resource = api.resource_limits.glslang_default_resource()

    # glslang keeps pointers into `inp` and `code`: both stay alive (locals)
    # until the objects are deleted in the finally blocks.
    shader = lib.glslang_shader_create(inp)
    if shader == ffi.NULL:
        raise MemoryError("glslang_shader_create failed")
    try:
        if not lib.glslang_shader_preprocess(shader, inp) or not lib.glslang_shader_parse(shader, inp):
            log = g.c_string(lib.glslang_shader_get_info_log(shader))
            raise _error_from_log(log, source, name, expanded)
        program = lib.glslang_program_create()
        try:
            lib.glslang_program_add_shader(program, shader)
            if not lib.glslang_program_link(program, messages):
                log = g.c_string(lib.glslang_program_get_info_log(program))
                raise _error_from_log(log, source, name, expanded)
            opts = ffi.new("glslang_spv_options_t*")
            opts.disable_optimizer = True
            opts.validate = bool(validate)
            api.spirv.glslang_program_SPIRV_generate_with_options(program, g.STAGE_COMPUTE, opts)
            spv_messages = g.c_string(api.spirv.glslang_program_SPIRV_get_messages(program))
            if validate and "error" in spv_messages.lower():
                raise ShaderCompileError(f"shader {name!r}: SPIR-V validation failed: {spv_messages.strip()}",
                                         shader_name=name, line=None, source_line=None, log=spv_messages)
            n = api.spirv.glslang_program_SPIRV_get_size(program)
            words = ffi.new("unsigned int[]", n)
            api.spirv.glslang_program_SPIRV_get(program, words)
            spirv = bytes(ffi.buffer(words, n * 4))
            magic = words[0] if n else 0
        finally:
            lib.glslang_program_delete(program)
    finally:
        lib.glslang_shader_delete(shader)
    if magic != SPIRV_MAGIC:
        raise ShaderCompileError(f"shader {name!r}: glslang produced no SPIR-V", shader_name=name,
                                 line=None, source_line=None, log=spv_messages)
    return spirv


def compile_glsl(source: str, *, caps: DeviceCaps, precision: ShaderOptions | Precision,
                 defines: Mapping[str, int | str] | None = None, name: str = "<shader>") -> bytes:
    """Compile an extended-GLSL compute shader for `caps` in `precision` (a mode or option
    bits); SPIR-V words as bytes."""
    options = check_options(caps, precision)
    expanded = expand(source, caps=caps, options=options, defines=defines)
    return compile_expanded(expanded, source=source, name=name)
