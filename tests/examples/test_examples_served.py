"""The daemon with no model repository configured serves the packaged examples, `shapes` next
to `digits`: PNG files of the shapes samples sent as bytes come back with the right label
first (the daemon decodes, resizes and normalises them as shapes/config.toml says)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import Daemon, Launch, wait_status
from vkserve.client import Client
from vkserve.client.images import image_file
from vkserve.client.meaning import TopK

SAMPLES = Path(__file__).resolve().parents[2] / "vkserve" / "examples" / "shapes" / "samples"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("examples")
    d = launch_module_daemon(work, f'[server]\nsocket = "{work}/d.sock"\n',
                             env={"STATE_DIRECTORY": ""})
    settled = wait_status(d, lambda s: set(s["models"]) == {"digits", "shapes"} and all(
        m["state"] in ("ready", "failed") for m in s["models"].values()), timeout=180)
    states = {name: m["state"] for name, m in settled["models"].items()}
    assert states == {"digits": "ready", "shapes": "ready"}, d.log_text()[-3000:]
    return d


@pytest.mark.parametrize("label", ["circle", "square", "triangle", "star", "cross"])
def test_shapes_names_each_sample_picture(daemon: Daemon, label: str) -> None:
    with Client.connect(f"unix:{daemon.socket}") as client:
        reply = client.infer_detailed("shapes", {"in0": image_file(SAMPLES / f"{label}.png")})
    assert reply.outputs["out0"].shape == (5,)
    (meaning,) = reply.meanings
    assert isinstance(meaning, TopK) and len(meaning.classes) == 3  # top_k = 3 in its config
    best = meaning.classes[0]
    assert (best.label, best.index) == (label, int(reply.outputs["out0"].argmax())), meaning
    assert best.score > 0.5
