"""How the daemon logs: text or JSON lines on stderr, at the configured level, with journald's
priority prefix when stderr is the journal.

systemd's journal reads a ``<N>`` prefix on each line of a service's stderr as the line's
priority (``SyslogLevelPrefix=``, on by default), so ``journalctl -p warning`` shows the
daemon's warnings and errors. The daemon knows stderr is the journal when ``$JOURNAL_STREAM``
names the device and inode of its stderr (systemd sets it for services; sd-daemon(3)).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

__all__ = ["FORMATS", "LEVELS", "configure", "stderr_is_journal"]

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
#: syslog priorities of the logging levels (sd-daemon(3): <3> err, <4> warning, <6> info, <7> debug)
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}


def stderr_is_journal(env: Mapping[str, str] = os.environ, stream: TextIO = sys.stderr) -> bool:
    """True when ``$JOURNAL_STREAM`` ("DEVICE:INODE") is the stream's file."""
    device, _, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (unix seconds), level, logger, message, and the
    exception's text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": round(record.created, 6), "level": record.levelname.lower(),
                 "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class _JournalPrefix(logging.Formatter):
    """Another formatter's lines with the journal's ``<N>`` priority prefix."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{_PRIORITY.get(record.levelno, 6)}>"
        # every line of a multi-line record (a traceback) keeps the record's priority
        return "\n".join(prefix + line for line in self.inner.format(record).split("\n"))


def configure(level: str, fmt: str, *, journal: bool | None = None) -> None:
    """Log to stderr at ``level`` in ``fmt`` (``text`` or ``json``); ``journal`` None: detect."""
    base: logging.Formatter = (JsonFormatter() if fmt == "json"
                               else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if journal if journal is not None else stderr_is_journal():
        base = _JournalPrefix(base)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(base)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
