"""`vkserve status`: devices with health, queue depths, jobs in flight, models per device."""

from __future__ import annotations

import argparse
from typing import Any

from vkserve.cli.commands._client import add_address_arguments, print_tree, run_client_command
from vkserve.cli.output import print_json
from vkserve.client import Client

NAME = "status"
HELP = "show the daemon's devices, health, queues, jobs in flight and models"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON status")
    add_address_arguments(parser)


def _yes(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else str(value)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def format_status(status: dict[str, Any]) -> str:
    """A summary of the status map; anything it does not know is left to ``--json``."""
    lines: list[str] = []
    server = status.get("server", {})
    if isinstance(server, dict) and server:
        lines.append(f"daemon      vkserve {server.get('version', '?')}, pid {server.get('pid', '?')}, "
                     f"up {server.get('uptime_seconds', 0):.0f} s, scheduler {status.get('state', '?')}, "
                     f"ready {_yes(status.get('ready'))}{', draining' if server.get('draining') else ''}")
        lines.append(f"listening   {', '.join(server.get('listening', []))}")
        lines.append(f"clients     {server.get('connections', 0)} connected "
                     f"({server.get('connections_total', 0)} since start), "
                     f"{server.get('infer_in_flight', 0)} infer request(s) in flight")
    problem = status.get("gpu_problem")
    if isinstance(problem, dict):
        nodes = ", ".join(map(str, problem.get("nodes", []))) or "?"
        lines.append(f"GPU         UNUSABLE: device node(s) {nodes}, but no Vulkan GPU "
                     f"({problem.get('reason', '?')}): {problem.get('detail', '')}")
    devices = status.get("devices")
    if isinstance(devices, list) and devices:
        rows = [["device", "name", "kind", "healthy", "queued", "running", "runs", "models"]]
        for d in devices:
            if not isinstance(d, dict):
                continue
            healthy = _yes(d.get("healthy"))
            if d.get("fault"):
                healthy += f" ({d['fault']})"
            rows.append([str(d.get("device", "?")), str(d.get("name", "?")), str(d.get("kind", "?")),
                         healthy, str(d.get("queue_depth", 0)), str(d.get("in_flight", 0)),
                         str(d.get("runs", 0)), ", ".join(map(str, d.get("models", []))) or "-"])
        lines.append("devices")
        lines += _table(rows)
    models = status.get("models")
    if isinstance(models, dict) and models:
        rows = [["model", "state", "queued", "running"]]
        for name, m in models.items():
            if isinstance(m, dict):
                rows.append([str(name), str(m.get("state", "?")), str(m.get("queue_depth", 0)),
                             str(m.get("in_flight", 0))])
        lines.append("models")
        lines += _table(rows)
    totals = status.get("totals")
    if isinstance(totals, dict) and totals:
        lines.append("jobs        " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in totals.items()))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    def body(client: Client) -> int:
        status = client.status()
        if args.json:
            print_json(status, indent=2)
            return 0
        text = format_status(status)
        if text:
            print(text)
        if args.verbose or not text:
            print_tree(status)
        return 0

    return run_client_command(NAME, args, body)
