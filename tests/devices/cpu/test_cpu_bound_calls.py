"""A CPU Plan makes each storing step's compiled call once (``Kernel.store_call``, a
``jit.KernelCall``: the kernel and its arguments, views of the arena and work buffers), and each
copying step's copies from views of its input (``Kernel.view_copies``, a ``CopyCall``), and
repeats them run after run: the same bits as making them each run, each run's own data (a
value read from an input is never frozen into a call), task counts for the run's thread cap,
and no call holding a work buffer its slot has outgrown."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.paths import MODELS_DIR
from vkserve.devices.cpu import jit, threads
from vkserve.devices.cpu.executor import Plan, StepKind
from vkserve.devices.cpu.jit import KernelCall
from vkserve.devices.cpu.jit import elementwise as jit_elementwise
from vkserve.devices.cpu.kernels.base import CopyCall
from vkserve.devices.cpu.scratch import Scratch
from vkserve.models.graph import build_graph, load_model, parse_param_text
from vkserve.models.randinit import random_weights


def inputs(plan: Plan, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.uniform(-1, 1, plan.blob_shapes[n]).astype(np.float32) for n in plan.input_names}


def unbound(plan: Plan) -> Plan:
    """``plan``'s sibling running every step through ``forward_store`` each run, as before."""
    twin = plan.sibling()
    twin._bind = lambda count: [(None, step) for step in twin._program_for(count)]  # type: ignore[method-assign]
    return twin


@pytest.mark.parametrize("model", ["mobilenet_v2", "squeezenet", "shufflenet_v2"])
def test_calls_made_once_give_each_runs_bits(model: str) -> None:
    plan = Plan(load_model(MODELS_DIR / f"{model}.param", None))
    twin = unbound(plan)
    for seed in (0, 1, 0):  # the second input's run must not reuse the first's results
        x = inputs(plan, seed)
        expected = twin.run(x)
        got = plan.run(x)
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{model} seed {seed}")
    bound = next(program for (count, _), program in plan._bound.items() if count == 1)
    stores = [step for _, step in bound if step.kind is StepKind.STORE]
    calls = [call for call, step in bound if step.kind is StepKind.STORE]
    assert all(isinstance(call, KernelCall) for call in calls) and len(calls) == len(stores) > 0  # every one here
    # shufflenet_v2's channel shuffles and Slices: copies of views of their input, made once;
    # a Slice's outputs reuse its input's bytes, so its call copies the input into a work
    # buffer first and takes the views from there
    copies = {step.kernel.layer.type for call, step in bound if isinstance(call, CopyCall)}
    assert copies == ({"ShuffleChannel", "Slice"} if model == "shufflenet_v2" else set()), copies
    for call, step in bound:
        if isinstance(call, CopyCall) and step.copy_inputs:
            (buffer, source), *views = call.pairs
            assert source is step.ins[0] and any(np.may_share_memory(source, view) for view, _ in step.outs)
            assert all(np.may_share_memory(src, buffer) for _, src in views)
    assert any(step.copy_inputs for call, step in bound if isinstance(call, CopyCall)) == (model == "shufflenet_v2")


def test_a_value_read_from_an_input_is_read_each_run() -> None:
    """x - mean(x): the BinaryOp reads its one-value operand as a scalar argument, so its
    step has no call made once (``store_call`` None) and each run reads its own mean."""
    layers = parse_param_text("""7767517
4 5
Input data 0 1 data 0=8 1=8 2=4
Split split 1 2 data a b
Reduction mean 1 1 b m 0=3
BinaryOp sub 2 1 a m out 0=1
""", "centre")
    for layer, weights in zip(layers, random_weights(layers, 0)):
        layer.weights = weights
    plan = Plan(build_graph(layers, "centre"))
    sub = next(s for s in plan._program if s.name == "sub")
    assert sub.kernel.form.bform == jit_elementwise.B_SCALAR and sub.kind is StepKind.STORE
    assert sub.kernel.store_call(sub.ins, [v for v, _ in sub.outs], sub.post) is None
    for seed, shift in ((0, 0.0), (1, 3.0), (0, -5.0)):
        x = {"data": inputs(plan, seed)["data"] + np.float32(shift)}
        fresh = Plan(build_graph(layers, "centre")).run(x)["out"]
        got = plan.run(x)["out"]
        np.testing.assert_array_equal(got, fresh)
        assert abs(float(got.mean())) < 0.05, (shift, float(got.mean()))  # centred: this run's mean taken


@pytest.mark.skipif(threads.THREADS < 2, reason="one thread: a single cap")
def test_calls_follow_the_runs_thread_cap() -> None:
    """Made per thread cap: a layer split for two threads is not run split for one."""
    plan = Plan(load_model(MODELS_DIR / "mobilenet_v2.param", None))
    programs = {}
    for n in (1, 2):
        with jit.run_threads(n):
            programs[n] = [call.args for call, _ in plan._bound_program(1) if isinstance(call, KernelCall)]
    assert set(plan._bound) == {(1, 1), (1, 2)}
    counts = [[a for a in args if isinstance(a, int) and not isinstance(a, bool)] for args in programs[1]]
    counts2 = [[a for a in args if isinstance(a, int) and not isinstance(a, bool)] for args in programs[2]]
    assert counts != counts2  # some task count follows the cap
    x = inputs(plan, 0)
    expected = unbound(plan).run(x)
    for n in (1, 2, 1):
        with plan._lock, jit.run_threads(n):
            plan._load_inputs([x])
            for call, step in plan._bound_program(1):
                if call is not None:
                    call()
                else:
                    plan._run_step(step, {})
        for name in expected:
            np.testing.assert_array_equal(plan._outputs(0, {}, None)[name], expected[name])


def test_no_call_holds_a_work_buffer_its_slot_outgrew(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot grows while the calls are made (later steps ask for more): they are made again,
    so each holds the slot's last buffer, not one the Plan no longer uses."""
    handed: list[np.ndarray] = []
    get = Scratch.get

    def recording(self: Scratch, slot: str, shape: tuple[int, ...] | int, dtype: type = np.float32) -> np.ndarray:
        view = get(self, slot, shape, dtype)
        handed.append(self._bufs[slot])
        return view

    monkeypatch.setattr(Scratch, "get", recording)
    plan = Plan(load_model(MODELS_DIR / "squeezenet.param", None))
    plan.run(inputs(plan, 0))
    plan.run(inputs(plan, 1))
    current = {id(b) for b in plan.scratch._bufs.values()}
    stale = [b for b in {id(b): b for b in handed}.values() if id(b) not in current]
    assert stale, "no slot grew: the check below checks nothing"
    for bound in plan._bound.values():
        for call, step in bound:
            for arg in call.args if isinstance(call, KernelCall) else ():
                if isinstance(arg, np.ndarray):
                    assert not any(np.shares_memory(arg, b) for b in stale), step.name


def test_a_strided_view_gets_no_call() -> None:
    """A reshape of a strided view is a copy: a call made once from one would read (or write)
    that run's copy ever after, so such a step keeps its per-run path."""
    plan = Plan(load_model(MODELS_DIR / "shufflenet_v2.param", None))
    for kind, layer in ((StepKind.STORE, "Convolution"), (StepKind.BF16_NATIVE, "ShuffleChannel")):
        step = next(s for s in plan._program if s.kind is kind and s.kernel.layer.type == layer)
        assert plan._call(step) is not None
        x = step.ins[0]
        strided = np.zeros((2 * x.shape[0], *x.shape[1:]), x.dtype)[::2]  # the same shape, every other row
        assert plan._call(step._replace(ins=[strided, *step.ins[1:]])) is None, layer
