"""The daemon's log lines: text or JSON, at the configured level, with the journal's priority
prefix when stderr is the journal ($JOURNAL_STREAM names it)."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path

import pytest

from tests.support.daemon import Launch
from vkserve.daemon.config import ConfigError, parse_config
from vkserve.daemon.logs import JsonFormatter, _JournalPrefix, stderr_is_journal


def record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("vkserve.test", level, __file__, 1, message, (), None)


def test_json_lines_and_journal_priorities() -> None:
    line = json.loads(JsonFormatter().format(record(logging.WARNING, "disk almost full")))
    assert (line["level"], line["logger"], line["message"]) == ("warning", "vkserve.test", "disk almost full")
    prefixed = _JournalPrefix(logging.Formatter("%(message)s"))
    assert prefixed.format(record(logging.ERROR, "a\nb")) == "<3>a\n<3>b"  # every line of a traceback
    assert prefixed.format(record(logging.DEBUG, "x")) == "<7>x"
    assert prefixed.format(record(logging.INFO, "x")) == "<6>x"


def test_stderr_is_the_journal_only_when_journal_stream_names_it(tmp_path: Path) -> None:
    with (tmp_path / "err").open("w") as stream:
        st = os.fstat(stream.fileno())
        assert stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, stream)
        assert not stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}, stream)
        assert not stderr_is_journal({}, stream)
    assert not stderr_is_journal({"JOURNAL_STREAM": "1:2"}, io.StringIO())


def test_config_checks_level_and_format() -> None:
    assert parse_config('[log]\nlevel = "warning"\nformat = "json"\n').log.format == "json"
    with pytest.raises(ConfigError, match="log.level: expected one of debug, info, warning, error"):
        parse_config('[log]\nlevel = "loud"\n')
    with pytest.raises(ConfigError, match="log.format: expected one of text, json"):
        parse_config('[log]\nformat = "xml"\n')


def test_a_daemon_logs_json_with_journal_priorities(tmp_path: Path, launch_daemon: Launch) -> None:
    log = tmp_path / "daemon.log"
    log.touch()  # the daemon's stderr: start_daemon reopens this same file
    st = log.stat()
    launch_daemon(tmp_path, f'[server]\nsocket = "{tmp_path}/d.sock"\n[log]\nformat = "json"\n'
                  '[scheduler]\nuse_vulkan = false\n',
                  env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    assert lines and all(ln.startswith("<") for ln in lines), lines[:5]
    entries = [json.loads(ln[3:]) for ln in lines]
    ready = next(e for e in entries if "ready on device" in e["message"])
    assert ready["level"] == "info" and ready["logger"] == "vkserve.scheduler.core"
    assert any(e["message"].startswith("CPU kernels ready") for e in entries)
