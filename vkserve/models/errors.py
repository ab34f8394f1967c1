"""The one error type of `models/`: every malformed input surfaces as `ModelFormatError`."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Where:
    """Where in a model a problem sits: file, 1-based line, layer name and type (when known)."""

    file: str
    line: int | None = None
    layer: str | None = None
    layer_type: str | None = None

    def describe(self) -> str:
        text = self.file
        if self.line is not None:
            text += f" line {self.line}"
        if self.layer is not None:
            text += f" (layer {self.layer!r}"
            text += f" {self.layer_type})" if self.layer_type else ")"
        return text


class ModelFormatError(Exception):
    """A .param/.bin that cannot be used, with file, line and layer where known.

    str() reads like ``mobilenet.param line 7 (layer 'conv1' Convolution): param 1 (kernel_w):
    expected int, got float '3.5'``.
    """

    def __init__(
        self,
        file: str,
        line: int | None,
        layer: str | None,
        message: str,
        layer_type: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.layer = layer
        self.layer_type = layer_type
        self.message = message
        super().__init__(f"{Where(file, line, layer, layer_type).describe()}: {message}")

    @classmethod
    def at(cls, where: Where, message: str) -> ModelFormatError:
        return cls(where.file, where.line, where.layer, message, where.layer_type)
