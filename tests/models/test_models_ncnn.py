"""Random .bin files in ncnn's layout load in the `ncnn` package, and our shapes match its."""

from __future__ import annotations

from pathlib import Path

import ncnn
import numpy as np
import pytest

from tests.support.paths import MODELS_DIR
from vkserve.models.graph import load_model, read_param
from vkserve.models.weights import bin_size, write_random_bin

PARAMS = sorted(MODELS_DIR.glob("*.param"))


def _mat_shape(m: object) -> tuple[int, ...]:
    return {1: (m.w,), 2: (m.h, m.w), 3: (m.c, m.h, m.w), 4: (m.c, m.d, m.h, m.w)}[m.dims]


def _net(param: Path, binf: Path) -> object:
    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    net.opt.num_threads = 1
    net.opt.lightmode = False  # keep every intermediate blob for extraction
    for flag in ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic",
                 "use_bf16_storage", "use_int8_inference"):
        setattr(net.opt, flag, False)  # fp32 throughout, so numbers compare exactly
    assert net.load_param(str(param)) == 0
    assert net.load_model(str(binf)) == 0
    return net


@pytest.mark.parametrize("param", PARAMS, ids=lambda p: p.stem)
def test_random_bin_loads_in_ncnn_and_shapes_agree(param: Path, tmp_path: Path) -> None:
    binf = tmp_path / "model.bin"
    write_random_bin(param, binf, seed=0)
    assert binf.stat().st_size == bin_size(read_param(param))

    ours = load_model(param, binf)
    fresh = load_model(param, None, seed=0)
    for a, b in zip(ours.layers, fresh.layers):
        assert len(a.weights) == len(b.weights)
        for wa, wb in zip(a.weights, b.weights):
            np.testing.assert_array_equal(wa, wb)

    net = _net(param, binf)
    name = ours.input_names[0]
    x = np.random.default_rng(1).standard_normal(ours.blob_shapes[name]).astype(np.float32)
    ex = net.create_extractor()
    ex.input(name, ncnn.Mat(x))
    detection = {b for layer in ours.layers if layer.type == "Yolov3DetectionOutput"
                 for b in layer.outputs}
    for layer in ours.layers:  # every blob: outputs and all intermediates
        for blob in layer.outputs:
            ret, mat = ex.extract(blob)
            assert ret == 0, blob
            got = _mat_shape(mat) if mat.dims else (0, 6)
            data = np.array(mat)
            assert np.isfinite(data).all(), blob
            if blob in detection:
                assert got[1] == 6 and got[0] <= ours.blob_shapes[blob][0]
            else:
                assert got == ours.blob_shapes[blob], blob
    for blob in ours.output_names:
        if blob not in detection:
            ret, mat = ex.extract(blob)
            assert 1e-4 < float(np.abs(np.array(mat)).max()) < 1e4, blob


def test_short_bin_also_fails_in_ncnn(tmp_path: Path) -> None:
    param = MODELS_DIR / "squeezenet.param"
    binf = tmp_path / "model.bin"
    write_random_bin(param, binf, seed=3)
    binf.write_bytes(binf.read_bytes()[:-4])
    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    assert net.load_param(str(param)) == 0
    assert net.load_model(str(binf)) != 0


def test_ncnn_reads_our_weight_order(tmp_path: Path) -> None:
    """Weight then bias, tag before the flagged weight only: ncnn computes W x + b with them."""
    param = tmp_path / "fc.param"
    param.write_text(
        "7767517\n3 3\nInput in 0 1 x 0=6 1=5 2=4\n"
        "Convolution conv 1 1 x y 0=3 1=1 5=1 6=12\n"
        "InnerProduct fc 1 1 y z 0=7 1=1 2=630\n"
    )
    binf = tmp_path / "fc.bin"
    write_random_bin(param, binf, seed=5)
    graph = load_model(param, binf)
    conv_w, conv_b = graph.layers[1].weights
    fc_w, fc_b = graph.layers[2].weights
    x = np.random.default_rng(2).standard_normal((4, 5, 6)).astype(np.float32)
    y = np.einsum("oc,chw->ohw", conv_w.reshape(3, 4), x) + conv_b[:, None, None]
    z = fc_w.reshape(7, 90) @ y.reshape(-1) + fc_b
    ex = _net(param, binf).create_extractor()
    ex.input("x", ncnn.Mat(x))
    _, out = ex.extract("z")
    np.testing.assert_allclose(np.array(out), z, rtol=1e-4, atol=1e-5)
