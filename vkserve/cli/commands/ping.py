"""`vkserve ping`: check that the daemon answers, and how fast."""

from __future__ import annotations

import argparse

from vkserve.cli.commands._client import add_address_arguments, run_client_command
from vkserve.cli.output import print_json
from vkserve.client import Client

NAME = "ping"
HELP = "check that the daemon answers (round-trip time)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=1, metavar="N", help="pings to send (default 1)")
    parser.add_argument("--json", action="store_true",
                        help='print {"round_trip_ms": [one per ping]}')
    add_address_arguments(parser)


def main(args: argparse.Namespace) -> int:
    def body(client: Client) -> int:
        times = []
        for _ in range(max(args.count, 1)):
            times.append(client.ping() * 1e3)
            if not args.json:
                print(f"pong in {times[-1]:.3f} ms")
        if args.json:
            print_json({"round_trip_ms": [round(t, 3) for t in times]})
        return 0

    return run_client_command(NAME, args, body)
