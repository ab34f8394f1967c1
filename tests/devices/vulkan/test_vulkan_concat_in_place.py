"""Concat without copies: when each input is a contiguous run of the output, the executor has
the inputs' producers write straight into it and records nothing for the Concat; every other
Concat keeps its copies. Outputs against the CPU engine's kernels in fp32, in every mode."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.vulkan_engine import (  # noqa: F401 (engine_device: a fixture)
    MODES,
    assert_near_cpu_kernels,
    engine_device,
    graph_of,
    run_plan,
    storage_round,
)
from vkserve.devices.capabilities import Precision
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan

GRAPH = [
    # in place: three producers of their own, the last a run of 90 values (not whole vec4s:
    # allowed last), one of them read again after the Concat and one a requested output
    "Convolution conv 1 1 x a 0=8 1=3 4=1 5=1 6=576 9=1",
    "Sigmoid sig 1 1 x b",
    "Convolution conv2 1 1 x c 0=3 1=1 5=1 6=24",
    "Concat cat 3 1 a b c d 0=0",
    "ReLU relu 1 1 b e 0=0.5",
    "Convolution conv3 1 1 d f 0=4 1=1 5=1 6=76",
    # copies: a first input of 90 values (its vec4 padding would overlap the next input)
    "Convolution conv4 1 1 x g 0=3 1=1 5=1 6=24",
    "TanH tanh 1 1 x k",
    "Concat cat2 2 1 g k h 0=0",
    # copies: along rows of 8 channels (each input is 8 runs of the output, not one)
    "Clip clip 1 1 x m 0=-0.5 1=0.5",
    "Concat cat3 2 1 m k n 0=1",
    # copies: an input that is itself a Concat placed in place, and a model input
    "Concat cat4 2 1 d x o 0=0",
    # in place, then an elementwise layer reading its second input when the rest is dead: it
    # must not write over that input from the storage's start
    "Convolution conv5 1 1 x p1 0=4 1=1 5=1 6=32",
    "TanH tanh5 1 1 x p2",
    "Concat cat5 2 1 p1 p2 q 0=0",
    "Sigmoid sigq 1 1 q r",
    "ReLU relu5 1 1 p2 s 0=0.25",
]
SHAPES = {"x": (8, 6, 5)}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
def test_concat_inputs_are_written_in_place_where_they_are_runs_of_the_output(
        engine_device: VulkanDevice, precision: Precision) -> None:  # noqa: F811
    graph = graph_of(GRAPH, SHAPES, seed=5)
    feed = {"x": np.random.default_rng(9).uniform(-2, 2, SHAPES["x"]).astype(np.float32)}
    outputs = ["a", "b", "c", "d", "e", "f", "g", "h", "k", "m", "n", "o", "r", "s"]
    got, summary, steps = run_plan(engine_device, graph, feed, precision, outputs)
    copies = {name for name, shader in steps if shader == "copy_strided"}
    assert summary["zero_copy_concats"] == 2
    assert copies == {"cat2", "cat3", "cat4"}
    # every Concat's output is its inputs' bytes, in place or copied
    np.testing.assert_array_equal(got["d"], np.concatenate([got["a"], got["b"], got["c"]]))
    np.testing.assert_array_equal(got["h"], np.concatenate([got["g"], got["k"]]))
    np.testing.assert_array_equal(got["n"], np.concatenate([got["m"], got["k"]], axis=1))
    np.testing.assert_array_equal(got["o"], np.concatenate([got["d"], storage_round(feed["x"], precision)]))
    # relu5 may take over cat5's storage only where it reads p2: the same address or no overlap
    with Plan(engine_device, graph, None, precision, outputs=outputs) as plan:
        p2, s, size = plan._blob_at("p2"), plan._blob_at("s"), plan._padded_bytes(SHAPES["x"])
    assert s == p2 or s + size <= p2 or p2 + size <= s
    # and the layers around them compute what the CPU kernels do
    assert_near_cpu_kernels(got, graph, feed, precision)
