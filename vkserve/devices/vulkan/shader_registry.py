"""Built-in shaders: the `.comp` files under devices/vulkan/shaders/, id = file stem.

A built-in shader may share code with others through ``#include "name.h"`` lines naming a
header beside it (each header once per shader; headers may include headers). The text is
expanded here, so a shader's source (and its pipeline-cache key) is what glslang compiles;
``#line`` directives keep glslang's messages at the shader's own line numbers (string 0) and
put an included header's lines in string 2.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from vkserve.cache.pipeline_cache import ShaderSource
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.coopmat import fp16_coopmat

SHADER_DIR = Path(__file__).parent / "shaders"


_INCLUDE = re.compile(r'\s*#\s*include\s+"([\w.-]+)"\s*$')


@functools.cache
def builtin_shader(shader_id: str) -> ShaderSource:
    path = SHADER_DIR / f"{shader_id}.comp"
    if not path.is_file():
        raise KeyError(f"no built-in shader {shader_id!r} ({path} does not exist)")
    return ShaderSource(shader_id, _expand(path, set(), 0))


def _expand(path: Path, seen: set[str], string: int) -> str:
    """`path`'s text with its ``#include "x.h"`` lines replaced by those headers' (each once);
    `string`: glslang's source-string number for `path`'s own lines (0, headers 2)."""
    out: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = _INCLUDE.match(line)
        if match is None:
            out.append(line)
            continue
        header = SHADER_DIR / match.group(1)
        if not header.is_file():
            raise KeyError(f"{path.name} line {number}: no shader header {match.group(1)!r} "
                           f"({header} does not exist)")
        if header.name in seen:
            out.append("")  # included already: an empty line keeps the numbering
            continue
        seen.add(header.name)
        out += ["#line 1 2", _expand(header, seen, 2).rstrip("\n"), f"#line {number + 1} {string}"]
    return "\n".join(out) + "\n"


def builtin_shader_ids() -> list[str]:
    return sorted(p.stem for p in SHADER_DIR.glob("*.comp"))


# Shaders that need more than every Vulkan device has; the others build everywhere.
_NEEDS = {"conv_coopmat": fp16_coopmat, "gemm_coopmat": fp16_coopmat}


def buildable(shader_id: str, caps: DeviceCaps, precision: Precision) -> bool:
    """Whether the built-in shader can be built for this device in this mode (`vkserve cache
    warm` builds exactly these)."""
    need = _NEEDS.get(shader_id)
    return need is None or need(caps, precision)
