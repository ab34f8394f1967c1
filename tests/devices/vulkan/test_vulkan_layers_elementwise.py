"""The engine's own layer shaders (activations, Dropout, BinaryOp, Eltwise, Concat, Slice,
Permute, ShuffleChannel, the aliases) through a Vulkan Plan, against the CPU engine's kernels
run in plain fp32.

Shapes are awkward on purpose: element counts not divisible by 4 (vec4 shaders pad blobs) or by
the local size 64, channels 1..7, 1-D to 4-D. fp32 must match within float rounding; in the
fp16 modes the reference is computed from the fp16-rounded inputs and must match within fp16
rounding of the result (copies must be exact). All plans share one device and pipeline cache.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.support.vulkan_engine import MODES, cpu_forward, engine_device, graph_of, storage_round
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.layers import Shape

__all__ = ["engine_device"]  # the fixture, imported for pytest

SHAPES: list[Shape] = [(7,), (3, 5), (1, 1, 1), (5, 3, 7), (2, 13, 11), (3, 2, 3, 5)]


def check(device: VulkanDevice, lines: list[str], inputs: dict[str, np.ndarray],
          precision: Precision, exact: bool = False, rtol: float = 1e-5) -> Plan:
    """Run the graph through a Plan and compare every graph output with the CPU kernels."""
    graph = graph_of(lines, {k: v.shape for k, v in inputs.items()})
    rounded = {k: storage_round(v, precision) for k, v in inputs.items()}
    want = cpu_forward(graph, rounded)
    with Plan(device, graph, None, precision) as plan:
        got = plan.run(inputs)
    for name in graph.output_names:
        ref = want[name]
        assert got[name].shape == ref.shape, name
        if exact or precision is Precision.FP32:
            scale = float(np.abs(ref).max(initial=0.0))
            atol = 0.0 if exact else max(scale, 1.0) * 1e-6
            np.testing.assert_allclose(got[name], ref, rtol=0 if exact else rtol, atol=atol,
                                       err_msg=name)
        else:
            scale = max(float(np.abs(ref).max(initial=0.0)), 1.0)
            np.testing.assert_allclose(got[name], ref, rtol=1e-2, atol=4e-3 * scale, err_msg=name)
    return plan


def rand(shape: Shape, seed: int, lo: float = -3.0, hi: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


UNARY = [
    "ReLU op 1 1 x y",
    "ReLU op 1 1 x y 0=0.1",
    "Clip op 1 1 x y 0=-0.5 1=0.7",
    "Sigmoid op 1 1 x y",
    "Swish op 1 1 x y",
    "HardSigmoid op 1 1 x y 0=0.2 1=0.5",
    "HardSwish op 1 1 x y 0=0.1666667 1=0.5",
    "Dropout op 1 1 x y 0=0.7",
]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("line", UNARY, ids=lambda s: s.split()[0] + s[len("ReLU op 1 1 x y"):])
def test_unary(engine_device: VulkanDevice, line: str, precision: Precision) -> None:
    for i, shape in enumerate(SHAPES):
        check(engine_device, [line], {"x": rand(shape, i)}, precision)


def test_clip_with_default_bounds_is_the_identity_in_fp16(engine_device: VulkanDevice) -> None:
    """ncnn's default bounds are +-FLT_MAX, which become +-inf in fp16 arithmetic."""
    check(engine_device, ["Clip op 1 1 x y"], {"x": rand((3, 5), 0)}, Precision.FP16_ARITHMETIC)


BINARY_OPS = range(12)
POW_OPS = {6, 9}


