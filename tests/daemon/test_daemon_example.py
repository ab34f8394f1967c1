"""The examples/digits model: real weights, ncnn layer types vkserve supports, samples whose
classes the ncnn package and vkserve's CPU engine both reproduce."""

from __future__ import annotations

import json

import numpy as np

from tests.support.daemon import DIGITS
from vkserve.devices.cpu.executor import Plan
from vkserve.models.graph import load_model

SUPPORTED = {"Input", "Convolution", "ReLU", "Pooling", "InnerProduct", "Softmax"}


def expected() -> dict[str, dict]:
    return json.loads((DIGITS / "samples" / "expected.json").read_text())


def test_model_uses_supported_layers_and_real_weights() -> None:
    graph = load_model(DIGITS / "model.param", DIGITS / "model.bin")
    assert {layer.type for layer in graph.layers} <= SUPPORTED
    assert graph.input_names == ["data"] and graph.blob_shapes["data"] == (1, 8, 8)
    assert graph.output_names == ["prob"] and graph.blob_shapes["prob"] == (10,)
    training = json.loads((DIGITS / "training.json").read_text())
    assert training["test_accuracy"] >= 0.95
    assert f"{training['test_accuracy'] * 100:.1f} %" in (DIGITS / "README.md").read_text()


def test_samples_match_ncnn_and_the_cpu_engine() -> None:
    import ncnn  # the reference, a test extra

    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    net.opt.num_threads = 1
    assert net.load_param(str(DIGITS / "model.param")) == 0
    assert net.load_model(str(DIGITS / "model.bin")) == 0
    plan = Plan(load_model(DIGITS / "model.param", DIGITS / "model.bin"))
    for k, info in expected().items():
        x = np.load(DIGITS / "samples" / f"{k}.npy")
        assert x.shape == (1, 8, 8) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 16
        ex = net.create_extractor()
        ex.input("data", ncnn.Mat(x))
        ret, out = ex.extract("prob")
        assert ret == 0
        ref = np.array(out, dtype=np.float32).reshape(-1)
        del ex
        ours = plan.run({"data": x})["prob"]
        assert int(ref.argmax()) == int(ours.argmax()) == info["class"] == info["label"] == int(k)
        np.testing.assert_allclose(ref, info["prob"], atol=1e-4)  # ncnn fp32 = the numpy model
        np.testing.assert_allclose(ours, ref, atol=2e-2)  # bf16 storage
    net.clear()
