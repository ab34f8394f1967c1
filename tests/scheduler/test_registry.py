"""Model repository: folder layout, config.toml validation, errors that name file/line/key and
stay confined to their model, and device selection."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import trio

from vkserve.models.graph import build_graph
from vkserve.models.weights import write_random_bin
from vkserve.scheduler import (
    BadInput,
    DeviceHandle,
    ModelRepository,
    ModelState,
    RescanResult,
    Scheduler,
    SchedulerConfig,
    Unavailable,
)
from vkserve.scheduler.shapes import InputSpec

TINY = ("7767517\n4 4\n"
        "Input in 0 1 data 0=8 1=8 2=3\n"
        "Convolution conv 1 1 data c 0=4 1=3 4=1 5=1 6=108\n"
        "ReLU relu 1 1 c r\n"
        "InnerProduct fc 1 1 r prob 0=10 1=1 2=2560\n")
# Input shape left open, as pnnx writes it: any shape the graph takes is accepted
OPEN = TINY.replace("Input in 0 1 data 0=8 1=8 2=3", "Input in 0 1 data")


def model(repo: Path, name: str, config: str | None = None, param: str = TINY,
          weights: bool = True) -> Path:
    folder = repo / name
    folder.mkdir(parents=True)
    (folder / "model.param").write_text(param)
    if weights:
        write_random_bin(folder / "model.param", folder / "model.bin")
    if config is not None:
        (folder / "config.toml").write_text(config)
    return folder


def test_good_folder_with_defaults(tmp_path: Path) -> None:
    model(tmp_path, "tiny")
    (spec,) = ModelRepository(tmp_path).scan().values()
    assert spec.error is None and spec.name == "tiny"
    assert spec.inputs == {"data": InputSpec(shapes=((3, 8, 8),))} and spec.outputs == {"prob": (10,)}
    assert spec.prebuilt == (((3, 8, 8),),) and spec.inputs["data"].dims() == [3, 8, 8]
    assert (spec.precision, spec.devices, spec.cpu_fallback) == ("auto", "auto", True)
    assert spec.warmup is None and spec.queue_limit is None
    assert (spec.plan_cache_shapes, spec.plan_cache_mb) == (8, 1024)
    assert spec.bin_path == tmp_path / "tiny" / "model.bin"
    layers = spec.load_layers()
    assert [layer.name for layer in layers] == ["in", "conv", "relu", "fc"]
    assert len(layers[1].weights) == 2


def test_config_keys(tmp_path: Path) -> None:
    model(tmp_path, "m", param=OPEN, weights=False, config="""
precision = "fp16"
devices = [0, "cpu"]
cpu_fallback = false
warmup = 3
queue_limit = 5
random_weights = true
seed = 7
plan_cache_shapes = 3
plan_cache_mb = 64
[inputs]
data = [3, 8, 8]
""")
    spec = ModelRepository(tmp_path).scan()["m"]
    assert spec.error is None
    # the Input declares no shape: the config's is built at load, others stay allowed
    assert spec.inputs == {"data": InputSpec(shapes=((3, 8, 8),), dynamic=True)}
    assert spec.outputs == {"prob": (10,)} and spec.inputs["data"].dims() == [-1, -1, -1]
    assert (spec.precision, spec.devices, spec.cpu_fallback) == ("fp16", (0, "cpu"), False)
    assert (spec.warmup, spec.queue_limit, spec.seed, spec.bin_path) == (3, 5, 7, None)
    assert (spec.plan_cache_shapes, spec.plan_cache_mb) == (3, 64)
    layers = spec.load_layers()  # seeded random weights
    graph = build_graph(layers, "model.param", {"data": (3, 8, 8)})
    assert graph.blob_shapes["prob"] == (10,) and graph.layers[3].weights[0].size == 2560


def test_devices_by_name(tmp_path: Path) -> None:
    """The devices list takes the names used everywhere else (vkserve.devices.names) too."""
    model(tmp_path, "m", config='devices = ["vulkan:1", "CPU", 0, "2"]\n')
    assert ModelRepository(tmp_path).scan()["m"].devices == (1, "cpu", 0, 2)


def test_input_tables_with_shapes_and_bounds(tmp_path: Path) -> None:
    model(tmp_path, "m", param=OPEN.replace("InnerProduct fc 1 1 r prob 0=10 1=1 2=2560", "Noop n 1 1 r prob"),
          config="""
