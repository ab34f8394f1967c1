"""What every command shares on its way out: the exit statuses, JSON on stdout, one way to
report a failure (a line on stderr and, with ``--json``, an error object on stdout)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "CommandFailed",
           "fail", "print_json", "wants_json"]

#: Exit statuses of every command (README, "The command line").
EXIT_OK = 0
EXIT_FAILED = 1  # the operation failed: verify not ok, the daemon answered an error, ...
EXIT_USAGE = 2  # the command line or its inputs are wrong
EXIT_UNREACHABLE = 3  # no daemon answers at the address (no socket, refused, connection lost)

#: Error codes whose stderr line needs no code (the message says it all).
_PLAIN_CODES = frozenset({"USAGE", "FAILED"})


class CommandFailed(Exception):
    """Raised by a command to end with ``status``; `vkserve.cli.main` reports it with `fail`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    @classmethod
    def usage(cls, message: str) -> CommandFailed:
        return cls(EXIT_USAGE, "USAGE", message)


def wants_json(args: argparse.Namespace) -> bool:
    """Whether the command prints JSON on stdout (``--json`` given)."""
    return vars(args).get("json") is True


def print_json(obj: Any, *, indent: int | None = None) -> None:
    """One JSON document on stdout (what ``--json`` prints, success or failure)."""
    print(json.dumps(obj, indent=indent, default=str))


def fail(command: str, as_json: bool, status: int, code: str, message: str) -> int:
    """Report a failure: one line on stderr, with ``as_json`` also
    ``{"error": {"code", "message"}, "exit_status"}`` on stdout; returns ``status``."""
    prefix = "" if code in _PLAIN_CODES else f"{code}: "
    print(f"vkserve {command}: {prefix}{message}", file=sys.stderr)
    if as_json:
        print_json({"error": {"code": code, "message": message}, "exit_status": status})
    return status
