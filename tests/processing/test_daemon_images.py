"""Images in, meaning out, through a real daemon: a copy of the digits example with
``[preprocess]`` (GRAY 8x8, norm 16/255: the training's 0..16 scale) and ``[postprocess]``
(top-k with labels) answers uint8 images, PNG files and batches of images with the class the
float input gets; the msgpack reply carries the top-k, the KServe HTTP interface takes UINT8;
bad images are BAD_REQUEST and the daemon goes on serving."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from PIL import Image

from tests.conftest import Launch
from tests.support.daemon import Daemon, Raw, req, sample, vkserve_cmd
from tests.support.paths import DIGITS, REPO
from vkserve.client import AsyncClient, BadRequestError, Client
from vkserve.client.meaning import Detections, SegmentationMask, TopK
from vkserve.client.messages import InferReply, decode_infer_reply
from vkserve.client.tensors import encode_tensors

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
PRE_POST = """
[preprocess]
pixel_format = "GRAY"
norm = [0.0627450980392157]   # 16 / 255: pixel 255 is the training's 16

[postprocess]
kind = "topk"
top_k = 3
labels = "labels.txt"
"""
SAMPLES = range(10)
#: "segmentation" without weights: a softmax over the channels, so each pixel's class is its
#: strongest colour channel (RGB order after the model's preprocessing)
SEG_PARAM = """7767517
2 2
Input            data   0 1 data 0=16 1=16 2=3
Softmax          sm     1 1 data scores 0=0 1=1
"""
SEG_CONFIG = """random_weights = true
warmup = 0
[preprocess]
pixel_format = "RGB"
keep_aspect = true
pad_value = 0
[postprocess]
kind = "segmentation"
"""
#: "detection" without weights: the rows input comes back as the detection output (AbsVal),
#: beside a picture the model letterboxes; the boxes must come back in the picture's pixels
DET_PARAM = """7767517
4 4
Input            img    0 1 img 0=16 1=16 2=3
Input            rows   0 1 rows 0=6 1=3
Pooling          gap    1 1 img pooled 0=1 4=1
AbsVal           abs    1 1 rows dets
"""
DET_CONFIG = """random_weights = true
warmup = 0
[preprocess]
input = "img"
keep_aspect = true
[postprocess]
kind = "detection"
output = "dets"
threshold = 0.5
labels = "labels.txt"
"""


def digits_copy(repo: Path, name: str, extra: str) -> Path:
    """The digits weights with ``extra`` config tables (the shipped config's are left out)."""
    folder = repo / name
    folder.mkdir(parents=True)
    for f in ("model.param", "model.bin"):
        shutil.copy(DIGITS / f, folder / f)
    (folder / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (folder / "config.toml").write_text("warmup = 0\n[inputs]\ndata = [1, 8, 8]\n" + extra)
    return folder


def as_image(x: np.ndarray) -> np.ndarray:
    """A digits sample (1, 8, 8) float 0..16 as the uint8 (8, 8) gray image it was scanned as."""
    return np.round(x[0] * (255 / 16)).astype(np.uint8)


def png_bytes(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Daemon:
    work = tmp_path_factory.mktemp("images")
    repo = work / "repo"
    digits_copy(repo, "digits-img", PRE_POST)
    digits_copy(repo, "digits", "")  # no [preprocess]: images are refused
    (repo / "shipped").symlink_to(DIGITS)  # the example as the package ships it
    for name, param, config in (("seg", SEG_PARAM, SEG_CONFIG), ("det", DET_PARAM, DET_CONFIG)):
        (repo / name).mkdir()
        (repo / name / "model.param").write_text(param)
        (repo / name / "config.toml").write_text(config)
        (repo / name / "labels.txt").write_text("\n".join(LABELS) + "\n")
    return launch_module_daemon(work, f"""
[server]
socket = "{work}/d.sock"
[models]
repository = "{repo}"
[http]
listen = "127.0.0.1:0"
[grpc]
listen = "127.0.0.1:0"
""")


@pytest.fixture(scope="module")
def client(daemon: Daemon):
    with Client.connect(f"unix:{daemon.socket}") as c:
        yield c


def test_uint8_images_get_the_float_inputs_class(client: Client) -> None:
    for k in SAMPLES:
        x = sample(k)
        want = client.infer("digits", {"data": x})["prob"]
        got = client.infer("digits-img", {"data": as_image(x)})["prob"]
        assert int(got.argmax()) == int(want.argmax()) == k
        # the image holds the sample to 16/255/2 per pixel: the probabilities barely move
        np.testing.assert_allclose(got, want, atol=0.05)


def test_any_size_is_resized_to_the_models_input(client: Client) -> None:
    """A 4x nearest upscale: the bilinear downscale's sample points fall between equal pixels,
    so the model sees exactly the 8x8 image; an (H, W, 3) RGB image is converted to gray."""
    for k in (2, 7):
        small = as_image(sample(k))
        big = np.kron(small, np.ones((4, 4), np.uint8))
        rgb = np.repeat(big[:, :, None], 3, axis=2)
        ref = client.infer("digits-img", {"data": small})["prob"]
        for image in (big, rgb):
            np.testing.assert_array_equal(client.infer("digits-img", {"data": image})["prob"], ref)


def test_the_async_client_takes_paths_and_gets_meanings(daemon: Daemon, tmp_path: Path) -> None:
    path = tmp_path / "9.png"
    path.write_bytes(png_bytes(as_image(sample(9))))

    async def main() -> InferReply:
        async with AsyncClient.connect(daemon.socket) as c:
            return await c.infer_detailed("digits-img", {"data": path})

    reply = asyncio.run(main())
    assert isinstance(reply.meanings[0], TopK)
    assert (reply.meanings[0].classes[0].index, reply.meanings[0].classes[0].label) == (9, "nine")


def test_png_files_and_paths(client: Client, tmp_path: Path) -> None:
    x = sample(5)
    path = tmp_path / "5.png"
    path.write_bytes(png_bytes(as_image(x)))
    ref = client.infer("digits-img", {"data": as_image(x)})["prob"]
    for value in (path, str(path), path.read_bytes()):
        np.testing.assert_array_equal(client.infer("digits-img", {"data": value})["prob"], ref)


def test_reply_carries_the_top_k_with_labels(daemon: Daemon) -> None:
    with Raw(daemon.socket) as raw:
        raw.send(req(1, "infer", model="digits-img", inputs=encode_tensors({"data": as_image(sample(3))})))
        r, _ = raw.until(1)
    assert r.ok, r.error
    reply = decode_infer_reply(r.result)
    (top,) = reply.meanings
    assert isinstance(top, TopK) and len(top.classes) == 3
    best = top.classes[0]
    assert (best.index, best.label) == (3, "three")
    prob = reply.outputs["prob"]
    assert [c.index for c in top.classes] == list(np.argsort(-prob)[:3])
    assert [c.score for c in top.classes] == [float(prob[c.index]) for c in top.classes]
    assert all(c.label == LABELS[c.index] for c in top.classes)


def test_a_batch_of_images(daemon: Daemon, client: Client) -> None:
    """(N, H, W, 1) uint8: N images of one size run as a client batch, one top-k per item."""
    ks = [1, 4, 9]
    batch = np.stack([as_image(sample(k))[:, :, None] for k in ks])
    with Raw(daemon.socket) as raw:
        raw.send(req(2, "infer", model="digits-img", inputs=encode_tensors({"data": batch})))
        r, _ = raw.until(2)
    assert r.ok, r.error
    reply = decode_infer_reply(r.result)
    assert reply.outputs["prob"].shape == (3, 10)
    assert [m.classes[0].index for m in reply.meanings if isinstance(m, TopK)] == ks
    for i, k in enumerate(ks):
        one = client.infer("digits-img", {"data": as_image(sample(k))})["prob"]
        np.testing.assert_allclose(reply.outputs["prob"][i], one, atol=1e-6)


def test_float_tensors_still_work_and_get_a_top_k(daemon: Daemon) -> None:
    with Raw(daemon.socket) as raw:
        raw.send(req(3, "infer", model="digits-img", inputs=encode_tensors({"data": sample(6)})))
        r, _ = raw.until(3)
        raw.send(req(4, "infer", model="digits", inputs=encode_tensors({"data": sample(6)})))
        plain, _ = raw.until(4)
    assert r.ok and plain.ok
    assert decode_infer_reply(r.result).meanings[0].classes[0].label == "six"
    assert "postprocess" not in plain.result  # a model without [postprocess]: as before


def test_bad_images_are_bad_requests_and_the_daemon_goes_on(client: Client) -> None:
    cases = [
        ("digits-img", np.frombuffer(b"not an image at all", np.uint8), "not a readable image file"),
        ("digits-img", np.zeros((8, 8, 4), np.uint8), "got shape [8, 8, 4]"),
        ("digits", np.zeros((8, 8), np.uint8), "[preprocess]"),
    ]
    for model, value, words in cases:
        with pytest.raises(BadRequestError) as err:
            client.infer(model, {"data": value})
        assert "input 'data'" in str(err.value) and words in str(err.value)
    assert int(client.infer("digits-img", {"data": as_image(sample(8))})["prob"].argmax()) == 8


def test_kserve_grpc_takes_uint8_images(daemon: Daemon, client: Client) -> None:
    address = daemon.wait_line("KServe v2 gRPC on ").split("gRPC on ", 1)[1].split()[0]
    image = np.kron(as_image(sample(4)), np.ones((3, 3), np.uint8))
    tensor = triton_grpc.InferInput("data", list(image.shape), "UINT8")
    tensor.set_data_from_numpy(image)
    with triton_grpc.InferenceServerClient(address) as grpc_client:
        prob = grpc_client.infer("digits-img", [tensor]).as_numpy("prob")
    np.testing.assert_allclose(prob, client.infer("digits-img", {"data": image})["prob"], atol=1e-6)
    assert int(prob.argmax()) == 4


def test_kserve_http_takes_uint8_images(daemon: Daemon, client: Client) -> None:
    line = daemon.wait_line("KServe v2 HTTP on http://")
    port = int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    http = triton.InferenceServerClient(f"127.0.0.1:{port}")
    image = np.kron(as_image(sample(7)), np.ones((2, 2), np.uint8))
    for binary in (True, False):
        tensor = triton.InferInput("data", list(image.shape), "UINT8")
        tensor.set_data_from_numpy(image, binary_data=binary)
        prob = http.infer("digits-img", [tensor]).as_numpy("prob")
        np.testing.assert_allclose(prob, client.infer("digits-img", {"data": image})["prob"], atol=1e-6)
        assert int(prob.argmax()) == 7


def colour_blocks(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """An RGB image whose every pixel is one strong channel, and that channel's index."""
    rng = np.random.default_rng(5)
    classes = rng.integers(0, 3, (h, w))
    pixels = np.full((h, w, 3), 20, np.uint8)
    np.put_along_axis(pixels, classes[:, :, None], 230, axis=2)
    return pixels, classes


def test_segmentation_mask_in_the_images_pixels(daemon: Daemon) -> None:
    """An 8 x 16 image letterboxed into the 16 x 16 input (rows 4..11): the mask comes back
    8 x 16, each pixel its strongest channel, equal to the argmax of the returned scores."""
    pixels, classes = colour_blocks(8, 16)
    with Raw(daemon.socket) as raw:
        raw.send(req(5, "infer", model="seg", inputs=encode_tensors({"data": pixels})))
        r, _ = raw.until(5)
    assert r.ok, r.error
    reply = decode_infer_reply(r.result)
    (seg,) = reply.meanings
    assert isinstance(seg, SegmentationMask) and seg.mask.shape == (8, 16)
    np.testing.assert_array_equal(seg.mask, classes)
    np.testing.assert_array_equal(seg.mask, reply.outputs["scores"][:, 4:12].argmax(0))


def test_detection_boxes_in_the_images_pixels(daemon: Daemon) -> None:
    """A 40 x 80 picture letterboxed into 16 x 16: content 8 x 16 at row 4 (scale 0.2). Rows in
    [0, 1] of the model input come back in the picture's pixels, best first, thresholded."""
    rows = np.array([[2, 0.75, 0.0, 0.25, 1.0, 0.75],      # the whole picture
                     [5, 0.4, 0.0, 0.0, 1.0, 1.0],          # under the threshold
                     [7, 0.9, 0.25, 0.5, 0.5, 0.625]], np.float32)
    inputs = {"img": np.zeros((40, 80, 3), np.uint8), "rows": rows}
    with Raw(daemon.socket) as raw:
        raw.send(req(6, "infer", model="det", inputs=encode_tensors(inputs)))
        r, _ = raw.until(6)
    assert r.ok, r.error
    (det,) = decode_infer_reply(r.result).meanings
    assert isinstance(det, Detections)
    assert [(b.index, b.label) for b in det.boxes] == [(7, "seven"), (2, "two")]
    seven, two = det.boxes
    # (the device may hold the rows in fp16/bf16: 3 significant digits)
    assert (two.x0, two.y0, two.x1, two.y1) == pytest.approx((0, 0, 80, 40), abs=0.05)
    assert (seven.x0, seven.y0, seven.x1, seven.y1) == pytest.approx((20, 20, 40, 30), abs=0.05)
    assert (seven.score, two.score) == pytest.approx((0.9, 0.75), rel=2e-3)


def vk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(vkserve_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=120)


def test_cli_infer_images_prints_the_top_k(daemon: Daemon, tmp_path: Path) -> None:
    paths = []
    for k in (3, 8):
        path = tmp_path / f"{k}.png"
        path.write_bytes(png_bytes(np.kron(as_image(sample(k)), np.ones((3, 3), np.uint8))))
        paths.append(str(path))
    p = vk("infer", "digits-img", "--image", *paths, "--socket", str(daemon.socket))
    assert p.returncode == 0, p.stderr
    text = p.stdout.splitlines()
    first, second = text.index(f"{paths[0]}:"), text.index(f"{paths[1]}:")
    assert text[first + 2] == "top 3:" and text[first + 3].endswith("  3 three")
    assert text[second + 3].endswith("  8 eight")
    p = vk("infer", "digits-img", "--image", paths[0], "--json", "--socket", str(daemon.socket))
    assert p.returncode == 0, p.stderr
    (one,) = json.loads(p.stdout)["images"]
    assert one["image"] == paths[0] and one["outputs"]["prob"]["class"] == 3
    (top,) = one["postprocess"]
    assert top["kind"] == "topk" and top["classes"][0][:2] == [3, "three"]
    p = vk("infer", "digits-img", "--image", str(tmp_path / "none.png"), "--socket", str(daemon.socket))
    assert p.returncode == 2 and "none.png: cannot read the image file" in p.stderr


def test_cli_save_mask(daemon: Daemon, tmp_path: Path) -> None:
    pixels, classes = colour_blocks(8, 16)
    src, out = tmp_path / "in.png", tmp_path / "mask.png"
    Image.fromarray(pixels).save(src)
    p = vk("infer", "seg", "--image", str(src), "--save-mask", str(out), "--socket", str(daemon.socket))
    assert p.returncode == 0, p.stderr
    assert "mask 16x8, classes 0: " in p.stdout and f"mask written to {out}" in p.stdout
    with Image.open(out) as mask:
        np.testing.assert_array_equal(np.asarray(mask), classes)
    p = vk("infer", "digits-img", "--image", str(src), "--save-mask", str(out),
           "--socket", str(daemon.socket))
    assert p.returncode == 2 and "holds 0 segmentation mask(s)" in p.stderr


def test_the_shipped_example_reads_its_sample_pngs(daemon: Daemon) -> None:
    """vkserve/examples/digits has [preprocess] / [postprocess] and samples/<k>.png: `vkserve
    infer digits --image samples/<k>.png` names the digit (as in its README)."""
    paths = [str(DIGITS / "samples" / f"{k}.png") for k in SAMPLES]
    p = vk("infer", "shipped", "--image", *paths, "--json", "--socket", str(daemon.socket))
    assert p.returncode == 0, p.stderr
    answers = json.loads(p.stdout)["images"]
    assert [a["postprocess"][0]["classes"][0][:2] for a in answers] == [[k, LABELS[k]] for k in SAMPLES]
