"""A .bin's weights stay in the file until used: read per index, never held, checked against
the file the model was loaded from; and so a CPU Plan's build holds one layer's fp32 values at
a time, not the model's."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tests.support.params import big_fc_model
from vkserve.devices.cpu.executor import Plan
from vkserve.models.binfile import StoredWeights
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model
from vkserve.models.weights import write_random_bin

NET = """7767517
3 3
Input            data   0 1 data 0=6 1=5 2=2
Convolution      conv1  1 1 data c1 0=4 1=3 4=1 5=1 6=72 9=1
InnerProduct     fc     1 1 c1 out 0=3 1=1 2=360
"""


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, Path]:
    param = tmp_path / "net.param"
    param.write_text(NET)
    write_random_bin(param, tmp_path / "net.bin", seed=5)
    return param, tmp_path / "net.bin"


def test_weights_are_read_from_the_file_each_time_and_equal_what_was_written(model, tmp_path):
    param, binf = model
    stored = load_model(param, binf)
    given = load_model(param, None, seed=5)  # the same numbers, generated in memory
    conv = stored.layers[1]
    assert isinstance(conv.weights, StoredWeights) and len(conv.weights) == 2
    assert conv.weight_elements() == 72 + 4 == given.layers[1].weight_elements()
    first, again = conv.weights[0], conv.weights[0]
    assert first is not again and first.flags.owndata and first.flags.writeable  # nothing kept
    for a, b in zip(stored.layers, given.layers):
        assert len(a.weights) == len(b.weights)
        for x, y in zip(a.weights, b.weights):
            np.testing.assert_array_equal(x, y)
    assert [w.size for w in stored.layers[2].weights[0:2]] == [360, 3]


def test_a_bin_rewritten_or_replaced_since_the_load_is_an_error_naming_it(model, tmp_path):
    param, binf = model
    graph = load_model(param, binf)
    data = bytearray(binf.read_bytes())
    data[4:8] = np.float32(123.0).tobytes()  # past conv1's storage tag: same size, other numbers
    binf.write_bytes(bytes(data))
    st = binf.stat()
    os.utime(binf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a coarse clock: a new time
    with pytest.raises(ModelFormatError) as info:
        graph.layers[1].weights[0]
    err = info.value
    assert (err.file, err.layer, err.line) == ("net.bin", "conv1", 4)
    assert "net.bin changed since the model was loaded" in err.message and "weight_data" in err.message

    graph = load_model(param, binf)
    assert graph.layers[1].weights[0][0] == np.float32(123.0)
    write_random_bin(param, binf, seed=9)  # written beside it and renamed over it: another inode
    with pytest.raises(ModelFormatError, match="changed since the model was loaded"):
        graph.layers[2].weights[1]
    binf.unlink()
    with pytest.raises(ModelFormatError, match="cannot read net.bin"):
        graph.layers[2].weights[1]


def test_a_cpu_plan_build_holds_one_layers_fp32_weights_at_a_time(tmp_path):
    """Three 16 MiB fp32 weights: read whole, the build's peak held all 48 MiB beside the
    packed bf16 panels; stored, it holds the panels (24 MiB) and one layer's fp32 values."""
    param, binf = big_fc_model(tmp_path, seed=1)
    tracemalloc.start()  # numpy's arrays are traced: the load's and the build's
    try:
        graph = load_model(param, binf)
        plan = Plan(graph)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    fp32 = sum(layer.weight_elements() for layer in graph.layers) * 4
    packed = plan.weight_bytes
    assert fp32 > 48 * 2**20 and packed == fp32 // 2
    assert peak < packed + fp32 // 3 + 8 * 2**20, (peak, packed, fp32)
    x = np.random.default_rng(0).uniform(-1, 1, 2048).astype(np.float32)
    assert plan.run({"data": x})["out"].shape == (2048,)
