"""Local-size tuner (vkserve.devices.vulkan.engine.tuning) and `vkserve tune`, on lavapipe.

One tiny model (Input -> Convolution -> ReLU -> Pooling) keeps the tuner's pipeline builds
to a few dozen; the table, file and lock tests need no device.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support.vulkan_engine import engine_device, graph_of  # noqa: F401 (fixture)
from vkserve.cache.cache_file import DeviceIdentity
from vkserve.cache.persist import WriterLock
from vkserve.cli import main as cli
from vkserve.devices.capabilities import DeviceCaps, Precision
from vkserve.devices.vulkan.device import VulkanDevice
from vkserve.devices.vulkan.engine.plan import Plan
from vkserve.devices.vulkan.engine.tuning import (
    FORMAT_VERSION,
    MAX_FILE_BYTES,
    TunedEntry,
    TuningKey,
    TuningTable,
    WorkGroupLimits,
    candidates,
    device_tuning_path,
    set_table,
    table_for,
    tunable,
    tuning_path,
)
from vkserve.devices.vulkan.layers.base import Dispatch

MODEL = ["Convolution conv 1 1 data c 0=8 1=3 4=1 5=1 6=216",
         "ReLU relu 1 1 c r",
         "Pooling pool 1 1 r out 0=0 1=2 2=2"]
SHAPE = (3, 12, 12)

IDENTITY = DeviceIdentity(vendor_id=0x10DE, device_id=0x2330, api_version=4206822,
                          driver_version=555, driver_id=4, device_name="GPU X",
                          driver_name="drv", pipeline_cache_uuid=bytes(range(16)))


def _key(shader: str = "conv", gsize: tuple[int, int, int] = (12, 12, 2)) -> TuningKey:
    return TuningKey(shader, "ab" * 16, "fp32", gsize, (8, 8, 1), (12, 3, 0.5, -1.25), (12, 3))


def _table() -> TuningTable:
    return TuningTable(IDENTITY, {_key(): TunedEntry((8, 4, 2), 0.2, 0.1),
                                  _key("pooling", (6, 6, 8)): TunedEntry((8, 8, 1), 0.05, 0.05)})


# -------------------------------------------------------------------------------- candidates


@pytest.mark.parametrize("gsize", [(56, 56, 64), (12, 12, 2), (288, 1, 1), (7, 7, 1024),
                                   (1, 1, 1), (65535 * 64, 3, 1), (3, 5, 17)])
@pytest.mark.parametrize("mode", ["normal", "rapid"])
def test_candidates_respect_limits(gsize: tuple[int, int, int], mode: str) -> None:
    limits = WorkGroupLimits(max_invocations=256, max_size=(128, 64, 16), subgroup_size=8)
    found = candidates(gsize, limits, mode)
    assert found and len(set(found)) == len(found)
    for ls in found:
        assert math.prod(ls) <= 256
        assert all(v <= m for v, m in zip(ls, (128, 64, 16)))
        assert all(v <= max(g, 1) for v, g in zip(ls, gsize))  # never past the global size
        assert all(-(-g // v) <= 65535 for g, v in zip(gsize, ls))
        assert math.prod(ls) >= min(8, math.prod(min(g, m) for g, m in zip(gsize, (128, 64, 16))))
        if mode == "rapid":
            assert all(v & (v - 1) == 0 for v in ls) and math.prod(ls) <= 256


def test_candidates_normal_includes_divisors_and_powers_of_two() -> None:
    limits = WorkGroupLimits(max_invocations=1024, max_size=(1024, 1024, 64), subgroup_size=1)
    xs = {ls[0] for ls in candidates((56, 1, 1), limits)}
    assert xs == {1, 2, 4, 7, 8, 14, 16, 28, 32, 56}
    assert {ls[0] for ls in candidates((56, 1, 1), limits, "rapid")} == {1, 2, 4, 8, 16, 32}
    with pytest.raises(ValueError):
        candidates((8, 8, 8), limits, "exhaustive")


def test_device_limits(engine_device: VulkanDevice) -> None:  # noqa: F811
    limits = WorkGroupLimits.of_device(engine_device)
    assert limits.max_invocations >= 128 and min(limits.max_size) >= 64
    assert limits.subgroup_size == max(1, engine_device.caps.subgroup_size)


def test_fixed_local_size_shaders_are_not_tuned() -> None:
    for shader in ("innerproduct", "pooling_global", "softmax", "conv_gemm"):
        assert not tunable(Dispatch(shader, (), (64, 1, 1), local_size=(64, 1, 1)))
    for shader in ("conv", "convdw", "pooling", "unaryop", "copy_strided"):
        assert tunable(Dispatch(shader, (), (64, 1, 1)))

    @dataclasses.dataclass(frozen=True)
    class Flagged(Dispatch):
        fixed_local_size: bool = True

    assert not tunable(Flagged("conv", (), (64, 1, 1)))


# -------------------------------------------------------------------------------- the file


def test_file_round_trip(tmp_path: Path) -> None:
    path = tuning_path(tmp_path, IDENTITY)
    assert path.name == Path(IDENTITY.file_name()).stem + ".tuning"
    table = _table()
    assert table.save(path)
    loaded = TuningTable.load(path, IDENTITY)
    assert loaded is not None and loaded.entries == table.entries
    assert TuningTable.decode(table.encode(), IDENTITY).entries == table.entries
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_save_merges_with_the_file(tmp_path: Path) -> None:
    path = tuning_path(tmp_path, IDENTITY)
    assert _table().save(path)
    other = TuningTable(IDENTITY, {_key("unaryop", (288, 1, 1)): TunedEntry((32, 1, 1), 1.0, 0.5),
                                   _key(): TunedEntry((4, 4, 2), 0.2, 0.09)})
    assert other.save(path)
    loaded = TuningTable.load(path, IDENTITY)
    assert loaded is not None and len(loaded) == 3
    assert loaded.get(_key()) == TunedEntry((4, 4, 2), 0.2, 0.09)  # the newer save wins


def _rewrite(doc: dict, **changes: object) -> bytes:
    """The document with `changes` and a digest that matches them (damage we can't see
    through the digest must still be refused by the field checks)."""
    from vkserve.devices.vulkan.engine.tuning import _digest  # noqa: PLC0415

    body = {k: v for k, v in doc.items() if k != "digest"}
    body.update(changes)
    return json.dumps({**body, "digest": _digest(body)}).encode()


def _bad_files() -> dict[str, bytes]:
    good = _table().encode()
    doc = json.loads(good)
    flipped = bytearray(good)
    flipped[good.index(b'"local_size":[8,4,2]') + 15] = ord("9")
    entry = dict(doc["entries"][0])
    return {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "garbage": os.urandom(300),
        "not utf-8": b"\xff\xfe" + good,
        "a number flipped": bytes(flipped),
        "magic": _rewrite(doc, magic="vkserve-other"),
        "version": _rewrite(doc, format_version=FORMAT_VERSION + 1),
        "extra field": _rewrite(doc, extra=1),
        "zero local size": _rewrite(doc, entries=[{**entry, "local_size": [0, 1, 1]}]),
        "local size of 2": _rewrite(doc, entries=[{**entry, "local_size": [1, 1]}]),
        "float local size": _rewrite(doc, entries=[{**entry, "local_size": [8.0, 1, 1]}]),
        "missing field": _rewrite(doc, entries=[{k: v for k, v in entry.items() if k != "shader"}]),
        "negative time": _rewrite(doc, entries=[{**entry, "best_ms": -1}]),
        "duplicate": _rewrite(doc, entries=[entry, entry]),
        "entries not a list": _rewrite(doc, entries={}),
        "list document": b"[]",
    }


@pytest.mark.parametrize("case", sorted(_bad_files()))
def test_damaged_file_is_a_miss(tmp_path: Path, case: str,
                                caplog: pytest.LogCaptureFixture) -> None:
    path = tuning_path(tmp_path, IDENTITY)
    path.write_bytes(_bad_files()[case])
    with caplog.at_level(logging.WARNING, "vkserve.devices.vulkan.engine.tuning"):
        assert TuningTable.load(path, IDENTITY) is None
    assert [r for r in caplog.records if "ignoring tuning file" in r.getMessage()]
    # and the next save replaces it with a good file
    assert _table().save(path)
    assert TuningTable.load(path, IDENTITY) is not None


@pytest.mark.parametrize("field,value", [("driver_version", 556), ("device_id", 1),
                                         ("vendor_id", 0x1002), ("driver_name", "other"),
                                         ("pipeline_cache_uuid", bytes(16))])
def test_foreign_device_is_a_miss(tmp_path: Path, field: str, value: object,
                                  caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t.tuning"
    assert _table().save(path)
    other = dataclasses.replace(IDENTITY, **{field: value})
    with caplog.at_level(logging.WARNING, "vkserve.devices.vulkan.engine.tuning"):
        assert TuningTable.load(path, other) is None
    assert "another device or driver" in caplog.text


def test_unreadable_paths_are_misses(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert TuningTable.load(tmp_path / "missing.tuning", IDENTITY) is None  # plain cold start
    (tmp_path / "dir.tuning").mkdir()
    fifo = tmp_path / "fifo.tuning"
    os.mkfifo(fifo)
    big = tmp_path / "big.tuning"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with caplog.at_level(logging.WARNING, "vkserve.devices.vulkan.engine.tuning"):
        for name in ("dir.tuning", "fifo.tuning", "big.tuning"):
            assert TuningTable.load(tmp_path / name, IDENTITY) is None
    assert len([r for r in caplog.records if "ignoring tuning file" in r.getMessage()]) == 3


def test_single_writer(tmp_path: Path) -> None:
    path = tuning_path(tmp_path, IDENTITY)
    holder = WriterLock(path)  # another open file description: flock excludes it too
    assert holder.acquire()
    try:
        assert not _table().save(path)
        assert not path.exists()
    finally:
        holder.release()
    assert _table().save(path)
    assert path.with_name(path.name + ".lock").exists()


# -------------------------------------------------------------------------------- plans


@pytest.fixture()
def fresh_table(engine_device: VulkanDevice) -> Iterator[None]:  # noqa: F811
    """The shared device's table is left as the test found it."""
    before = table_for(engine_device)
    yield
    set_table(engine_device, before)


