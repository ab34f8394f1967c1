"""`vkserve status`: devices with health, queue depths, jobs in flight, models per device."""

from __future__ import annotations

import argparse
import json

from client import Client
from daemon.commands._client import add_address_arguments, print_tree, run_client_command

NAME = "status"
HELP = "show the daemon's devices, health, queues, jobs in flight and models"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON status")
    add_address_arguments(parser)


def main(args: argparse.Namespace) -> int:
    def body(client: Client) -> int:
        status = client.status()
        if args.json:
            print(json.dumps(status, indent=2, default=str))
        else:
            print_tree(status)
        return 0

    return run_client_command(NAME, args, body)
