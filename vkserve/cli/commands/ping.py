"""`vkserve ping`: check that the daemon answers, and how fast."""

from __future__ import annotations

import argparse

from vkserve.cli.commands._client import add_address_arguments, run_client_command
from vkserve.client import Client

NAME = "ping"
HELP = "check that the daemon answers (round-trip time)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=1, metavar="N", help="pings to send (default 1)")
    add_address_arguments(parser)


def main(args: argparse.Namespace) -> int:
    def body(client: Client) -> int:
        for _ in range(max(args.count, 1)):
            print(f"pong in {client.ping() * 1e3:.3f} ms")
        return 0

    return run_client_command(NAME, args, body)
