"""Built-in shaders: the `.comp` files under devices/vulkan/shaders/, id = file stem."""

from __future__ import annotations

import functools
from pathlib import Path

from vkserve.cache.pipeline_cache import ShaderSource
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.coopmat import fp16_coopmat

SHADER_DIR = Path(__file__).parent / "shaders"


@functools.cache
def builtin_shader(shader_id: str) -> ShaderSource:
    path = SHADER_DIR / f"{shader_id}.comp"
    if not path.is_file():
        raise KeyError(f"no built-in shader {shader_id!r} ({path} does not exist)")
    return ShaderSource(shader_id, path.read_text())


def builtin_shader_ids() -> list[str]:
    return sorted(p.stem for p in SHADER_DIR.glob("*.comp"))


# Shaders that need more than every Vulkan device has; the others build everywhere.
_NEEDS = {"conv_coopmat": fp16_coopmat, "gemm_coopmat": fp16_coopmat}


def buildable(shader_id: str, caps: DeviceCaps, precision: Precision) -> bool:
    """Whether the built-in shader can be built for this device in this mode (`vkserve cache
    warm` builds exactly these)."""
    need = _NEEDS.get(shader_id)
    return need is None or need(caps, precision)
