"""Shared by the Vulkan engine tests: one VulkanDevice for the whole session and one-layer
graphs built from .param text.

lavapipe compiles pipelines slowly, so every test module that imports the `engine_device`
fixture gets the same device (and so the same PipelineCache, in a session temp folder): a
pipeline built by one test is a cache hit for every later one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from tests.support.params import param_text
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.cpu.kernels import REGISTRY
from vkserve.devices.reference import run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.models.graph import Graph, build_graph, load_model, parse_param_text
from vkserve.models.layers import Shape
from vkserve.models.randinit import random_weights
from vkserve.models.weights import write_bin

MODES = [Precision.FP32, Precision.FP16_STORAGE, Precision.FP16_ARITHMETIC]

_shared: list[VulkanDevice] = []


@pytest.fixture(scope="session")
def engine_device(vulkan_caps: DeviceCaps,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[VulkanDevice]:
    # Each importing module registers this fixture anew; they all share one device, and the
    # first session-end finalizer closes it.
    if not _shared:
        _shared.append(VulkanDevice(vulkan_caps, tmp_path_factory.mktemp("pipeline-cache")))
    yield _shared[0]
    while _shared:
        _shared.pop().close()


def graph_of(lines: Sequence[str], inputs: Mapping[str, Shape], seed: int = 0) -> Graph:
    """A graph of Input layers (one per entry of `inputs`) followed by `lines`, with seeded
    random weights."""
    text = param_text(inputs, lines)
    layers = parse_param_text(text, "test.param")
    for layer, weights in zip(layers, random_weights(layers, seed)):
        layer.weights = weights
    return build_graph(layers, "test.param", dict(inputs))


def cpu_forward(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The CPU engine's kernels in plain fp32 (no bf16 narrowing): the reference semantics."""
    blobs = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    for layer in graph.layers:
        if layer.type == "Input":
            continue
        kernel = REGISTRY[layer.type](layer, [blobs[b].shape for b in layer.inputs])
        ys = kernel.forward([blobs[b].copy() for b in layer.inputs])
        blobs.update(zip(layer.outputs, (np.asarray(y, np.float32) for y in ys)))
    return blobs


def storage_round(x: np.ndarray, precision: Precision) -> np.ndarray:
    """`x` as the device stores it (fp16 modes round to half)."""
    if precision is Precision.FP32:
        return x.astype(np.float32)
    return x.astype(np.float16).astype(np.float32)


def tolerance(precision: Precision) -> float:
    return 1e-4 if precision is Precision.FP32 else 2e-2


def check_against_ncnn(tmp_path: Path, device: VulkanDevice, line: str, shapes: dict[str, tuple[int, ...]],
          precision: Precision) -> None:
    """One net (Inputs of ``shapes``, then ``line`` whose output blob is ``out``) on the device
    against the ncnn package, on the same seeded weights and inputs: the output's shape, and the
    max abs error within :func:`tolerance` of the reference's max abs."""
    param, bin_path = tmp_path / "case.param", tmp_path / "case.bin"
    param.write_text(param_text(shapes, [line]))
    graph = load_model(param, None, shapes, seed=7)
    write_bin(graph.layers, bin_path)
    rng = np.random.default_rng(11)
    inputs = {n: rng.uniform(-2.0, 2.0, size=s).astype(np.float32) for n, s in shapes.items()}
    ref = run_ncnn(param, bin_path, inputs, ["out"])["out"]
    with Plan(device, graph, None, precision) as plan:
        got = plan.run(inputs)["out"]
    assert got.shape == graph.blob_shapes["out"]
    assert got.size == ref.size, (got.shape, ref.shape)
    want = ref.reshape(got.shape)
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))  # NaN fails too
    assert err <= tolerance(precision) * scale + 1e-6, (err, scale)


def run_plan(device: VulkanDevice, graph: Graph, feed: Mapping[str, np.ndarray], precision: Precision,
             outputs: Sequence[str]) -> tuple[dict[str, np.ndarray], dict, list[tuple[str, str]]]:
    """One run of a Plan for `outputs`: the outputs, the Plan's summary and its steps as
    (layer name, shader)."""
    with Plan(device, graph, None, precision, outputs=list(outputs)) as plan:
        got = plan.run(dict(feed))
        return got, plan.summary(), [(step.label.split(" ")[0], step.shader) for step in plan.steps]


def assert_near_cpu_kernels(got: Mapping[str, np.ndarray], graph: Graph, feed: Mapping[str, np.ndarray],
                            precision: Precision) -> None:
    """`got` against the CPU kernels in fp32 on the same inputs (as stored), at fp16's
    tolerance in every mode: the CPU convolutions keep bf16 weights."""
    want = cpu_forward(graph, {k: storage_round(v, precision) for k, v in feed.items()})
    for name, value in got.items():
        scale = max(float(np.abs(want[name]).max()), 1.0)
        np.testing.assert_allclose(value, want[name], rtol=2e-2, atol=2e-2 * scale, err_msg=name)
