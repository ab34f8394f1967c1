"""Shared by the Vulkan engine tests: one VulkanDevice for the whole session and one-layer
graphs built from .param text.

lavapipe compiles pipelines slowly, so every test module that imports the `engine_device`
fixture gets the same device (and so the same PipelineCache, in a session temp folder): a
pipeline built by one test is a cache hit for every later one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pytest

from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.cpu.kernels import REGISTRY
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.models.graph import Graph, build_graph, parse_param_text
from vkserve.models.layers import Shape
from vkserve.models.randinit import random_weights

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
    body = [f"Input {name} 0 1 {name}" for name in inputs] + list(lines)
    blobs: set[str] = set()
    for text in body:
        tok = text.split()
        nin, nout = int(tok[2]), int(tok[3])
        blobs.update(tok[4: 4 + nin + nout])
    text = "7767517\n" + f"{len(body)} {len(blobs)}\n" + "\n".join(body) + "\n"
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
