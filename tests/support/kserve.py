"""Shared by the KServe v2 front-end tests (HTTP and gRPC): the daemon config and the answers
of vkserve's own client to compare with."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.daemon import Daemon, make_repository, sample
from vkserve.client import Client


def kserve_config(work: Path, section: str, listen: str, extra: str = "") -> str:
    """A daemon serving the digits example in ``work``, with ``[section] listen`` (``http`` or
    ``grpc``) and ``extra`` lines in ``[server]``."""
    repo = make_repository(work / "repo", slow=False)
    return f"""
[server]
socket = "{work}/d.sock"
{extra}

[models]
repository = "{repo}"

[{section}]
listen = "{listen}"
"""


def native_answers(daemon: Daemon) -> dict[int, np.ndarray]:
    """vkserve's own client's answers for the samples 3 and 7."""
    with Client.connect(f"unix:{daemon.socket}") as c:
        return {k: c.infer("digits", {"data": sample(k)})["prob"] for k in (3, 7)}
