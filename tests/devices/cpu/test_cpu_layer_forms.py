"""Every form of the shape / resampling layers and of the fused activations on the CPU engine
(bf16 storage) against the ncnn package: Interp (nearest / bilinear / bicubic, align_corner,
sizes from scales, params, a reference blob or a size expression; 1-D..3-D), Crop (offsets,
reference, starts / ends / axes arrays and expressions; 1-D..4-D), Softmax on every axis,
Permute (every order_type of 2-D..4-D), Padding (constant / replicate / reflect incl.
front / behind and per-channel data; 1-D..4-D), Pooling (max / avg, pad modes, pad counting,
global, adaptive; 1-D..3-D), Flatten, and activation_type 0..6 fused into every layer that
takes one. The cases are ``tests/support/layer_forms.py``'s; the forms ncnn refuses or
leaves undefined are load errors here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support import cpu_engine
from tests.support.layer_forms import ALL, Case, case_id
from tests.support.params import param_text
from vkserve.models.errors import ModelFormatError
from vkserve.models.graph import load_model

CASES = [case for cases in ALL.values() for case in cases]


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_form_matches_ncnn(tmp_path: Path, case: Case) -> None:
    line, shapes = case
    cpu_engine.check_against_ncnn(tmp_path, line, shapes, np.random.default_rng(5))


@pytest.mark.parametrize("line,shape,message", [
    # ncnn refuses an old Softmax param (fixbug0 = 0) with an axis other than 0
    ("Softmax op 1 1 data out 0=1", (4, 5, 6), "1=1"),
    ("Interp op 1 1 data out 0=2 9=\"*(0w\"", (3, 4, 5), "param 9"),
    ("Interp op 1 1 data out 0=2 9=\"0w,0h,0c\"", (3, 4, 5), "param 9"),
    ("Interp op 1 1 data out 0=2 1=2.0 2=2.0", (2, 3, 4, 5), "1-D or 2-D or 3-D"),
    ("Crop op 1 1 data out 19=\"1\"", (4, 5, 6), "params 19 / 20"),
    ("Crop op 1 1 data out 19=\"1\" 20=\"foo(0w)\"", (4, 5, 6), "param 20"),
    # ncnn pools only the first depth slice of a 4-D blob
    ("Pooling op 1 1 data out 0=0 1=2 2=2", (2, 3, 4, 5), "1-D or 2-D or 3-D"),
    # ncnn would read past the per-channel pad data
    ("Padding op 1 1 data out 0=1 4=0 6=4 7=1", (4, 5, 6), "per_channel_pad_data_size"),
])
def test_refused_forms(tmp_path: Path, line: str, shape: tuple[int, ...], message: str) -> None:
    param = tmp_path / "bad.param"
    param.write_text(param_text({"data": shape}, [line]))
    with pytest.raises(ModelFormatError, match=message.replace("(", r"\(")):
        load_model(param, None, {"data": shape})
