"""``python -m vkserve.devices.cpu.compile_child PARENT_PID``: the daemon's child that compiles
the CPU kernels on a first start (``scheduler.engine.compile_kernels_apart``), so numba's
compiler does not hold the daemon's GIL for minutes. It prints its ``WarmReport`` as JSON, and
exits as soon as the daemon is gone: a daemon killed mid-compilation leaves no compiler running.
(The parent is watched rather than PR_SET_PDEATHSIG used: that signal follows the thread that
started the child, one of trio's worker threads, which may end long before the daemon.)"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)  # orphaned: nobody wants the result (numba's cache files are written atomically)


def main(argv: list[str]) -> int:
    threading.Thread(target=_exit_with, args=(int(argv[0]),), daemon=True).start()
    from vkserve.devices.cpu.warm import compile_kernels  # noqa: PLC0415 (after the watcher starts)

    print(json.dumps(compile_kernels().as_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
