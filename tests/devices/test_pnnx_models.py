"""pnnx exports as pnnx writes them (no Input shape, shape expressions, duplicate layer names)
verify against the ncnn package on the CPU engine (bf16) and on the Vulkan device (lavapipe in
CI) in fp32 and fp16, with seeded random weights; the shape comes with the input, as a client's
would. Small inputs (64x64) keep CI fast; the layers do not depend on the size, except in
vit_tiny, whose positional embedding (a MemoryData of 197 tokens) fixes 3x224x224, and
deeplabv3_mbv3 (verified per blob, below), whose Interp sizes fix 3x256x256."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.ahead import Ahead, run_ahead
from tests.support.paths import PNNX_DIR
from vkserve.devices.cpu.executor import Plan
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.devices.reference import NcnnConfig, VerifyReport, compare, random_inputs, run_ncnn
from vkserve.devices.vulkan.engine import load_plan
from vkserve.devices.vulkan.engine.verify import verify_vulkan
from vkserve.models.graph import Graph, load_model, read_param
from vkserve.models.weights import write_bin

SHAPE = {"in0": (3, 64, 64)}
#: Exports that need another input shape than SHAPE.
SHAPES = {"vit_tiny": {"in0": (3, 224, 224)}}
#: The exports every layer of which both engines run today (the others: see `vkserve layers`).
RUNNABLE = ["convnext_tiny", "densenet121", "vit_tiny", "googlenet", "mnasnet", "regnety_400m"]


@pytest.mark.parametrize("name", RUNNABLE)
def test_export_declares_no_input_shape(name: str) -> None:
    lines = [" ".join(line.split()) for line in (PNNX_DIR / f"{name}.param").read_text().splitlines()]
    assert "Input in0 0 1 in0" in lines, "the test model is no longer a shapeless pnnx export"
    assert read_param(PNNX_DIR / f"{name}.param")  # parses as exported; the shape comes later


@pytest.mark.parametrize("name", RUNNABLE)
def test_export_verifies_on_cpu(name: str) -> None:
    param = PNNX_DIR / f"{name}.param"
    shape = SHAPES.get(name, SHAPE)
    graph = load_model(param, None, shape)
    report = verify_cpu(graph, param, None, random_inputs(shape))
    assert report.ok, [(o.name, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]


@pytest.fixture(scope="module")
def vulkan_exports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                   vulkan_caps: object) -> Iterator[Ahead]:
    """The Vulkan verify report of (export, precision), the next case's run beside this one's
    (tests.support.ahead)."""
    cache: Path = tmp_path_factory.getbasetemp() / "pnnx-models-cache"

    def run(name: str, precision: str) -> VerifyReport:
        param = PNNX_DIR / f"{name}.param"
        shape = SHAPES.get(name, SHAPE)
        graph = load_model(param, None, shape)
        return verify_vulkan(graph, param, None, random_inputs(shape), 0, precision, cache)

    with run_ahead(request, "test_export_verifies_on_vulkan", ("name", "precision"), run) as ahead:
        yield ahead


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", RUNNABLE)
def test_export_verifies_on_vulkan(name: str, precision: str, vulkan_exports: Ahead) -> None:
    report = vulkan_exports.result(name, precision)
    assert report.ok, [(o.name, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]


DEEPLAB = PNNX_DIR / "deeplabv3_mbv3.param"
#: pnnx baked 256x256 into deeplabv3_mbv3's two Interp layers (the ASPP pooling branch back to
#: the 16x16 map of the other branches, the logits to 256x256): no other size runs.
DEEPLAB_SHAPE = {"in0": (3, 256, 256)}


def ncnn_crashing_convolutions(graph: Graph) -> list[str]:
    """Outputs of the convolutions whose dilation exceeds their input's width or height: ncnn's
    x86 Convolution in its plain fp32 layout (no packing, the reference's) segfaults on them
    (dilation 20 or 24 on a 16x16 map does, 16 does not; so does 24 on 8x8, 32x32 does not);
    in its packed layout, ncnn's default, it computes them right."""
    return [layer.outputs[0] for layer in graph.layers if layer.type == "Convolution"
            and (layer.params.dilation_w > graph.blob_shapes[layer.inputs[0]][-1]
                 or layer.params.dilation_h > graph.blob_shapes[layer.inputs[0]][-2])]


@pytest.fixture(scope="module")
def deeplab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Graph, dict[str, np.ndarray],
                                                                dict[str, np.ndarray]]:
    """deeplabv3_mbv3, its input and ncnn's fp32 result for every blob. ncnn crashes running the
    whole model (`ncnn_crashing_convolutions`: ASPP's convrelu_7 and convrelu_8, dilation 24
    and 36 on a 16x16 map; an ncnn bug, not our .bin: the same weights run in ncnn's packed
    layout), so those two blobs come from ncnn's packed layout and the reference run takes them
    as given: every blob is still ncnn's, each compared with ours."""
    graph = load_model(DEEPLAB, None, DEEPLAB_SHAPE)
    bin_path = tmp_path_factory.mktemp("deeplab") / "deeplabv3_mbv3.bin"
    write_bin(graph.layers, bin_path)
    inputs = random_inputs(DEEPLAB_SHAPE)
    crashing = ncnn_crashing_convolutions(graph)
    assert crashing == ["160", "161"], crashing
    packed = run_ncnn(DEEPLAB, bin_path, inputs, crashing, NcnnConfig("ncnn cpu fp32 packed"))
    blobs = [b for layer in graph.layers if layer.type != "Input" for b in layer.outputs]
    rest = run_ncnn(DEEPLAB, bin_path, {**inputs, **packed}, [b for b in blobs if b not in packed])
    return graph, inputs, {**rest, **packed}


def assert_every_blob_matches(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray],
                              precision: str) -> None:
    reports = [compare(name, ours[name], ref[name], precision) for name in ref]
    assert all(r.ok for r in reports), [(r.name, r.deviation, r.cosine) for r in reports if not r.ok]


def test_deeplab_verifies_per_blob_on_cpu(deeplab: tuple[Graph, dict[str, np.ndarray],
                                                         dict[str, np.ndarray]]) -> None:
    graph, inputs, ref = deeplab
    ours = Plan(graph, {n: a.shape for n, a in inputs.items()}, outputs=list(ref)).run(inputs)
    assert_every_blob_matches(ours, ref, "bf16")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_deeplab_verifies_per_blob_on_vulkan(deeplab: tuple[Graph, dict[str, np.ndarray],
                                                            dict[str, np.ndarray]],
                                             precision: str, tmp_path_factory: pytest.TempPathFactory,
                                             vulkan_caps: object) -> None:
    graph, inputs, ref = deeplab
    cache: Path = tmp_path_factory.getbasetemp() / "pnnx-models-cache"
    with load_plan(graph, 0, precision, {n: a.shape for n, a in inputs.items()}, list(ref),
                   cache) as loaded:
        ours = loaded.plan.run(inputs)
    assert_every_blob_matches(ours, ref, precision)