def test_plan_uses_tuned_local_sizes(engine_device: VulkanDevice,  # noqa: F811
                                     fresh_table: None) -> None:
    graph = graph_of(MODEL, {"data": SHAPE}, seed=3)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    with Plan(engine_device, graph, tuned=False) as base:
        expected = base.run({"data": x})
        dispatches = [s.dispatch for s in base.steps]
    # the conv shader may fix its own size (conv_gemm does); ReLU and Pooling never do
    assert [d.shader for d in dispatches][1:] == ["unaryop", "pooling"]
    table = TuningTable(DeviceIdentity.from_caps(engine_device.caps))
    limits = WorkGroupLimits.of_device(engine_device)
    chosen = {}
    for k, d in enumerate(dispatches):
        # the smallest candidate that is not the default: the most groups, the most different
        local = min((c for c in candidates(d.global_size, limits, "rapid") if c != d.local_size),
                    key=math.prod)
        table.put(TuningKey.of(d, Precision.FP32), TunedEntry(local, 1.0, 0.5))
        if tunable(d):
            chosen[k] = local
    assert set(chosen) >= {1, 2}
    # an entry that breaks the device limits is ignored, not used
    table.put(TuningKey.of(dispatches[2], Precision.FP16_STORAGE), TunedEntry((4096, 1, 1), 1, 0.5))
    set_table(engine_device, table)
    with Plan(engine_device, graph) as tuned:
        assert tuned.tuned_count == len(chosen)
        for k, (step, d) in enumerate(zip(tuned.steps, dispatches)):
            assert step.dispatch == d  # the declared dispatch is kept for the tuner
            local = chosen.get(k, d.local_size)
            assert step.pipeline.local_size == local
            assert step.groups == tuple(-(-g // s) for g, s in zip(d.global_size, local))
        got = tuned.run({"data": x})
    np.testing.assert_array_equal(got["out"], expected["out"])
    with Plan(engine_device, graph, tuned=False) as untuned:
        assert untuned.tuned_count == 0
        assert [s.pipeline.local_size for s in untuned.steps] == [d.local_size for d in dispatches]


def test_fixed_size_dispatch_ignores_entries(engine_device: VulkanDevice,  # noqa: F811
                                             fresh_table: None) -> None:
    graph = graph_of(["InnerProduct fc 1 1 data out 0=5 1=1 2=300"], {"data": SHAPE[:1] + (4, 5)})
    with Plan(engine_device, graph, tuned=False) as base:
        d = base.steps[0].dispatch
    table = TuningTable(DeviceIdentity.from_caps(engine_device.caps))
    table.put(TuningKey.of(d, Precision.FP32), TunedEntry((32, 1, 1), 1.0, 0.5))
    set_table(engine_device, table)
    with Plan(engine_device, graph) as plan:
        assert plan.tuned_count == 0 and plan.steps[0].pipeline.local_size == d.local_size


def test_tune_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       vulkan_caps: DeviceCaps) -> None:
    param = tmp_path / "tiny.param"
    body = ["Input data 0 1 data"] + MODEL
    param.write_text(f"7767517\n{len(body)} 4\n" + "\n".join(body) + "\n")
    cache = tmp_path / "cache"
    argv = ["tune", str(param), "--device", str(vulkan_caps.index), "--shape", "data=3,12,12",
            "--cache-dir", str(cache), "--mode", "rapid", "--runs", "2", "--profile-runs", "2",
            "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saved"] and out["max_abs_diff"] == 0.0
    assert out["before_ms"] > 0 and out["after_ms"] > 0
    rows = out["dispatches"]
    assert [r["shader"] for r in rows][-2:] == ["unaryop", "pooling"]
    assert out["dispatches_measured"] == len(rows)
    for r in rows:
        assert r["candidates"] > 1 and r["best_ms"] <= r["default_ms"]
        assert r["improved"] == (r["best_local_size"] != r["default_local_size"])
    assert out["dispatches_improved"] == sum(r["improved"] for r in rows)
    assert out["dispatches_using_tuned_size"] == sum(r["improved"] for r in rows)
    # a new process (here: a new device) loads the file and its Plans use the tuned sizes
    with VulkanDevice(vulkan_caps, cache) as device:
        path = device_tuning_path(device)
        assert path is not None and str(path) == out["tuning_file"]
        table = table_for(device)
        assert table is not None and len(table) == len(rows)
        graph = graph_of(MODEL, {"data": SHAPE})
        with Plan(device, graph) as plan:
            assert plan.tuned_count == out["dispatches_using_tuned_size"]
            best = {r["step"]: r["best_local_size"] for r in rows}
            assert [list(s.pipeline.local_size) for s in plan.steps] == \
                [best.get(k, list(s.dispatch.local_size)) for k, s in enumerate(plan.steps)]


def test_tune_cli_refuses_cpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    param = tmp_path / "tiny.param"
    param.write_text("7767517\n1 1\nInput data 0 1 data\n")
    assert cli.main(["tune", str(param), "--device", "cpu"]) == 2
    assert "Vulkan device" in capsys.readouterr().err
