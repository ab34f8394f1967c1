"""The shipped `shapes` example (vkserve/examples/shapes): its folder scans as the daemon scans
it, and on the CPU engine and on lavapipe its sample pictures, preprocessed as its config.toml
says, give ncnn's probabilities and the right class."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.vulkan_engine import engine_device  # noqa: F401 (fixture)
from vkserve.devices.capabilities import Precision
from vkserve.devices.cpu.executor import Plan as CpuPlan
from vkserve.devices.reference import compare, run_ncnn
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan as VulkanPlan
from vkserve.models.graph import Graph, load_model
from vkserve.processing.postprocess import top_k
from vkserve.processing.preprocess import prepare_image
from vkserve.scheduler.registry import ModelSpec, read_model_folder

SHAPES = Path(__file__).resolve().parents[2] / "vkserve" / "examples" / "shapes"
LABELS = ["circle", "square", "triangle", "star", "cross"]
SHAPE = (3, 32, 32)


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return read_model_folder(SHAPES)


@pytest.fixture(scope="module")
def graph(spec: ModelSpec) -> Graph:
    return load_model(spec.param_path, spec.bin_path, {"in0": SHAPE})


@pytest.fixture(scope="module")
def samples(spec: ModelSpec) -> dict[str, np.ndarray]:
    """label -> the sample picture as the model's input tensor (the folder's [preprocess])."""
    assert spec.preprocess is not None
    tensors = {}
    for label in LABELS:
        with Image.open(SHAPES / "samples" / f"{label}.png") as image:
            pixels = np.asarray(image.convert("RGB"))
        tensors[label], _ = prepare_image(spec.preprocess, pixels)
    return tensors


@pytest.fixture(scope="module")
def reference(spec: ModelSpec, samples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """label -> ncnn's fp32 probabilities."""
    assert spec.bin_path is not None
    return {label: run_ncnn(spec.param_path, spec.bin_path, {"in0": x}, ["out0"])["out0"].reshape(-1)
            for label, x in samples.items()}


def test_folder_scans_with_its_pre_and_postprocessing(spec: ModelSpec) -> None:
    assert spec.error is None
    assert spec.bin_path == SHAPES / "model.bin"
    assert spec.inputs["in0"].shapes == (SHAPE,) and spec.outputs == {"out0": (5,)}
    assert spec.preprocess is not None and spec.preprocess.size == (32, 32)
    assert spec.preprocess.mean == (127.5,) * 3
    assert spec.postprocess is not None and spec.postprocess.labels == tuple(LABELS)
    assert (SHAPES / "labels.txt").read_text().split() == LABELS


def test_samples_are_pictures_the_model_takes(samples: dict[str, np.ndarray]) -> None:
    for x in samples.values():
        assert x.shape == SHAPE and x.dtype == np.float32
        assert -1.0 <= x.min() < 0 < x.max() <= 1.0  # (pixel - 127.5) / 127.5 of a real picture


def test_ncnn_classifies_every_sample(reference: dict[str, np.ndarray]) -> None:
    for label, prob in reference.items():
        assert LABELS[int(prob.argmax())] == label, (label, prob)


def test_cpu_engine_matches_ncnn_and_names_the_shape(spec: ModelSpec, graph: Graph,
                                                     samples: dict[str, np.ndarray],
                                                     reference: dict[str, np.ndarray]) -> None:
    assert spec.postprocess is not None
    plan = CpuPlan(graph, {"in0": SHAPE})
    for label, x in samples.items():
        prob = np.asarray(plan.run({"in0": x})["out0"]).reshape(-1)
        report = compare("out0", prob, reference[label], "bf16")
        assert report.ok, (label, report)
        best = top_k(spec.postprocess, prob, "shapes").classes[0]
        assert best.label == label and best.score > 0.5, (label, prob)


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16_STORAGE])
def test_lavapipe_matches_ncnn_and_names_the_shape(engine_device: VulkanDevice,  # noqa: F811
                                                   precision: Precision, graph: Graph,
                                                   samples: dict[str, np.ndarray],
                                                   reference: dict[str, np.ndarray]) -> None:
    tolerance = "fp32" if precision is Precision.FP32 else "fp16"
    with VulkanPlan(engine_device, graph, None, precision) as plan:
        for label, x in samples.items():
            prob = np.asarray(plan.run({"in0": x})["out0"]).reshape(-1)
            report = compare("out0", prob, reference[label], tolerance)
            assert report.ok, (label, precision, report)
            assert LABELS[int(prob.argmax())] == label, (label, prob)
