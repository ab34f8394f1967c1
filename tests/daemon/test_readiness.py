"""/readyz with a broken model folder beside a good one: not ready under the default
`metrics.readyz = "all"`; ready, with the broken one as a warning, under "any"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import Launch, http_get, make_repository


@pytest.mark.parametrize(("mode", "status"), [("all", 503), ("any", 200)])
def test_readyz_all_or_any_model(tmp_path: Path, launch_daemon: Launch, mode: str, status: int) -> None:
    repo = make_repository(tmp_path / "repo", slow=False)
    (repo / "broken").mkdir()
    (repo / "broken" / "model.param").write_text("not a param file\n")
    d = launch_daemon(tmp_path, f'[server]\nsocket = "{tmp_path}/d.sock"\n[models]\nrepository = "{repo}"\n'
                                f'[metrics]\nreadyz = "{mode}"\n[scheduler]\nuse_vulkan = false\n')
    assert d.metrics_port is not None
    code, body = http_get(d.metrics_port, "/readyz")
    assert code == status, body
    assert "broken" in body and "bad magic" in body
    if mode == "any":
        assert body.startswith("ready: digits") and "warning: model broken (failed" in body