[inputs.data]
shapes = [[3, 8, 8], [3, 16, 12]]
min = [3, 4, 4]
max = [3, 32, 32]
""")
    spec = ModelRepository(tmp_path).scan()["m"]
    assert spec.error is None, spec.error
    assert spec.inputs["data"] == InputSpec(((3, 8, 8), (3, 16, 12)), True, (3, 4, 4), (3, 32, 32))
    assert spec.inputs["data"].dims() == [3, -1, -1]
    assert spec.prebuilt == (((3, 8, 8),), ((3, 16, 12),))
    assert spec.outputs == {"prob": (4, -1, -1)}  # both built shapes inferred: c fixed, h/w vary
    assert spec.inputs["data"].problem((3, 40, 8)) == "shape [3, 40, 8] is outside the model's max [3, 32, 32]"
    assert spec.inputs["data"].problem((3, 8)) is not None
    assert spec.inputs["data"].problem((3, 4, 32)) is None


def test_a_shapeless_input_without_config_loads(tmp_path: Path) -> None:
    model(tmp_path, "m", param=OPEN)
    spec = ModelRepository(tmp_path).scan()["m"]
    assert spec.error is None, spec.error
    assert spec.inputs == {"data": InputSpec(dynamic=True)} and spec.prebuilt == ()
    assert spec.inputs["data"].dims() == [] and spec.outputs == {"prob": ()}


@pytest.mark.parametrize(("config", "param", "weights", "message"), [
    ("warmup = -1\n", TINY, True, "bad/config.toml: key 'warmup': expected an integer >= 0, got -1"),
    ("warmup = 'two'\n", TINY, True, "bad/config.toml: key 'warmup'"),
    ("queue_limit = 0\n", TINY, True, "bad/config.toml: key 'queue_limit'"),
    ("warmpu = 1\n", TINY, True, "bad/config.toml: unknown key(s) 'warmpu'"),
    ("precision = 'fp8'\n", TINY, True, "bad/config.toml: key 'precision'"),
    ("devices = 'gpus'\n", TINY, True, "bad/config.toml: key 'devices'"),
    ("devices = [-1]\n", TINY, True, "bad/config.toml: key 'devices'"),
    ("devices = ['gpu0']\n", TINY, True, "bad/config.toml: key 'devices'"),
    ("devices = [true]\n", TINY, True, "bad/config.toml: key 'devices'"),
    ("cpu_fallback = 1\n", TINY, True, "bad/config.toml: key 'cpu_fallback'"),
    ("inputs = 3\n", TINY, True, "bad/config.toml: key 'inputs'"),
    ("[inputs]\ndata = [3, 0, 8]\n", TINY, True, "bad/config.toml: key 'inputs.data'"),
    ("[inputs]\nimage = [3, 8, 8]\n", TINY, True, "bad/config.toml: [inputs] names 'image'"),
    ("[inputs.data]\nshape = [3, 8, 8]\n", OPEN, True, "key 'inputs.data': unknown key(s) 'shape'"),
    ("[inputs.data]\nmin = [3, 9, 9]\nmax = [3, 4, 4]\n", OPEN, True,
     "inputs.data: min [3, 9, 9] is above max [3, 4, 4]"),
    ("[inputs.data]\nshapes = [[3, 8, 8]]\nmin = [3, 9, 9]\n", OPEN, True,
     "inputs.data: shape [3, 8, 8] is outside the model's min [3, 9, 9]"),
    ("[inputs.data]\nshapes = [[3, 8, 8], [3, 9, 9]]\n", TINY, True, "fixes this input's shape"),
    ("[inputs]\ndata = [3, 16, 16]\n", TINY, True, "bad/model.param line 6 (layer 'fc' InnerProduct)"),
    ("warmup = \n", TINY, True, "bad/config.toml: invalid TOML"),
    (None, TINY.replace("6=108", "6=10.8"), False, "bad/model.param line 4 (layer 'conv' Convolution)"),
    (None, "7767517\n1 1\nFoo f 0 1 x\n", False, "bad/model.param line 3"),
    (None, TINY, False, "bad/model.bin: missing"),
])
def test_errors_name_file_and_key_and_stay_with_their_model(
        tmp_path: Path, config: str | None, param: str, weights: bool, message: str) -> None:
    model(tmp_path, "good")
    model(tmp_path, "bad", config=config, param=param, weights=weights)
    specs = ModelRepository(tmp_path).scan()
    assert specs["good"].error is None
    assert specs["bad"].error is not None and message in specs["bad"].error, specs["bad"].error
    with pytest.raises(BadInput, match="bad/"):
        specs["bad"].load_layers()


def test_scan_skips_hidden_and_files_and_reports_odd_folders(tmp_path: Path) -> None:
    model(tmp_path, "tiny")
    (tmp_path / ".git").mkdir()
    (tmp_path / "README.md").write_text("models")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad name").mkdir()
    specs = ModelRepository(tmp_path).scan()
    assert sorted(specs) == ["bad name", "empty", "tiny"]
    assert "empty/model.param: missing" in (specs["empty"].error or "")
    assert "model folder names must match" in (specs["bad name"].error or "")
    assert ModelRepository(tmp_path).spec("tiny") is not None
    assert ModelRepository(tmp_path).spec("../x") is None
    assert ModelRepository(tmp_path).spec("nope") is None
    with pytest.raises(BadInput, match="not a directory"):
        ModelRepository(tmp_path / "nowhere").scan()


def test_a_short_bin_fails_that_model_at_load(tmp_path: Path) -> None:
    folder = model(tmp_path, "short")
    data = (folder / "model.bin").read_bytes()
    (folder / "model.bin").write_bytes(data[:100])
    spec = ModelRepository(tmp_path).scan()["short"]
    assert spec.error is None  # weights are read at load, not at scan
    with pytest.raises(Exception, match="model.bin"):
        spec.load_layers()


@dataclass
class Dev:
    index: int
    is_cpu: bool


def test_device_selection() -> None:
    gpu0, gpu1, cpu = Dev(0, False), Dev(1, False), Dev(2, True)
    every = [gpu0, gpu1, cpu]

    def spec(devices: object, cpu_fallback: bool = True) -> object:
        from vkserve.scheduler.registry import ModelSpec  # noqa: PLC0415

        return ModelSpec("m", Path("."), Path("."), devices=devices,  # type: ignore[arg-type]
                         cpu_fallback=cpu_fallback)

    assert spec("auto").initial_devices(every) == [gpu0, gpu1]
    assert spec("auto").initial_devices([cpu]) == [cpu]
    assert spec("all").initial_devices(every) == every
    assert spec("gpu").initial_devices([cpu]) == []
    assert spec("cpu").initial_devices(every) == [cpu]
    assert spec((1, "cpu")).initial_devices(every) == [gpu1, cpu]
    assert spec((1,)).allows(gpu0) is False and spec((1,)).allows(gpu1) is True
    assert spec((1,)).allows(cpu) is False and spec((1,)).allows(cpu, fallback=True) is True
    assert spec((1,), cpu_fallback=False).allows(cpu, fallback=True) is False
    assert spec("gpu").allows(cpu) is False


async def test_scheduler_serves_good_models_and_reports_broken_ones(tmp_path: Path) -> None:
    model(tmp_path, "good")
    model(tmp_path, "typo", config="warmpu = 1\n")
    model(tmp_path, "short")
    (tmp_path / "short" / "model.bin").write_bytes(b"\0" * 64)
    model(tmp_path, "open", param=OPEN, config="[inputs]\ndata = [3, 8, 8]\n")
    sched = Scheduler([DeviceHandle.cpu(0)], SchedulerConfig(), ModelRepository(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        with trio.fail_after(10):
            await sched.wait_until(sched.ready)
        models = {m.name: m for m in sched.models()}
        assert {n: m.state for n, m in models.items()} == {
            "good": "ready", "open": "ready", "short": "failed", "typo": "failed"}
        assert "typo/config.toml: unknown key(s) 'warmpu'" in (models["typo"].error or "")
        assert "model.bin" in (models["short"].error or "")
        x = np.zeros((3, 8, 8), np.float32)
        assert (await sched.infer("good", {"data": x})).outputs["prob"].shape == (10,)
        assert (await sched.infer("open", {"data": x})).outputs["prob"].shape == (10,)
        with pytest.raises(Unavailable, match="warmpu"):
            await sched.infer("typo", {"data": x})
        # fix the folder, load it again at runtime
        (tmp_path / "typo" / "config.toml").write_text("warmup = 1\n")
        assert (await sched.load_model("typo")).state is ModelState.READY
        await sched.aclose()


async def test_rescan_loads_new_and_fixed_folders_only(tmp_path: Path) -> None:
    model(tmp_path, "first")
    model(tmp_path, "typo", config="warmpu = 1\n")
    sched = Scheduler([DeviceHandle.cpu(0)], SchedulerConfig(), ModelRepository(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        with trio.fail_after(10):
            await sched.wait_until(sched.ready)
        model(tmp_path, "second")
        model(tmp_path, "broken", config="seed = -1\n")
        report = await sched.rescan()
        assert report.loaded == ["second"]
        assert sorted(report.failed) == ["broken", "typo"]
        assert "broken/config.toml: key 'seed'" in report.failed["broken"]
        (tmp_path / "typo" / "config.toml").unlink()
        assert await sched.rescan() == RescanResult(loaded=["typo"], removed=[], reloaded=[],
                                                    failed={"broken": report.failed["broken"]})
        states = {m.name: m.state for m in sched.models()}
        assert states == {"broken": "failed", "first": "ready", "second": "ready", "typo": "ready"}
        await sched.aclose()


async def test_rescan_unloads_removed_and_reloads_changed_folders(tmp_path: Path) -> None:
    import shutil

    model(tmp_path, "keep")
    model(tmp_path, "gone")
    model(tmp_path, "edited")
    sched = Scheduler([DeviceHandle.cpu(0)], SchedulerConfig(), ModelRepository(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        with trio.fail_after(10):
            await sched.wait_until(sched.ready)
        assert await sched.rescan() == RescanResult(loaded=[], removed=[], reloaded=[], failed={})
        shutil.rmtree(tmp_path / "gone")
        (tmp_path / "edited" / "config.toml").write_text("warmup = 2\n")
        assert await sched.rescan() == RescanResult(loaded=[], removed=["gone"],
                                                    reloaded=["edited"], failed={})
        states = {m.name: m.state for m in sched.models()}
        assert states == {"edited": "ready", "keep": "ready"}
        await sched.aclose()
