"""Every model in tests/data/models (the 12 architectures of ncnn's benchmark set) passes
`verify` on the Vulkan device (lavapipe in CI), in
fp32 (cosine >= 0.9999, max abs error <= 0.5 % of the reference's max abs) and fp16 (0.999,
2 %), against the ncnn package on the CPU in fp32 with the same seeded random weights.

New .param files dropped into that folder are picked up. Inputs keep the declared sizes.
vgg16 runs in fp16 alone: its layers are the fp32 kernels resnet18, alexnet and yolov4-tiny
already check, and at 15.5 GMAC a lavapipe run takes ~47 s of CI's 30 minutes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ahead import Ahead, run_ahead
from tests.support.paths import MODELS_DIR
from vkserve.devices.reference import TOLERANCE, VerifyReport, random_inputs
from vkserve.devices.vulkan.engine.verify import verify_vulkan
from vkserve.models.graph import load_model

PARAMS = sorted(MODELS_DIR.glob("*.param"))


def test_models_present() -> None:
    assert PARAMS, f"no .param files in {MODELS_DIR}"


#: (model, precision) pairs left out (see the module's docstring)
LEFT_OUT = {("vgg16", "fp32")}
CASES = [(p, precision) for p in PARAMS for precision in ("fp32", "fp16")
         if (p.stem, precision) not in LEFT_OUT]


@pytest.fixture(scope="module")
def vulkan_reports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ahead]:
    """The Vulkan verify report of (model, precision), the next case's run beside this one's
    (tests.support.ahead)."""
    cache = tmp_path_factory.getbasetemp() / "vulkan-models-cache"

    def run(param: Path, precision: str) -> VerifyReport:
        graph = load_model(param, None)
        inputs = random_inputs({n: graph.blob_shapes[n] for n in graph.input_names})
        return verify_vulkan(graph, param, None, inputs, 0, precision, cache)

    with run_ahead(request, "test_model_verifies_on_vulkan", ("param", "precision"), run) as ahead:
        yield ahead


@pytest.mark.parametrize(("param", "precision"), CASES, ids=[f"{p.stem}-{prec}" for p, prec in CASES])
def test_model_verifies_on_vulkan(param: Path, precision: str, vulkan_reports: Ahead) -> None:
    report = vulkan_reports.result(param, precision)
    cosine_min, rel_max = TOLERANCE[precision]
    assert (cosine_min, rel_max) == {"fp32": (0.9999, 0.005), "fp16": (0.999, 0.02)}[precision]
    details = [(o.name, o.max_abs_err, o.ref_max_abs, o.cosine, o.detections)
               for o in report.outputs]
    assert report.ok, details