def binary_inputs(shape_a: Shape, shape_b: Shape, op: int, seed: int) -> dict[str, np.ndarray]:
    """Magnitudes in [0.5, 2] (no division by ~0); positive bases for the pow ops."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in (("a", shape_a), ("b", shape_b)):
        v = rng.uniform(0.5, 2.0, shape)
        if op not in POW_OPS:
            v *= rng.choice([-1.0, 1.0], shape)
        out[name] = v.astype(np.float32)
    return out


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("op", BINARY_OPS)
def test_binaryop_every_op(engine_device: VulkanDevice, op: int, precision: Precision) -> None:
    # same shape (vec4 path), broadcast (strided path) and scalar forms
    for shape_a, shape_b in (((5, 3, 7), (5, 3, 7)), ((5, 3, 7), (5,))):
        check(engine_device, [f"BinaryOp op 2 1 a b y 0={op}"],
              binary_inputs(shape_a, shape_b, op, op), precision, rtol=1e-5)
    x = binary_inputs((2, 13, 11), (1,), op, op)["a"]
    check(engine_device, [f"BinaryOp op 1 1 a y 0={op} 1=1 2=1.25"], {"a": x}, precision)


BROADCASTS = [
    ((5, 3, 7), (7,)),        # 1-D along w
    ((5,), (5, 3, 7)),        # 1-D along c, as the first operand
    ((5, 3), (5, 3, 7)),      # 2-D lines up as (c, h)
    ((5, 1, 7), (5, 3, 1)),   # both broadcast
    ((1,), (5, 3, 7)),        # a single element
    ((6, 7), (7,)),           # 2-D with 1-D along w
    ((6, 7), (6,)),           # 2-D with 1-D along h
    ((3, 2, 3, 5), (3,)),     # 4-D per channel
    ((3, 2, 3, 5), (3, 2, 3)),  # 4-D with 3-D
]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_binaryop_broadcasting(engine_device: VulkanDevice, shapes: tuple[Shape, Shape],
                               precision: Precision) -> None:
    for op in (1, 8):  # sub and rdiv: asymmetric, so swapped operands would show
        check(engine_device, [f"BinaryOp op 2 1 a b y 0={op}"],
              binary_inputs(*shapes, op, 7), precision)


ELTWISE = [
    ("Eltwise op 2 1 a b y 0=0", 2),
    ("Eltwise op 2 1 a b y 0=1", 2),
    ("Eltwise op 3 1 a b c y 0=1 -23301=3,0.5,-2.0,1.5", 3),
    ("Eltwise op 3 1 a b c y 0=0", 3),
    ("Eltwise op 3 1 a b c y 0=2", 3),
    ("Eltwise op 1 1 a y 0=1 -23301=1,-0.5", 1),
    ("Eltwise op 1 1 a y 0=2", 1),
]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", ELTWISE, ids=lambda c: c[0][len("Eltwise op 2 1 "):])
def test_eltwise(engine_device: VulkanDevice, case: tuple[str, int], precision: Precision) -> None:
    line, n = case
    for i, shape in enumerate(((7,), (5, 3, 7), (3, 2, 3, 5))):
        inputs = {name: rand(shape, 10 * i + k) for k, name in enumerate("abc"[:n])}
        check(engine_device, [line], inputs, precision)


def test_eltwise_of_one_blob_twice(engine_device: VulkanDevice) -> None:
    """The output must not take over an input that a later dispatch still reads."""
    lines = ["Split sp 1 3 x x1 x2 x3",
             "Eltwise op 3 1 x1 x2 x3 y 0=1 -23301=3,1.0,0.5,-2.0"]
    check(engine_device, lines, {"x": rand((5, 3, 7), 1)}, Precision.FP32)


COPIES = [
    ("Concat op 2 1 a b y 0=0", {"a": (3, 2, 5), "b": (4, 2, 5)}),
    ("Concat op 2 1 a b y 0=1", {"a": (3, 2, 5), "b": (3, 7, 5)}),
    ("Concat op 3 1 a b c y 0=-1", {"a": (3, 2, 1), "b": (3, 2, 6), "c": (3, 2, 3)}),
    ("Concat op 2 1 a b y 0=0", {"a": (5,), "b": (3,)}),
    ("Concat op 2 1 a b y 0=1", {"a": (2, 3), "b": (2, 5)}),
    ("Concat op 2 1 a b y 0=1", {"a": (2, 3, 3, 5), "b": (2, 1, 3, 5)}),
    ("Slice op 1 3 a y0 y1 y2 -23300=3,1,2,-233 1=0", {"a": (7, 3, 5)}),
    ("Slice op 1 2 a y0 y1 -23300=2,-233,-233 1=2", {"a": (3, 2, 7)}),
    ("Slice op 1 2 a y0 y1 -23302=1,2 1=-2", {"a": (3, 5, 6)}),
    ("Slice op 1 2 a y0 y1 -23300=2,3,-233 1=0", {"a": (7,)}),
    ("Slice op 1 2 a y0 y1 -23300=2,1,-233 1=1", {"a": (2, 3, 3, 5)}),
    ("ShuffleChannel op 1 1 a y 0=2", {"a": (6, 3, 5)}),
    ("ShuffleChannel op 1 1 a y 0=3", {"a": (6, 1, 7)}),
    ("ShuffleChannel op 1 1 a y 0=2 1=1", {"a": (6, 3, 5)}),
    ("ShuffleChannel op 1 1 a y 0=1", {"a": (5, 2, 3)}),
] + [(f"Permute op 1 1 a y 0={k}", {"a": (3, 5, 7)}) for k in range(6)] + [
    ("Permute op 1 1 a y 0=1", {"a": (5, 7)}),
    ("Permute op 1 1 a y 0=0", {"a": (5, 7)}),
]


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", COPIES, ids=lambda c: f"{c[0].split()[0]}{c[0][c[0].rfind(' y') + 2:]}"
                         f"{list(c[1].values())}")
def test_copies_are_exact(engine_device: VulkanDevice, case: tuple[str, dict[str, Shape]],
                          precision: Precision) -> None:
    line, shapes = case
    inputs = {name: rand(shape, k) for k, (name, shape) in enumerate(shapes.items())}
    check(engine_device, [line], inputs, precision, exact=True)


def test_permute_4d_against_numpy(engine_device: VulkanDevice) -> None:
    """The CPU engine has no 4-D Permute; models.layers' numpy axes are the reference."""
    from vkserve.models.layers import PermuteParams

    x = rand((2, 3, 5, 7), 3)
    for order in (1, 5, 13, 23):
        graph = graph_of([f"Permute op 1 1 a y 0={order}"], {"a": x.shape})
        with Plan(engine_device, graph, None, Precision.FP32) as plan:
            got = plan.run({"a": x})["y"]
        np.testing.assert_array_equal(got, np.transpose(x, PermuteParams(order_type=order).numpy_axes(4)))


