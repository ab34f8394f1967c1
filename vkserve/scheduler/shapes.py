"""Input shapes a model accepts, and the shapes it is built for.

ncnn itself takes any input shape at run time (an Input layer's w/h/c are a hint), and pnnx
writes ``Input in0 0 1 in0`` with none at all. vkserve follows that, with one rule an operator
can see in ``config.toml``:

- an input is **fixed** when its Input layer declares a complete shape and ``config.toml`` gives
  no ``min``/``max`` for it: only that shape (or the one ``config.toml`` names instead) is
  accepted, as before;
- otherwise it is **dynamic**: any shape of 1 to 4 dimensions is accepted, within ``min``/``max``
  where they are given (anything outside is BAD_REQUEST). The engines build a Plan per distinct
  set of input shapes on first use (``vkserve.scheduler.plans``).

Shapes named in ``config.toml`` (``data = [3, 224, 224]``, or ``shapes = [[...], ...]`` in an
``[inputs.data]`` table) are built and warmed at load, so their first request does not wait.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

Shape = tuple[int, ...]
#: One request's input shapes, in the model's input order: what a Plan is built for.
ShapeKey = tuple[Shape, ...]

__all__ = ["InputSpec", "Shape", "ShapeKey", "format_key"]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input: the shapes built at load (``shapes``), whether others are accepted
    (``dynamic``) and the optional per-dimension bounds of dynamic inputs."""

    shapes: tuple[Shape, ...] = ()
    dynamic: bool = False
    min: Shape | None = None
    max: Shape | None = None

    @property
    def fixed_shape(self) -> Shape | None:
        """The one accepted shape of a fixed input (None when dynamic)."""
        return None if self.dynamic else self.shapes[0]

    def dims(self) -> list[int]:
        """The shape as metadata shows it: -1 for a dimension that varies, ``[]`` when even
        the number of dimensions is open (a dynamic input with no shapes or bounds given)."""
        if not self.dynamic:
            return list(self.shapes[0])
        known = [s for s in (*self.shapes, self.min, self.max) if s is not None]
        if not known or len({len(s) for s in known}) != 1:
            return []
        if self.min is None or self.max is None:
            return [-1] * len(known[0])
        return [lo if lo == hi else -1 for lo, hi in zip(self.min, self.max)]

    def problem(self, shape: Shape) -> str | None:
        """Why ``shape`` is refused, or None when it is accepted."""
        if not self.dynamic:
            want = self.shapes[0]
            return None if shape == want else f"shape {list(shape)} does not match the model's {list(want)}"
        if not 1 <= len(shape) <= 4 or any(n <= 0 for n in shape):
            return f"shape {list(shape)}: expected 1 to 4 positive dimensions"
        for bound, name, outside in ((self.min, "min", lambda n, b: n < b),
                                     (self.max, "max", lambda n, b: n > b)):
            if bound is None:
                continue
            if len(bound) != len(shape):
                return (f"shape {list(shape)} has {len(shape)} dimensions, the model's {name} "
                        f"{list(bound)} has {len(bound)}")
            if any(outside(n, b) for n, b in zip(shape, bound)):
                return f"shape {list(shape)} is outside the model's {name} {list(bound)}"
        return None


def check_bounds(where: str, spec: InputSpec) -> str | None:
    """A config mistake in ``spec`` (min above max, a built shape outside the bounds)."""
    if spec.min is not None and spec.max is not None:
        if len(spec.min) != len(spec.max):
            return f"{where}: min {list(spec.min)} and max {list(spec.max)} differ in dimensions"
        if any(lo > hi for lo, hi in zip(spec.min, spec.max)):
            return f"{where}: min {list(spec.min)} is above max {list(spec.max)}"
    for shape in spec.shapes:
        problem = spec.problem(shape)
        if problem is not None:
            return f"{where}: {problem}"
    return None


def key_of(names: Sequence[str], shapes: Mapping[str, Shape]) -> ShapeKey:
    return tuple(tuple(shapes[n]) for n in names)


def format_key(names: Sequence[str], key: ShapeKey) -> str:
    """``in0=3x224x224`` (comma-separated for several inputs): how logs and `models` show it."""
    return ", ".join(f"{n}={'x'.join(map(str, s))}" for n, s in zip(names, key))
