"""Once every Plan of a model holds its own copy of the weights (bf16 panels, device buffers),
the scheduler drops the parsed fp32 weights (issue 13, memory); a shape built later reads them
from the model's files again, and refuses when those files changed since the model was read.
Real CPU engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.scheduler.test_dynamic_shapes import reference, write_fcn, x
from tests.support.scheduler import serving
from vkserve.models.weights import write_random_bin
from vkserve.scheduler import DeviceHandle, InternalError


def held_weights(sched: object, name: str) -> int:
    """Bytes of fp32 weights the scheduler still holds for model ``name``."""
    entry = sched._models[name]  # type: ignore[attr-defined]
    return sum(int(np.asarray(w).nbytes) for layer in entry.layers for w in layer.weights)


async def test_weights_are_released_after_load_and_read_again_for_a_new_shape(tmp_path: Path) -> None:
    folder = write_fcn(tmp_path, 'warmup = 1\n[inputs]\ndata = [3, 8, 8]\n')
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        assert held_weights(sched, "fcn") == 0  # the prebuilt shape's Plans hold their own
        for shape in [(3, 8, 8), (3, 6, 13)]:  # the second one is built after the release
            data = x(shape, seed=sum(shape))
            result = await sched.infer("fcn", {"data": data})
            np.testing.assert_array_equal(result.outputs["out"], reference(folder, data))
        assert held_weights(sched, "fcn") == 0


async def test_a_new_shape_after_the_files_changed_is_refused_and_named(tmp_path: Path) -> None:
    folder = write_fcn(tmp_path, 'warmup = 1\n[inputs]\ndata = [3, 8, 8]\n')
    before = x((3, 8, 8))
    async with serving([DeviceHandle.cpu(0)], tmp_path) as sched:
        expected = (await sched.infer("fcn", {"data": before})).outputs["out"]
        write_random_bin(folder / "model.param", folder / "model.bin", seed=5)  # edited weights
        with pytest.raises(InternalError, match="files changed on disk since it was loaded"):
            await sched.infer("fcn", {"data": x((3, 9, 9))})
        again = await sched.infer("fcn", {"data": before})  # the loaded shape still serves
        np.testing.assert_array_equal(again.outputs["out"], expected)