def test_more_elements_than_one_row_of_work_groups(engine_device: VulkanDevice) -> None:
    """65535 groups of 64 along x are all Vulkan guarantees: larger copies go along y too."""
    x = rand((2, 1500, 1500), 6)  # 4.5 M elements > 65535 * 64
    graph = graph_of(["Permute op 1 1 a y 0=1"], {"a": x.shape})
    with Plan(engine_device, graph, None, Precision.FP32) as plan:
        assert plan.steps[0].groups[1] == 2
        got = plan.run({"a": x})["y"]
    np.testing.assert_array_equal(got, x.transpose(0, 2, 1))


@pytest.mark.parametrize("line", [
    "Split op 1 2 x y z", "Reshape op 1 1 x y 0=15 1=-1", "Flatten op 1 1 x y",
    "Noop op 1 1 x y", "Dropout op 1 1 x y"])
def test_aliases_cost_nothing(engine_device: VulkanDevice, line: str) -> None:
    x = rand((2, 3, 5), 4)
    plan = check(engine_device, [line], {"x": x}, Precision.FP32, exact=True)
    assert plan.summary()["dispatches"] == 0
    # only the input blob occupies the arena (whole vec4s, aligned)
    assert plan.arena_bytes == plan.naive_bytes == math.ceil(x.size / 4) * 16


def test_elementwise_layers_run_in_place(engine_device: VulkanDevice) -> None:
    """A chain of activations needs one blob of arena: each output takes over its input."""
    lines = ["ReLU r 1 1 x a", "Sigmoid s 1 1 a b", "BinaryOp m 1 1 b c 0=2 1=1 2=3.0",
             "HardSwish h 1 1 c y"]
    x = rand((5, 3, 7), 5)
    plan = check(engine_device, lines, {"x": x}, Precision.FP32)
    blob = math.ceil(x.size / 4) * 16
    assert plan.arena_bytes == blob and plan.naive_bytes == 5 * blob
