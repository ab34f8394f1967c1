"""The progress reporter's plain-line mode (stderr not a terminal) and its quiet mode; the
terminal bar is checked end to end on a pseudo-terminal in test_cli_consistency.py."""

from __future__ import annotations

import io
import threading

from vkserve.cli.progress import Progress

NEVER = 1e9  # an interval no test outlives: only stage starts and last steps print


def lines(stream: io.StringIO) -> list[str]:
    """The lines written, less the heartbeat's (a loaded machine may pause a test long enough)."""
    return [ln for ln in stream.getvalue().splitlines() if ": still working after " not in ln]


def test_plain_lines_stage_and_last_step_only() -> None:
    out = io.StringIO()
    with Progress("cache warm", stream=out, interval_s=NEVER) as progress:
        progress.stage("building 3 pipelines on vulkan:0")
        progress(1, 3, "conv")
        progress(2, 3, "pool")
        progress(3, 3, "relu")
        progress.done("1 device(s) warm")
    got = lines(out)
    assert got[0] == "vkserve cache warm: building 3 pipelines on vulkan:0"
    assert got[1].startswith("vkserve cache warm: building 3 pipelines on vulkan:0: 3/3 (100%) after ")
    assert got[1].endswith(" s, relu")
    assert got[2:] == ["vkserve cache warm: 1 device(s) warm"]
    assert "\r" not in out.getvalue()


def test_plain_lines_every_step_when_the_interval_allows() -> None:
    out = io.StringIO()
    with Progress("tune", stream=out, interval_s=0) as progress:
        progress.stage("timing candidates")
        for k in range(1, 5):
            progress(k, 4, f"step {k}")
    got = lines(out)
    assert [ln.split(": ", 2)[2].split(" (")[0] for ln in got[1:]] == ["1/4", "2/4", "3/4", "4/4"]
    assert [ln.rsplit(", ", 1)[1] for ln in got[1:]] == [f"step {k}" for k in range(1, 5)]


def test_steps_from_many_threads_make_whole_lines() -> None:
    out = io.StringIO()
    total = 200
    with Progress("verify", stream=out, interval_s=0) as progress:
        progress.stage("building the Vulkan Plan on vulkan:0")
        counter = iter(range(1, total + 1))
        guard = threading.Lock()

        def work() -> None:
            for _ in range(total // 8):
                with guard:
                    k = next(counter)
                progress(k, total, "shader")

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    got = lines(out)
    assert len(got) == total + 1
    assert all(ln.startswith("vkserve verify: building the Vulkan Plan on vulkan:0") for ln in got)


def test_quiet_writes_nothing() -> None:
    out = io.StringIO()
    with Progress("profile", quiet=True, stream=out, interval_s=0) as progress:
        progress.stage("building")
        progress(1, 1, "x")
        progress.done("done")
    assert out.getvalue() == ""
