"""The `vkserve` command line (one module a subcommand in `vkserve.cli.commands`).

Each command module defines `NAME`, `HELP`, `add_arguments(parser)` and
`main(args) -> int` (the exit status); a command may also raise `CommandFailed`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from vkserve import __version__
from vkserve.cli.output import EXIT_FAILED, EXIT_USAGE, CommandFailed, fail, print_json, wants_json
from vkserve.devices.errors import JitUnavailable

COMMANDS = ["devices", "layers", "cache", "run", "verify", "serve", "infer", "models", "status", "ping",
            "bench", "profile", "tune", "import_model"]

DESCRIPTION = ("vkserve: an inference daemon for ncnn models on Vulkan GPUs and the CPU, and "
               "the tools around it (run, verify, profile and tune models; talk to the daemon)")
EPILOG = ("Devices are named cpu, vulkan:0, vulkan:1, ... (a plain N means vulkan:N). Exit "
          "status: 0 ok, 1 the operation failed, 2 usage error, 3 no daemon at the address. "
          "--json prints one JSON document on stdout, failures included; progress goes to "
          "stderr.")


class _UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    """Raises instead of exiting, so that `main` can answer a bad command line in JSON too."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vkserve", description=DESCRIPTION, epilog=EPILOG)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
        if "--json" in argv:
            print_json({"error": {"code": "USAGE", "message": exc.message}, "exit_status": EXIT_USAGE})
        return EXIT_USAGE
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args._main(args) or 0)
    except CommandFailed as exc:
        return fail(args.command, wants_json(args), exc.status, exc.code, exc.message)
    except BrokenPipeError:
        # the reader went away (`vkserve ... | head`): no traceback, and no second error when
        # Python flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
