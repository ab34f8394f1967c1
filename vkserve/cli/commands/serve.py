"""`vkserve serve`: run the daemon (trio server on a Unix socket, optional TCP, KServe v2 HTTP
and gRPC, metrics)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TypeVar

from vkserve.daemon.config import (
    DEFAULT_CONFIG,
    ConfigError,
    GrpcConfig,
    HttpConfig,
    MetricsConfig,
    load_config,
)
from vkserve.daemon.logs import configure as configure_logging

#: a config section with a ``listen`` address
_Listener = TypeVar("_Listener", MetricsConfig, HttpConfig, GrpcConfig)

NAME = "serve"
HELP = "run the inference daemon (default: the packaged example models on a Unix socket)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config (default: the embedded one, "
                        "see --print-default-config)")
    parser.add_argument("--socket", metavar="PATH", help="Unix socket path (overrides server.socket)")
    parser.add_argument("--models", metavar="DIR", help="model repository (overrides models.repository)")
    parser.add_argument("--tcp", metavar="HOST:PORT", help="also listen on TCP (overrides server.tcp; "
                        "needs a token: server.token, server.token_file or $VKSERVE_TOKEN)")
    parser.add_argument("--metrics-listen", metavar="HOST:PORT|off",
                        help="Prometheus metrics, /healthz and /readyz (overrides metrics.listen; "
                             "default 127.0.0.1:9464; port 0 = any free port; off = none)")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="KServe v2 (Open Inference Protocol) over HTTP (overrides http.listen; "
                             "a non-loopback address needs the server token)")
    parser.add_argument("--grpc", metavar="HOST:PORT",
                        help="KServe v2 (Open Inference Protocol) over gRPC (overrides grpc.listen; "
                             "a non-loopback address needs the server token)")
    parser.add_argument("--log-format", choices=("text", "json"),
                        help="log lines on stderr as text or JSON objects (overrides log.format)")
    parser.add_argument("-v", "--verbose", action="store_true", dest="serve_verbose",
                        help="log at DEBUG level (overrides log.level)")
    parser.add_argument("--print-default-config", action="store_true",
                        help="print the embedded default config and exit")


def _listening(section: _Listener, listen: str | None) -> _Listener:
    """``section`` with the flag's ``listen`` address (checked: ValueError names it), or as
    the config has it when the flag is absent."""
    if listen is None:
        return section
    section = dataclasses.replace(section, listen=listen)
    section.listen_address()
    return section


def main(args: argparse.Namespace) -> int:
    if args.print_default_config:
        print(DEFAULT_CONFIG, end="")
        return 0
    try:
        config = load_config(args.config)
        server = config.server
        if args.socket is not None:
            server = dataclasses.replace(server, socket=args.socket)
        if args.tcp is not None:
            server = dataclasses.replace(server, tcp=args.tcp)
            server.tcp_address()
        models = config.models
        if args.models is not None:
            models = dataclasses.replace(models, repository=args.models)
        metrics = _listening(config.metrics, args.metrics_listen)
        http = _listening(config.http, args.http)
        grpc = _listening(config.grpc, args.grpc)
        log = config.log
        if args.log_format is not None:
            log = dataclasses.replace(log, format=args.log_format)
        if args.serve_verbose or args.verbose:  # `vkserve -v serve` or `vkserve serve -v`
            log = dataclasses.replace(log, level="debug")
        config = dataclasses.replace(config, server=server, models=models, metrics=metrics,
                                     http=http, grpc=grpc, log=log)
    except (ConfigError, ValueError) as exc:
        print(f"vkserve serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log.level, config.log.format)
    from vkserve.daemon.server import run_daemon  # noqa: PLC0415 (trio and the scheduler only here)

    return run_daemon(config)
