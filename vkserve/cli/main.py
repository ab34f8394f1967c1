"""The `vkserve` console script: one subcommand per module in `vkserve.cli.commands`.

Each command module defines `NAME`, `HELP`, `add_arguments(parser)` and
`main(args) -> int` (the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from vkserve import __version__
from vkserve.devices.errors import JitUnavailable

COMMANDS = ["devices", "layers", "cache", "run", "verify", "serve", "infer", "models", "status", "ping",
            "bench", "profile", "tune"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vkserve", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.add_argument("--version", action="version", version=f"vkserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"vkserve.cli.commands.{name.replace('-', '_')}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_main=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except JitUnavailable as exc:  # every command needs the engines' modules
        print(f"vkserve: {exc}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args._main(args) or 0)
    except BrokenPipeError:
        # the reader went away (`vkserve ... | head`): no traceback, and no second error when
        # Python flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
