"""A CPU Plan's siblings (the scheduler's second and later instances of a model on the CPU):
their own arenas and work buffers, the packed weights shared, the same bits as the first, and
runs on several threads at once that do not disturb each other."""

from __future__ import annotations

import threading

import numpy as np

from tests.support.paths import MODELS_DIR
from vkserve.devices.cpu.executor import Plan
from vkserve.models.graph import load_model


def inputs(plan: Plan, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.uniform(-1, 1, plan.blob_shapes[n]).astype(np.float32) for n in plan.input_names}


def test_siblings_share_weights_not_buffers_and_agree_bit_for_bit() -> None:
    plan = Plan(load_model(MODELS_DIR / "squeezenet.param", None))
    twin = plan.sibling()
    assert twin.weights_id == plan.weights_id and twin.weight_bytes == plan.weight_bytes
    first, second = plan._steps[1].kernel, twin._steps[1].kernel  # a convolution
    assert first is not second and first.weight is second.weight  # one copy of the panels
    assert not np.shares_memory(plan._arena, twin._arena) and plan.scratch is not twin.scratch
    x = inputs(plan, 0)
    expected = plan.run(x)
    got = twin.run(x)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


def test_siblings_run_concurrently_without_disturbing_each_other() -> None:
    plan = Plan(load_model(MODELS_DIR / "mobilenet_v2.param", None))
    plans = [plan, plan.sibling(), plan.sibling()]
    xs = [inputs(plan, seed) for seed in range(3)]
    expected = [plan.run(x) for x in xs]  # one after the other, on one Plan
    got: list[list[dict[str, np.ndarray]]] = [[] for _ in plans]

    def work(i: int) -> None:
        for _ in range(3):
            got[i].append(plans[i].run(xs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, runs in enumerate(got):
        assert len(runs) == 3
        for out in runs:
            for name in expected[i]:
                np.testing.assert_array_equal(out[name], expected[i][name])
