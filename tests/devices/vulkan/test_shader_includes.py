"""Built-in shaders share code through ``#include "x.h"`` (shader_registry): the headers'
text is expanded into the source that glslang compiles and the pipeline cache keys, each
header once, with #line directives keeping the shader's own line numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

import vkserve.devices.vulkan.shader_registry as registry
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.compiler import compile_glsl


@pytest.fixture
def shader_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(registry, "SHADER_DIR", tmp_path)
    registry.builtin_shader.cache_clear()
    yield tmp_path
    registry.builtin_shader.cache_clear()


def test_headers_expand_once_with_line_directives(shader_dir: Path) -> None:
    (shader_dir / "twice.h").write_text("float twice(float v) { return 2.0 * v; }\n")
    (shader_dir / "more.h").write_text('#include "twice.h"\nfloat four(float v) { return twice(twice(v)); }\n')
    (shader_dir / "s.comp").write_text('#version 450\n#include "more.h"\n#include "twice.h"\nvoid main() {}\n')
    text = registry.builtin_shader("s").source
    assert text.count("float twice(") == 1 and text.count("float four(") == 1
    assert "#include" not in text
    assert "#line 2 2\nfloat four(" in text  # back in more.h after twice.h, at its line 2
    # after more.h: back at line 3, which (twice.h again) is an empty line, then line 4
    assert text.splitlines()[-3:] == ["#line 3 0", "", "void main() {}"]


def test_a_missing_header_names_the_shader_and_line(shader_dir: Path) -> None:
    (shader_dir / "s.comp").write_text('#version 450\n\n#include "nope.h"\nvoid main() {}\n')
    with pytest.raises(KeyError, match=r"s.comp line 3: no shader header 'nope.h'"):
        registry.builtin_shader("s")


def test_an_error_after_an_include_is_reported_at_the_shaders_own_line(shader_dir: Path, vulkan_caps) -> None:
    (shader_dir / "h.h").write_text("float one() { return 1.0; }\nfloat two() { return 2.0; }\n")
    (shader_dir / "bad.comp").write_text('#version 450\n#include "h.h"\nlayout (local_size_x = 1) in;\n'
                                         "void main() { undefined_name = 1; }\n")
    with pytest.raises(Exception, match=r"line 4: 'undefined_name'.*\n    4 \| void main\(\)"):
        compile_glsl(registry.builtin_shader("bad").source, caps=vulkan_caps, precision=Precision.FP32,
                     name="bad.comp")


def test_every_builtin_shader_that_includes_compiles(vulkan_caps) -> None:
    using = [sid for sid in registry.builtin_shader_ids()
             if "#include" in (registry.SHADER_DIR / f"{sid}.comp").read_text()
             and registry.buildable(sid, vulkan_caps, Precision.FP32)]
    assert {"activation", "conv", "conv_gemm", "convdw", "gemm"} <= set(using)
    for sid in using:
        compile_glsl(registry.builtin_shader(sid).source, caps=vulkan_caps, precision=Precision.FP32,
                     name=f"{sid}.comp")
