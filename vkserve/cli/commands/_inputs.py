"""Shared by the commands that take model inputs on the command line (run, verify, profile,
tune, infer, bench, import) and by the benchmarks: the usage error, `--input NAME=file.npy`
loading and `--shape NAME=d0,d1,...` parsing (a light module: it loads neither numba nor
Vulkan)."""

from __future__ import annotations

import numpy as np

#: What --random-input draws, in every command that has it (run, infer, bench; verify,
#: profile and tune fill the inputs not given the same way): one range, the one
#: `vkserve.devices.reference.random_inputs` draws from.
RANDOM_INPUT_HELP = "seeded uniform [-1, 1) float32 data for the inputs not given with --input"


class UsageError(ValueError):
    """Bad command-line input (reported as one line, exit status 2)."""


def load_inputs(items: list[str]) -> dict[str, np.ndarray]:
    """`--input NAME=file.npy` values as float32 arrays (no pickle)."""
    arrays: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input {item!r}: expected NAME=file.npy")
        try:
            arrays[name] = np.load(path, allow_pickle=False).astype(np.float32)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--input {item!r}: {exc}") from None
    return arrays


def _name_value(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise UsageError(f"{what} {text!r}: expected NAME=VALUE")
    return name, value


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in items:
        name, value = _name_value(item, "--shape")
        try:
            shapes[name] = tuple(int(v) for v in value.split(","))
        except ValueError:
            raise UsageError(f"--shape {item!r}: dims must be integers like 3,224,224") from None
    return shapes
