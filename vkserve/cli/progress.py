"""Progress of long command-line work on stderr.

On a terminal one line redrawn in place (a bar when the number of steps is known); otherwise
(a pipe, a log file, CI) plain lines: one when a stage starts, then at most one every
``interval_s`` seconds, and one when a stage's last step is done. A stage without steps (ncnn's
reference run, numba compiling the CPU kernels) still shows that it is alive: the elapsed time
on a terminal, a "still working" line every ``interval_s`` otherwise. Nothing at all with
``--json`` (``quiet``), so that stdout and stderr stay machine-readable. The reporter is a
`vkserve.devices.progress.Progress`, so the engines can drive it from worker threads.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

__all__ = ["PLAIN_INTERVAL_S", "Progress"]

#: Seconds between two plain progress lines of one stage (not on a terminal).
PLAIN_INTERVAL_S = 5.0
_REDRAW_S = 0.1  # terminal redraws at most this often
_TICK_S = 1.0  # the heartbeat's period (and how long a step may be silent on a terminal)
_BAR = 24


class Progress:
    """The progress of one command: ``stage(text)`` starts a phase, ``progress(done, total,
    what)`` reports its steps, leaving the ``with`` block clears a terminal's bar."""

    def __init__(self, command: str, *, quiet: bool = False, stream: TextIO | None = None,
                 interval_s: float = PLAIN_INTERVAL_S) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._prefix = f"vkserve {command}: "
        self._quiet = quiet
        self._tty = self._stream.isatty()
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._stage = ""
        self._stage_start = time.monotonic()
        self._last = 0.0  # when the last line or redraw went out
        self._drawn = 0  # characters of the bar line on the terminal (0: none)
        self._text = ""  # the terminal line's text without the heartbeat's elapsed time
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="progress", daemon=True)

    def __enter__(self) -> Progress:
        if not self._quiet:
            self._heartbeat.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._heartbeat.is_alive():
            self._heartbeat.join()
        with self._lock:
            self._clear()

    def stage(self, text: str) -> None:
        """A new phase of the work (one line of its own when not on a terminal)."""
        with self._lock:
            self._stage = text
            self._stage_start = self._last = time.monotonic()
            if self._quiet:
                return
            if self._tty:
                self._draw(f"{text} ...")
            else:
                self._line(text)

    def __call__(self, done: int, total: int, what: str = "") -> None:
        """``done`` of ``total`` steps of the current stage finished (any thread)."""
        with self._lock:
            if self._quiet:
                return
            now = time.monotonic()
            last_step = done >= total
            elapsed = now - self._stage_start
            if self._tty:
                if now - self._last < _REDRAW_S and not last_step:
                    return
                filled = _BAR * done // max(total, 1)
                bar = "#" * filled + "." * (_BAR - filled)
                self._draw(f"[{bar}] {done}/{total} {self._stage}: {what}")
            else:
                if now - self._last < self._interval_s and not last_step:
                    return
                pct = 100 * done // max(total, 1)
                self._line(f"{self._stage}: {done}/{total} ({pct}%) after {elapsed:.1f} s"
                           + (f", {what}" if what else ""))
            self._last = now

    def done(self, text: str) -> None:
        """The whole work ended: its closing line (kept on a terminal too)."""
        with self._lock:
            self._stage = ""
            if self._quiet:
                return
            self._clear()
            self._line(text)

    # -- the heartbeat thread and drawing (the lock held) -------------------------------

    def _beat(self) -> None:
        """Show that a stage without steps (or with slow ones) is alive."""
        while not self._stop.wait(_TICK_S):
            with self._lock:
                now = time.monotonic()
                if not self._stage:
                    continue
                elapsed = now - self._stage_start
                if self._tty and self._drawn and now - self._last >= _TICK_S:
                    text = self._text
                    self._draw(f"{text} {elapsed:.0f} s")
                    self._text = text
                elif not self._tty and now - self._last >= max(self._interval_s, _TICK_S):
                    self._line(f"{self._stage}: still working after {elapsed:.0f} s")
                    self._last = now

    def _line(self, text: str) -> None:
        print(self._prefix + text, file=self._stream, flush=True)

    def _draw(self, text: str) -> None:
        self._text = text
        width = self._width() - 1
        line = (self._prefix + text)[:width]
        pad = " " * max(0, self._drawn - len(line))
        self._stream.write("\r" + line + pad)
        self._stream.flush()
        self._drawn = len(line)

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self._stream.fileno()).columns
        except (OSError, ValueError):
            columns = 0
        return columns or shutil.get_terminal_size().columns  # a new pty says 0 columns

    def _clear(self) -> None:
        if self._drawn:
            self._stream.write("\r" + " " * self._drawn + "\r")
            self._stream.flush()
            self._drawn = 0
