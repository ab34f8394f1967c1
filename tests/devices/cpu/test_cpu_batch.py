"""A CPU Plan built for a batch runs several items in one execution with the same bits as
one run per item: element-wise layers once over the items, the others item by item on
their own views of the arena (whose bytes a step's outputs must then not share with the
next item's inputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import MODELS_DIR
from vkserve.devices.cpu.executor import Plan, PlanError
from vkserve.models.graph import load_model
from vkserve.scheduler.engine import CPU_BATCH_ARENA_BYTES, cpu_batch_size

DIGITS = Path(__file__).resolve().parents[3] / "vkserve" / "examples" / "digits"

#: models whose layers cover the batched kernels (activations, Softmax, BinaryOp, Eltwise,
#: InnerProduct) and the item-by-item ones (convolutions, pooling, Concat, Slice, Permute, LRN)
MODELS = {"alexnet": (3, 227, 227), "mobilenet_v2": (3, 48, 48), "mobilenet_v3": (3, 48, 48), "shufflenet_v2": (3, 64, 64),
          "efficientnet_b0": (3, 48, 48), "squeezenet": (3, 64, 64), "resnet18": (3, 224, 224)}


def _items(shape: tuple[int, ...], count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"data": rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(count)]


def _same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys()
        for name in w:
            assert g[name].shape == w[name].shape, (i, name)
            assert g[name].tobytes() == w[name].tobytes(), f"item {i}, output {name}"


@pytest.mark.parametrize("model", sorted(MODELS))
def test_batch_matches_single_runs(model: str) -> None:
    shape = MODELS[model]
    graph = load_model(MODELS_DIR / f"{model}.param", None, {"data": shape})
    single = Plan(graph)
    batched = single.sibling(batch=3)
    items = _items(shape, 3, seed=len(model))
    want = [single.run(x) for x in items]
    outputs, times = batched.run_batch_timed(items)
    _same(outputs, want)
    assert times.run > 0
    _same(batched.run_batch_timed(items[:2])[0], want[:2])  # fewer items than the Plan takes
    _same(batched.run_batch_timed(items[2:])[0], want[2:])
    assert batched.arena_bytes == 3 * single.arena_bytes
    whole = {p.name for p in batched._program if p.item < 0 and not p.kernel.alias}
    per_item = [p.name for p in batched._program if p.item >= 0]
    assert whole and per_item  # both kinds of step ran
    assert all(per_item.count(name) == 3 for name in per_item)
    types = {p.kernel.layer.type for p in batched._program if p.item < 0}
    assert "InnerProduct" in types or "InnerProduct" not in {s.kernel.layer.type for s in batched._steps}


def test_digits_example_batch() -> None:
    """The example model: Softmax (an axis past the item axis) over the whole batch."""
    graph = load_model(DIGITS / "model.param", DIGITS / "model.bin", {"data": (1, 8, 8)})
    plan = Plan(graph, batch=5)
    samples = sorted((DIGITS / "samples").glob("*.npy"))[:5]
    items = [{"data": np.load(s).astype(np.float32).reshape(1, 8, 8)} for s in samples]
    single = Plan(graph)
    _same(plan.run_batch_timed(items)[0], [single.run(x) for x in items])
    for out in plan.run_batch_timed(items)[0]:
        assert abs(float(out["prob"].sum()) - 1.0) < 1e-2


def test_batch_errors_name_the_item() -> None:
    graph = load_model(DIGITS / "model.param", DIGITS / "model.bin", {"data": (1, 8, 8)})
    plan = Plan(graph, batch=2)
    good = {"data": np.zeros((1, 8, 8), np.float32)}
    with pytest.raises(ValueError, match=r"input 'data' \(item 1\) has shape \(8, 8\)"):
        plan.run_batch_timed([good, {"data": np.zeros((8, 8), np.float32)}])
    with pytest.raises(ValueError, match=r"missing inputs \(item 0\): data"):
        plan.run_batch_timed([{}, good])
    with pytest.raises(ValueError, match="3 items: this Plan runs 1 to 2 at a time"):
        plan.run_batch_timed([good] * 3)
    with pytest.raises(ValueError, match="at least one item"):
        Plan(graph, batch=0)


def test_data_dependent_outputs_run_one_item_at_a_time() -> None:
    graph = load_model(MODELS_DIR / "yolov4-tiny.param", None, {"data": (3, 96, 96)})
    single = Plan(graph)
    assert not single.batchable
    with pytest.raises(PlanError, match="data-dependent outputs .*one at a time"):
        single.sibling(batch=2)
    assert cpu_batch_size(single, 8) == 1


def test_batch_size_within_the_arena_budget() -> None:
    graph = load_model(DIGITS / "model.param", DIGITS / "model.bin", {"data": (1, 8, 8)})
    digits = Plan(graph)
    assert cpu_batch_size(digits, 8) == 8 and cpu_batch_size(digits, 1) == 1
    big = load_model(MODELS_DIR / "vgg16.param", None, {"data": (3, 224, 224)})
    vgg = Plan(big)
    assert cpu_batch_size(vgg, 8) == max(1, CPU_BATCH_ARENA_BYTES // vgg.arena_bytes) < 8
