"""Every type and buffer helper of the dialect (both seed documents), compiled and run on
the Vulkan device in every combination of the fp16 option bits it supports, checked
against numpy. Inputs are multiples of 1/64 in [-8, 8], so every result is exact in fp16
too: the comparisons are equalities in every mode."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from vkserve.devices.vulkan.compiler import compile_glsl, expand_glsl
from vkserve.devices.vulkan.dispatch import dispatch
from vkserve.devices.vulkan.shader_options import ShaderOptions, StorageKind

SOURCE = (Path(__file__).parent / "shaders" / "dialect_buffers.comp").read_text()
N = 32  # invocations, each owning 8 scalars
LOCAL = 8

FP16_COMBINATIONS = [
    ShaderOptions(fp16_packed=p, fp16_storage=s, fp16_arithmetic=a, fp16_uniform=u)
    for p in (False, True) for s in (False, True) for a in (False, True) for u in (False, True)
]


def ids(o: ShaderOptions) -> str:
    return o.label


def perm(mult: int, add: int) -> np.ndarray:
    return (np.arange(8) * mult + add) % 8


def expected(a1, a2, a4, a8, storage: StorageKind) -> dict[str, np.ndarray]:
    g = np.arange(N)
    nb = g ^ 1
    a1g, a2g, a4g, a8g = (x.reshape(N, 8) for x in (a1, a2, a4, a8))
    p3, p5 = perm(3, 1), perm(5, 2)
    c1to4 = a1g[:, p3]
    c1to8 = a1g[(g + 1) % N][:, p5]
    c4to1 = np.empty((N, 8), np.float32)
    c4to1[:, p3] = a4g
    c8to1 = np.empty((N, 8), np.float32)
    c8to1[:, p5] = a8g
    sfp2lfp = a1[2 * g] if storage is StorageKind.FP16_PACKED else a1[g]
    want = {
        "r1": a1 * 2 + 1, "r2": a2 * 2 + 1, "r4": a4 * 2 + 1, "r8": a8 * 2 + 1,
        "c1": a1g[:, ::-1], "c2": a2.reshape(N, 4, 2)[:, ::-1], "c4": a4.reshape(N, 2, 4)[:, ::-1],
        "c8": a8g[::-1], "c1to4": c1to4, "c1to8": c1to8,
        "c4to8": a4.reshape(N, 2, 4)[:, ::-1], "c4to1": c4to1, "c8to1": c8to1,
        "c8to4": a8.reshape(N, 2, 4)[:, ::-1],
        "l1": a1g[nb] * 2, "l4": a4g[nb] * 2, "m1": a1g[nb] * -2, "m4": a4g[nb] * -2,
        "s1": sfp2lfp,
    }
    return {k: np.asarray(v, np.float32).reshape(-1) for k, v in want.items()}


OUTPUTS = ["r1", "r2", "r4", "r8", "c1", "c2", "c4", "c8", "c1to4", "c1to8", "c4to8", "c4to1",
           "c8to1", "c8to4", "l1", "l4", "m1", "m4", "s1"]


@pytest.mark.parametrize("options", FP16_COMBINATIONS, ids=ids)
def test_every_buffer_type_and_helper_matches_numpy(vulkan_caps, vulkan_ctx, options):
    problems = options.problems(vulkan_caps)
    if problems:
        pytest.fail(f"lavapipe is expected to support {options.label}: {problems}")
    spirv = compile_glsl(SOURCE, caps=vulkan_caps, precision=options, name="dialect_buffers.comp")
    dt = np.float32 if options.storage is StorageKind.FP32 else np.float16
    rng = np.random.default_rng(7)
    inputs = [(rng.integers(-512, 513, N * 8) / 64).astype(dt) for _ in range(4)]
    outputs = [np.zeros(N * 8, dt) for _ in OUTPUTS]
    result = dispatch(vulkan_ctx, spirv, inputs + outputs, global_size=N, local_size=LOCAL,
                      push_constants=np.array([N], np.int32), spec_constants=[N])
    got = dict(zip(OUTPUTS, result[4:]))
    want = expected(*(x.astype(np.float32) for x in inputs), options.storage)
    for name in OUTPUTS:
        g = got[name].astype(np.float32)
        w = want[name]
        if name == "s1":
            g = g[:N]
        assert np.array_equal(g, w), (name, np.flatnonzero(g != w)[:8], g[g != w][:8], w[g != w][:8])


def test_local_types_follow_both_tables(vulkan_caps):
    """The new document's fp16s+fp16a column (uint64_t) and the old one's fp16a (f16vec4)."""
    def locals_of(o: ShaderOptions) -> tuple[str, str]:
        text = expand_glsl("#version 450\nvoid main() {}\n", caps=vulkan_caps, precision=o)
        lfp = next(x for x in text.splitlines() if x.startswith("#define lfp "))
        lfp4 = next(x for x in text.splitlines() if x.startswith("#define lfpvec4 "))
        return lfp.split()[2], lfp4.split()[2]

    assert locals_of(ShaderOptions()) == ("float", "vec4")
    assert locals_of(ShaderOptions(fp16_packed=True)) == ("float", "uvec2")
    assert locals_of(ShaderOptions(fp16_storage=True)) == ("float", "uvec2")
    assert locals_of(ShaderOptions(fp16_storage=True, fp16_arithmetic=True)) == ("float", "uint64_t")
    assert locals_of(ShaderOptions(fp16_storage=True, fp16_uniform=True)) == ("float16_t", "f16vec4")
    assert locals_of(ShaderOptions.for_precision("fp16sa")) == ("float16_t", "f16vec4")


def test_option_macros_follow_each_bit(vulkan_caps):
    names = {"fp16_packed": "NCNN_fp16_packed", "fp16_storage": "NCNN_fp16_storage",
             "fp16_arithmetic": "NCNN_fp16_arithmetic", "fp16_uniform": "NCNN_fp16_uniform",
             "int8_packed": "NCNN_int8_packed", "int8_storage": "NCNN_int8_storage",
             "int8_arithmetic": "NCNN_int8_arithmetic", "image_storage": "NCNN_image_shader"}
    for field, macro in names.items():
        for on in (False, True):
            text = expand_glsl("#version 450\nvoid main() {}\n", caps=vulkan_caps,
                               precision=ShaderOptions(**{field: on}))
            assert f"#define {macro} {int(on)}\n" in text
            others = [m for f, m in names.items() if f != field]
            assert all(f"#define {m} 0\n" in text for m in others)


def test_every_option_combination_compiles(vulkan_caps, monkeypatch):
    """All 2^8 combinations of the fp16, int8 and image bits are valid on lavapipe; each
    compiles this shader (and the image one) and passes spirv-val."""
    monkeypatch.setenv("VKSERVE_VALIDATE_SPIRV", "1")
    images = (Path(__file__).parent / "shaders" / "dialect_images.comp").read_text()
    bits = ["fp16_packed", "fp16_storage", "fp16_arithmetic", "fp16_uniform", "int8_packed",
            "int8_storage", "int8_arithmetic", "image_storage"]
    combinations = [ShaderOptions(**{b: bool(i >> k & 1) for k, b in enumerate(bits)})
                    for i in range(1 << len(bits))]
    assert len({o.bits for o in combinations}) == 256
    for options in combinations:
        assert ShaderOptions.from_bits(options.bits) == options
        compile_glsl(SOURCE, caps=vulkan_caps, precision=options, name="dialect_buffers.comp")
        if options.image_storage:
            compile_glsl(images, caps=vulkan_caps, precision=options, defines={"DIM": 3},
                         name="dialect_images.comp")


def test_shader_local_memory_follows_option_and_device_property(vulkan_caps):
    def macro(caps, options):
        text = expand_glsl("#version 450\nvoid main() {}\n", caps=caps, precision=options)
        return next(x for x in text.splitlines()
                    if x.startswith("#define NCNN_shader_local_memory ")).split()[2]

    assert vulkan_caps.properties["maxComputeSharedMemorySize"] > 0
    assert vulkan_caps.type == "cpu"  # lavapipe: the device type says nothing about it
    assert macro(vulkan_caps, ShaderOptions()) == "1"
    assert macro(vulkan_caps, ShaderOptions(shader_local_memory=False)) == "0"
    no_shared = dataclasses.replace(
        vulkan_caps, properties={**vulkan_caps.properties, "maxComputeSharedMemorySize": 0})
    assert macro(no_shared, ShaderOptions()) == "0"
