"""One shader written with the GLSL extension, run on the Vulkan device in every mode it
supports and compared with numpy: exact in fp32, within fp16 rounding otherwise."""

from pathlib import Path

import numpy as np
import pytest

from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.compiler import compile_glsl
from vkserve.devices.vulkan.dispatch import dispatch

SOURCE = (Path(__file__).parent / "shaders" / "extension_probe.comp").read_text()
N = 37  # vec4 elements: not a multiple of the local size
SCALE = 0.75


def storage_dtype(precision: Precision):
    return np.float32 if precision is Precision.FP32 else np.float16


def expected(a: np.ndarray, c: np.ndarray, subgroup_size: int):
    """Results, the same with a*s+b fused, and the magnitude of the intermediate each one is rounded from in fp16
    arithmetic (a rounding of the intermediate costs an ulp of it, not of the result)."""
    a4 = a.reshape(N, 4).astype(np.float32)
    c32 = c.astype(np.float32)
    want = {
        "b": a4 * SCALE + np.array([1, 2, 3, 4], np.float32),
        "d": c32.reshape(N, 4)[:, ::-1],
        "e": a4[:, ::-1].reshape(-1),
        "f": c32 * 2 + subgroup_size,
    }
    intermediate = {"b": np.abs(a4 * SCALE), "d": 0, "e": 0, "f": np.abs(c32 * 2)}
    # fma rounds once: the float64 product of two floats is exact, then one rounding
    fused = {"b": (a4.astype(np.float64) * SCALE + np.array([1, 2, 3, 4])).astype(np.float32)}
    return want, intermediate, fused


@pytest.mark.parametrize("psc_from", ["spec", "push"])
@pytest.mark.parametrize("precision", list(Precision))
def test_extension_probe_matches_numpy(vulkan_caps, vulkan_ctx, precision, psc_from):
    if precision not in vulkan_caps.supported_precisions():
        pytest.fail(f"lavapipe is expected to support {precision.value}")
    spirv = compile_glsl(SOURCE, caps=vulkan_caps, precision=precision,
                         name="extension_probe.comp")
    dt = storage_dtype(precision)
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(N * 4) * 8).astype(dt)
    c = (rng.standard_normal(N * 4) * 8).astype(dt)
    zeros = lambda count: np.zeros(count, dt)  # noqa: E731
    spec = [N, SCALE] if psc_from == "spec" else [0, 0.0]
    push = np.array([N, 0], np.int32)
    push[1] = np.float32(SCALE).view(np.int32)
    _, b, _, d, e, f = dispatch(
        vulkan_ctx, spirv, [a, zeros(N * 4), c, zeros(N * 4), zeros(N * 4), zeros(N * 4)],
        global_size=N * 4, local_size=16, push_constants=push, spec_constants=spec)
    want, intermediate, want_fused = expected(a, c, vulkan_caps.subgroup_size)
    got = {"b": b.reshape(N, 4), "d": d.reshape(N, 4), "e": e, "f": f}
    for key in want:
        g = got[key].astype(np.float32)
        if precision is Precision.FP32:
            # exact, with or without the driver contracting a*s+b into one fma
            # (NVIDIA does, lavapipe does not; GLSL allows both)
            fused = want_fused.get(key, want[key])
            exact = (g == want[key]) | (g == fused)
            assert np.all(exact), (key, g[~exact], want[key][~exact])
        else:
            # one fp16 rounding of the stored result, plus, with fp16 arithmetic, one of
            # the intermediate product
            scale = np.abs(want[key])
            if precision is Precision.FP16_ARITHMETIC:
                scale = scale + intermediate[key]
            tol = scale * 2.0**-10 + 2.0**-14
            assert np.all(np.abs(g - want[key]) <= tol), (key, np.max(np.abs(g - want[key])))
    # copies are exact in every mode: no value goes through a lossy conversion
    np.testing.assert_array_equal(got["d"], c.reshape(N, 4)[:, ::-1])
    np.testing.assert_array_equal(got["e"], a.reshape(N, 4)[:, ::-1].reshape(-1))
