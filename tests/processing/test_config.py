"""The [preprocess] / [postprocess] tables as the model repository reads them: defaults from
the model's input shape, labels from the folder, and errors naming the file, table and key
(the folder is then unusable, the scan goes on)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.paths import DIGITS
from vkserve.client.meaning import MeaningKind
from vkserve.processing.config import PixelFormat, Postprocess, Preprocess
from vkserve.scheduler.registry import ModelRepository

INPUTS = '[inputs]\ndata = [1, 8, 8]\n'


def folder(tmp_path: Path, config: str, labels: str | None = "\n".join("abcdefghij")) -> Path:
    model = tmp_path / "repo" / "net"
    model.mkdir(parents=True)
    for f in ("model.param", "model.bin"):
        shutil.copy(DIGITS / f, model / f)
    (model / "config.toml").write_text("warmup = 0\n" + config + INPUTS)
    if labels is not None:
        (model / "labels.txt").write_text(labels)
    return model


def spec(tmp_path: Path, config: str, **kw: str | None):
    folder(tmp_path, config, **kw)
    return ModelRepository(tmp_path / "repo").scan()["net"]


def test_defaults_come_from_the_model(tmp_path: Path) -> None:
    s = spec(tmp_path, '[preprocess]\npixel_format = "GRAY"\n[postprocess]\nkind = "topk"\n'
                       'labels = "labels.txt"\n')
    assert s.error is None
    assert s.preprocess == Preprocess(input="data", pixel_format=PixelFormat.GRAY, size=(8, 8),
                                      mean=(0.0,), norm=(1.0,))
    assert s.postprocess == Postprocess(kind=MeaningKind.TOPK, output="prob", top_k=5,
                                        labels=tuple("abcdefghij"))
    assert s.postprocess.label(3) == "d" and s.postprocess.label(10) is None


def test_every_key(tmp_path: Path) -> None:
    s = spec(tmp_path, '[preprocess]\ninput = "data"\npixel_format = "GRAY"\nresize = [16, 12]\n'
                       'keep_aspect = true\npad_value = 7\nmean = [1.5]\nnorm = [2]\n'
                       '[postprocess]\nkind = "segmentation"\noutput = "prob"\nthreshold = 0.25\n')
    assert s.error is None
    assert s.preprocess == Preprocess("data", PixelFormat.GRAY, (16, 12), True, 7, (1.5,), (2.0,))
    assert s.postprocess == Postprocess(MeaningKind.SEGMENTATION, "prob", threshold=0.25)


WHERE = "net/config.toml: "


@pytest.mark.parametrize(("config", "message"), [
    ('[preprocess]\npixel_format = "GREY"\n',
     "[preprocess] key 'pixel_format': expected one of 'RGB', 'BGR', 'GRAY', got 'GREY'"),
    ('[preprocess]\nmeans = [1]\n', "[preprocess]: unknown key(s) 'means' (known: input, "),
    ('[preprocess]\npixel_format = "RGB"\n',
     "[preprocess] key 'pixel_format': RGB gives 3 channel(s), input 'data' takes 1 (shape [1, 8, 8])"),
    ('[preprocess]\npixel_format = "GRAY"\nmean = [1, 2, 3]\n',
     "[preprocess] key 'mean': expected 1 number(s), one per GRAY channel, got [1, 2, 3]"),
    ('[preprocess]\npixel_format = "GRAY"\ninput = "img"\n',
     "[preprocess] key 'input': expected one of the model's inputs (data), got 'img'"),
    ('[preprocess]\npixel_format = "GRAY"\nresize = [0, 8]\n',
     "[preprocess] key 'resize': expected [height, width], each from 1 to 16384, got [0, 8]"),
    ('[preprocess]\npixel_format = "GRAY"\npad_value = 300\n',
     "[preprocess] key 'pad_value': expected an integer pixel value from 0 to 255, got 300"),
    ('[preprocess]\npixel_format = "GRAY"\nkeep_aspect = "yes"\n',
     "[preprocess] key 'keep_aspect': expected true or false, got 'yes'"),
    ("preprocess = 3\n", "'preprocess' must be a table ([preprocess]), got 3"),
    ('[postprocess]\ntop_k = 3\n', "[postprocess]: key 'kind' is needed (one of topk, detection, segmentation)"),
    ('[postprocess]\nkind = "classes"\n',
     "[postprocess] key 'kind': expected one of 'topk', 'detection', 'segmentation', got 'classes'"),
    ('[postprocess]\nkind = "topk"\noutput = "scores"\n',
     "[postprocess] key 'output': expected one of the model's outputs (prob), got 'scores'"),
    ('[postprocess]\nkind = "topk"\ntop_k = 0\n', "[postprocess] key 'top_k': expected an integer >= 1, got 0"),
    ('[postprocess]\nkind = "detection"\nthreshold = "high"\n',
     "[postprocess] key 'threshold': expected a finite number, got 'high'"),
    ('[postprocess]\nkind = "detection"\ntop_k = 3\n',
     "[postprocess] key 'top_k': applies to kind = 'topk' only (this is 'detection')"),
    ('[postprocess]\nkind = "topk"\nthreshold = 0.5\n',
     "[postprocess] key 'threshold': applies to kind = 'detection' or 'segmentation' only"),
    ('[postprocess]\nkind = "topk"\nlabels = "names.txt"\n',
     "[postprocess] key 'labels': cannot read net/names.txt: "),
    ('[postprocess]\nkind = "topk"\nlabels = "../labels.txt"\n',
     "[postprocess] key 'labels': expected a file name inside the model folder, got '../labels.txt'"),
])
def test_errors_name_file_table_and_key(tmp_path: Path, config: str, message: str) -> None:
    s = spec(tmp_path, config)
    assert s.error is not None and s.error.startswith(WHERE + message), s.error


def test_too_few_labels(tmp_path: Path) -> None:
    s = spec(tmp_path, '[postprocess]\nkind = "topk"\nlabels = "labels.txt"\n', labels="a\nb\n\n")
    assert s.error == (WHERE + "[postprocess] key 'labels': net/labels.txt has 2 label(s), "
                       "output 'prob' (shape [10]) has 10 classes")


def test_a_broken_table_does_not_stop_the_scan(tmp_path: Path) -> None:
    folder(tmp_path, '[preprocess]\npixel_format = "CMYK"\n')
    (tmp_path / "repo" / "digits").symlink_to(DIGITS)
    specs = ModelRepository(tmp_path / "repo").scan()
    assert specs["net"].error and specs["digits"].error is None
