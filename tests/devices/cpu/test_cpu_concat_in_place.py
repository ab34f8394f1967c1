"""Concats written in place on the CPU engine: the producers of a channel Concat's inputs store
into the output's channel ranges and the Concat runs nothing, with the same bits as copying,
against ncnn, in Plans of one item and of a batch; where an input is read elsewhere, is the
model's input or a requested output, or the Concat is along another axis, it copies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_cpu_layers import check, rand, write_param

from vkserve.devices.cpu.executor import Plan
from vkserve.models.graph import load_model


def conv(name: str, src: str, dst: str, cin: int, cout: int, k: int = 3, extra: str = "") -> str:
    return f"Convolution {name} 1 1 {src} {dst} 0={cout} 1={k} 4={k // 2} 5=1 6={cout * cin * k * k} {extra}".strip()


# a fire module: squeeze, then two expansions (one with a fused ReLU) concatenated, then a layer
FIRE = [
    "Split sp 1 3 data d0 d1 d2",
    conv("a", "d0", "a_out", 4, 5),
    conv("b", "d1", "b_mid", 4, 3, k=1),
    "ReLU rb 1 1 b_mid b_out",
    conv("c", "d2", "c_out", 4, 2),
    "Concat cat 3 1 a_out b_out c_out cat_out 0=0",
    conv("d", "cat_out", "out", 10, 6, k=1),
]


def graph_of(tmp_path: Path, lines: list[str], inputs: dict[str, np.ndarray]):
    param = tmp_path / "case.param"
    write_param(param, inputs, lines)
    return load_model(param, None, {n: a.shape for n, a in inputs.items()}, seed=3)


def copying(monkeypatch: pytest.MonkeyPatch, graph, **kw: object) -> Plan:
    """The same Plan with every Concat copying (the executor before in-place Concats)."""
    with monkeypatch.context() as m:
        m.setattr(Plan, "_concats_in_place", lambda self: {})
        return Plan(graph, **kw)  # type: ignore[arg-type]


def test_a_fire_module_concat_is_stored_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = rand(4, 9, 7)
    check(tmp_path, FIRE, {"data": x})  # against ncnn
    graph = graph_of(tmp_path, FIRE, {"data": x})
    plan, plain = Plan(graph), copying(monkeypatch, graph)
    assert plan.concats_in_place == 1 and plain.concats_in_place == 0
    assert plan.arena_bytes <= plain.arena_bytes
    np.testing.assert_array_equal(plan.run({"data": x})["out"], plain.run({"data": x})["out"])
    assert "cat" not in [t.name for t in plan.profile({"data": x}, runs=1)]  # runs nothing


def test_a_batch_plan_stores_each_item_in_its_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xs = [rand(4, 9, 7) for _ in range(3)]
    graph = graph_of(tmp_path, FIRE, {"data": xs[0]})
    plan, plain = Plan(graph, batch=3), copying(monkeypatch, graph, batch=3)
    assert plan.concats_in_place == 1
    got = plan.run_batch_timed([{"data": x} for x in xs])[0]
    want = plain.run_batch_timed([{"data": x} for x in xs])[0]
    for g, w, x in zip(got, want, xs):
        np.testing.assert_array_equal(g["out"], w["out"])
        np.testing.assert_array_equal(g["out"], Plan(graph).run({"data": x})["out"])
    twin = plan.sibling(batch=2)  # a sibling lays its arena out again
    assert twin.concats_in_place == 1
    np.testing.assert_array_equal(twin.run_batch_timed([{"data": xs[1]}])[0][0]["out"], got[1]["out"])


@pytest.mark.parametrize("case, lines", [
    ("an input read elsewhere too", [
        "Split sp 1 3 data d0 d1 d2",
        conv("a", "d0", "a_out", 4, 5),
        "Split sa 1 2 a_out a1 a2",
        conv("c", "d1", "c_out", 4, 3),
        "Concat cat 2 1 a1 c_out cat_out 0=0",
        conv("e", "a2", "e_out", 5, 8, k=1),
        "Eltwise el 2 1 cat_out e_out out 0=1",
    ]),
    ("the model's input", [
        "Split sp 1 2 data d0 d1",
        conv("a", "d0", "a_out", 4, 5),
        "Concat cat 2 1 d1 a_out out 0=0",
    ]),
    ("along the rows", [
        "Split sp 1 2 data d0 d1",
        conv("a", "d0", "a_out", 4, 4),
        conv("c", "d1", "c_out", 4, 4),
        "Concat cat 2 1 a_out c_out out 0=1",
    ]),
])
def test_concats_that_must_copy(tmp_path: Path, case: str, lines: list[str]) -> None:
    x = rand(4, 9, 7)
    check(tmp_path, lines, {"data": x})
    assert Plan(graph_of(tmp_path, lines, {"data": x})).concats_in_place == 0, case


def test_nested_concats_and_a_requested_input(tmp_path: Path) -> None:
    lines = [
        "Split sp 1 3 data d0 d1 d2",
        conv("a", "d0", "a_out", 4, 5),
        conv("b", "d1", "b_out", 4, 3),
        "Concat inner 2 1 a_out b_out in_out 0=0",
        conv("c", "d2", "c_out", 4, 2),
        "Concat outer 2 1 in_out c_out out 0=0",
    ]
    x = rand(4, 9, 7)
    check(tmp_path, lines, {"data": x})
    graph = graph_of(tmp_path, lines, {"data": x})
    assert Plan(graph).concats_in_place == 1  # the inner one; the outer copies it
    # a requested input: the inner Concat copies, so the outer one is stored in place instead
    both = Plan(graph, outputs=["out", "a_out"])
    assert both.concats_in_place == 1
    got = both.run({"data": x})
    np.testing.assert_array_equal(got["out"], Plan(graph).run({"data": x})["out"])
    np.testing.assert_array_equal(got["a_out"], Plan(graph, outputs=["a_out"]).run({"data": x})["a_out"])
