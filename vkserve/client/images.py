"""Images as request inputs, for models whose ``config.toml`` has ``[preprocess]``: the daemon
resizes, reorders channels, normalises and lays them out (``vkserve.processing``).

An input value may be a path (``str`` or ``os.PathLike``) or the bytes of an image file: it
travels as the file's bytes (a uint8 vector; the daemon decodes PNG, JPEG, ... with Pillow,
the ``images`` extra); a uint8 ``(H, W)`` or ``(H, W, 3)`` RGB array goes as it is. Both
clients accept these in ``infer`` (``ClientConnection.infer_request`` calls :func:`as_input`).
"""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

__all__ = ["ImageFileError", "as_input", "image_file"]

#: Largest image file a client reads into a request.
MAX_FILE_BYTES = 256 * 1024 * 1024


class ImageFileError(ValueError):
    """An image path that cannot be read (names the file)."""


def image_file(path: str | os.PathLike[str]) -> np.ndarray:
    """The file's bytes as a uint8 vector (what the daemon decodes)."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise ImageFileError(f"{os.fspath(path)}: {size} bytes; image files of at most "
                                 f"{MAX_FILE_BYTES} bytes are sent")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ImageFileError(f"{os.fspath(path)}: cannot read the image file: "
                             f"{exc.strerror or exc}") from None
    if not data:
        raise ImageFileError(f"{os.fspath(path)}: empty file")
    return np.frombuffer(data, np.uint8)


def as_input(value: npt.ArrayLike | str | os.PathLike[str] | bytes) -> np.ndarray:
    """One request input: a path or file bytes as the file's bytes, anything else as an array."""
    if isinstance(value, (str, os.PathLike)):
        return image_file(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(value), np.uint8)
    return np.asarray(value)
