"""Shared by the client commands (infer, models, status, ping, bench): address options and how a
failure is reported."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from vkserve.cli.output import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, fail, wants_json
from vkserve.client import Client, ClientError, ServerError
from vkserve.client.paths import UnsafeSocketFolder

__all__ = ["add_address_arguments", "connect", "run_client_command"]


def add_address_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--socket", metavar="PATH",
                       help="daemon's Unix socket (default: $VKSERVE_SOCKET, then the usual places)")
    where.add_argument("--tcp", metavar="HOST:PORT", help="connect over TCP (needs --token)")
    parser.add_argument("--token", metavar="TOKEN",
                        help="TCP token (default: $VKSERVE_TOKEN)")


def connect(args: argparse.Namespace) -> Client:
    if args.tcp:
        address = args.tcp if args.tcp.startswith("tcp://") else f"tcp://{args.tcp}"
        token = args.token or os.environ.get("VKSERVE_TOKEN")
        return Client.connect(address, token=token)
    return Client.connect(f"unix:{args.socket}" if args.socket else None)


def run_client_command(name: str, args: argparse.Namespace, body: Callable[[Client], int]) -> int:
    """Connect, run ``body``, report a failure (`vkserve.cli.output.fail`) with its exit
    status: 1 the daemon answered an error, 2 usage, 3 no daemon at the address."""
    as_json = wants_json(args)
    try:
        with connect(args) as client:
            return body(client)
    except ServerError as exc:
        return fail(name, as_json, EXIT_FAILED, str(exc.code), exc.message)
    except UnsafeSocketFolder as exc:
        return fail(name, as_json, EXIT_FAILED, "UNSAFE_SOCKET_FOLDER", str(exc))
    except (ClientError, OSError) as exc:
        where = args.tcp or args.socket or "the default socket"
        return fail(name, as_json, EXIT_UNREACHABLE, "UNREACHABLE",
                    f"cannot talk to the daemon at {where}: {exc}")
    except ValueError as exc:
        return fail(name, as_json, EXIT_USAGE, "USAGE", str(exc))


def print_tree(obj: Any, indent: int = 0) -> None:
    """Nested maps and lists as indented ``key: value`` lines."""
    pad = "  " * indent
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, (dict, list)) and value and not _is_flat_list(value):
                print(f"{pad}{key}:")
                print_tree(value, indent + 1)
            else:
                print(f"{pad}{key}: {_scalar(value)}")
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, (dict, list)) and not _is_flat_list(item):
                print(f"{pad}-")
                print_tree(item, indent + 1)
            else:
                print(f"{pad}- {_scalar(item)}")
    else:
        print(f"{pad}{_scalar(obj)}")


def _is_flat_list(value: Any) -> bool:
    return isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value)


def _scalar(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)
