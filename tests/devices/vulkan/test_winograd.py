"""conv_winograd (vulkan.winograd): Winograd F(2x2, 3x3) convolutions on lavapipe against ncnn,
in every precision mode, through the layer's three passes and through whole Plans (a folded
residual sum, batches); which convolutions can take it; the VKSERVE_WINOGRAD switch."""

from __future__ import annotations

import pytest

from tests.devices.vulkan.test_vulkan_layers_compute import (  # noqa: F401 (spirv_for: the fixture)
    MODES,
    check_layer,
    conv_line,
    spirv_for,
)

WINOGRAD = {
    # id: (input shape, num_output, params)
    "pad1-relu-odd": ((3, 9, 11), 5, "4=1 5=1 9=1"),
    "valid-odd": ((4, 9, 12), 6, "4=0 5=1"),
    "pad-value-mish": ((2, 6, 5), 3, "4=2 18=0.5 5=1 9=5"),
    "large-pad-nobias": ((1, 3, 4), 2, "4=3"),
    "deep-leaky": ((40, 6, 11), 70, "4=1 5=1 9=2 -23310=1,0.1"),
    "wide-clip": ((64, 14, 14), 96, "4=1 5=1 9=3 -23310=2,-0.3,0.4"),
    "asym-pad": ((8, 7, 9), 16, "4=1 14=0 15=1 16=0 5=1 9=4"),
}


@pytest.mark.parametrize("precision", MODES, ids=lambda p: p.value)
@pytest.mark.parametrize("case", list(WINOGRAD))
def test_winograd_convolution(tmp_path, vulkan_ctx, spirv_for, monkeypatch, case, precision):
    monkeypatch.setenv("VKSERVE_WINOGRAD", "1")
    shape, out, params = WINOGRAD[case]
    check_layer(tmp_path, vulkan_ctx, spirv_for, conv_line("Convolution", shape[0], out, params),
                {"data": shape}, precision)
