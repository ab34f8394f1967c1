"""pnnx exports as pnnx writes them (no Input shape, shape expressions, duplicate layer names)
verify against the ncnn package on the CPU engine (bf16) and on the Vulkan device (lavapipe in
CI) in fp32 and fp16, with seeded random weights; the shape comes with the input, as a client's
would. Small inputs (64x64) keep CI fast; the layers do not depend on the size."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import PNNX_DIR
from vkserve.devices.cpu.verify import verify_cpu
from vkserve.devices.reference import random_inputs
from vkserve.devices.vulkan.engine.verify import verify_vulkan
from vkserve.models.graph import load_model, read_param

SHAPE = {"in0": (3, 64, 64)}
#: The exports every layer of which both engines run today (the others: see `vkserve layers`).
RUNNABLE = ["convnext_tiny", "densenet121"]


@pytest.mark.parametrize("name", RUNNABLE)
def test_export_declares_no_input_shape(name: str) -> None:
    lines = [" ".join(line.split()) for line in (PNNX_DIR / f"{name}.param").read_text().splitlines()]
    assert "Input in0 0 1 in0" in lines, "the test model is no longer a shapeless pnnx export"
    assert read_param(PNNX_DIR / f"{name}.param")  # parses as exported; the shape comes later


@pytest.mark.parametrize("name", RUNNABLE)
def test_export_verifies_on_cpu(name: str) -> None:
    param = PNNX_DIR / f"{name}.param"
    graph = load_model(param, None, SHAPE)
    report = verify_cpu(graph, param, None, random_inputs(SHAPE))
    assert report.ok, [(o.name, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", RUNNABLE)
def test_export_verifies_on_vulkan(name: str, precision: str, tmp_path_factory: pytest.TempPathFactory,
                                   vulkan_caps: object) -> None:
    param = PNNX_DIR / f"{name}.param"
    graph = load_model(param, None, SHAPE)
    cache: Path = tmp_path_factory.getbasetemp() / "pnnx-models-cache"
    report = verify_vulkan(graph, param, None, random_inputs(SHAPE), 0, precision, cache)
    assert report.ok, [(o.name, o.max_abs_err, o.ref_max_abs, o.cosine) for o in report.outputs]
