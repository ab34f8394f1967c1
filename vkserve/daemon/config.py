"""Daemon configuration: a TOML file (``vkserve serve --config FILE``), every key defaulted.

The embedded :data:`DEFAULT_CONFIG` is the documented default; with no ``--config`` it serves the
packaged example model repository (``vkserve/examples/``) on a Unix socket. Validation happens once at start: an unknown
key or a value of the wrong type is a :class:`ConfigError` naming the key (``server.tcp``).

The ``[scheduler]`` table is handed to ``scheduler.SchedulerConfig``; its keys are checked
against that class's fields (see :func:`scheduler_config`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from vkserve.client.framing import DEFAULT_MAX_FRAME_SIZE
from vkserve.client.paths import TcpAddress, default_socket_path
from vkserve.daemon.logs import FORMATS, LEVELS

__all__ = [
    "DEFAULT_CONFIG",
    "EXAMPLES_DIR",
    "MIN_TOKEN_LENGTH",
    "Config",
    "ConfigError",
    "CpuConfig",
    "GrpcConfig",
    "HttpConfig",
    "MetricsConfig",
    "ModelsConfig",
    "ServerConfig",
    "load_config",
    "is_loopback",
    "parse_config",
    "parse_listen",
    "scheduler_config",
]

#: The repository served when ``models.repository`` is empty: the packaged ``vkserve/examples/``.
EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
MIN_TOKEN_LENGTH = 16

#: The embedded default config: ``vkserve/daemon/vkserve.toml`` (package data; ``deploy/vkserve.toml``
#: is a link to it, so the documented file and the defaults cannot drift apart).
DEFAULT_CONFIG = (resources.files(__package__) / "vkserve.toml").read_text(encoding="utf-8")
#: ``metrics.listen`` when the file does not set it.
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"


class ConfigError(ValueError):
    """A configuration problem, one line, naming the file and key."""


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    socket: str = ""
    socket_mode: int = 0o660
    tcp: str = ""
    token: str = ""
    token_file: str = ""
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_connections: int = 256
    max_unauthenticated: int = 16
    max_unauthenticated_per_address: int = 4
    auth_failures_per_second: float = 2.0
    max_buffered_bytes: int = 256 * 1024 * 1024
    max_requests_per_connection: int = 256
    idle_timeout: float = 600.0
    auth_timeout: float = 10.0
    frame_timeout: float = 60.0
    send_timeout: float = 30.0
    drain_timeout: float = 20.0

    def socket_path(self) -> Path:
        return Path(self.socket) if self.socket else default_socket_path()

    def tcp_address(self) -> TcpAddress | None:
        """``server.tcp`` parsed (``HOST:PORT``, ``[V6]:PORT``; port 0 = any free port)."""
        if not self.tcp:
            return None
        spec = self.tcp.removeprefix("tcp://")
        host, sep, port = spec.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"cannot parse {self.tcp!r}; expected HOST:PORT (port 0..65535)")
        return TcpAddress(host, int(port))


@dataclasses.dataclass(frozen=True)
class ModelsConfig:
    repository: str = ""

    def repository_path(self, env: Mapping[str, str] | None = None) -> Path:
        """``repository``, else ``$STATE_DIRECTORY/models`` (systemd), else the packaged ``vkserve/examples/``."""
        if self.repository:
            return Path(self.repository)
        env = os.environ if env is None else env
        state = env.get("STATE_DIRECTORY", "").split(":")[0]
        return Path(state) / "models" if state else EXAMPLES_DIR


def parse_listen(value: str, what: str = "metrics listen address",
                 off: str = "off") -> tuple[str, int] | None:
    """``HOST:PORT`` (``[v6]:PORT`` too; an empty host is 127.0.0.1; port 0 = any free port)
    or ``off`` -> None."""
    if value == off:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} {value!r}: expected HOST:PORT or {off!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); any other name or address is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    listen: str = DEFAULT_METRICS_LISTEN
    #: /readyz: "all" = every model serves; "any" = at least one does (the others are warnings)
    readyz: str = "all"

    def listen_address(self) -> tuple[str, int] | None:
        return parse_listen(self.listen)


@dataclasses.dataclass(frozen=True)
class HttpConfig:
    """KServe v2 over HTTP/REST (``vkserve.daemon.kserve``): ``listen`` ``HOST:PORT``, "" = off."""

    listen: str = ""

    def listen_address(self) -> tuple[str, int] | None:
        return parse_listen(self.listen, "KServe HTTP listen address", off="")


@dataclasses.dataclass(frozen=True)
class GrpcConfig:
    """KServe v2 over gRPC (``vkserve.daemon.kserve``): ``listen`` ``HOST:PORT``, "" = off."""

    listen: str = ""

    def listen_address(self) -> tuple[str, int] | None:
        return parse_listen(self.listen, "KServe gRPC listen address", off="")


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """How the daemon logs (``vkserve.daemon.logs``): ``level`` debug|info|warning|error,
    ``format`` text|json."""

    level: str = "info"
    format: str = "text"


@dataclasses.dataclass(frozen=True)
class CpuConfig:
    """The CPU engine (``vkserve.devices.cpu.threads``): ``threads`` per job's kernels, 0 = the
    cores this process may use (affinity and cgroup quota) unless ``$VKSERVE_CPU_THREADS``
    says otherwise."""

    threads: int = 0


@dataclasses.dataclass(frozen=True)
class Config:
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    models: ModelsConfig = dataclasses.field(default_factory=ModelsConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    http: HttpConfig = dataclasses.field(default_factory=HttpConfig)
    grpc: GrpcConfig = dataclasses.field(default_factory=GrpcConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    cpu: CpuConfig = dataclasses.field(default_factory=CpuConfig)
    #: Raw ``[scheduler]`` table; checked by :func:`scheduler_config`.
    scheduler: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: str = "<embedded default>"


_SECTIONS: dict[str, type] = {"server": ServerConfig, "models": ModelsConfig,
                              "metrics": MetricsConfig, "http": HttpConfig, "grpc": GrpcConfig,
                              "log": LogConfig, "cpu": CpuConfig}


def _type_name(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


def _check_value(key: str, expected: Any, value: Any) -> Any:
    """``value`` converted to the annotated type (int -> float allowed), or ConfigError."""
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(expected)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_value(key, option, value)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {expected}, got {_type_name(value)} {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected array, got {_type_name(value)} {value!r}")
        args = typing.get_args(expected)
        item = args[0] if args else Any
        items = [_check_value(f"{key}[{i}]", item, v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected table, got {_type_name(value)} {value!r}")
        return dict(value)
    if expected is Any:
        return value
    if expected is float:
        if type(value) in (int, float):
            return float(value)
        raise ConfigError(f"{key}: expected float, got {_type_name(value)} {value!r}")
    if expected in (int, str, bool):
        if type(value) is not expected:
            raise ConfigError(f"{key}: expected {expected.__name__}, got {_type_name(value)} {value!r}")
        return value
    if isinstance(expected, type) and isinstance(value, expected):
        return value
    raise ConfigError(f"{key}: expected {getattr(expected, '__name__', expected)}, got {_type_name(value)}")


def build_dataclass(cls: type, table: Mapping[str, Any], prefix: str) -> Any:
    """An instance of dataclass ``cls`` from a TOML table: unknown keys and wrong types raise."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # unresolvable annotations: check nothing but the names
        hints = {f.name: Any for f in dataclasses.fields(cls)}
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key not in fields:
            raise ConfigError(f"{prefix}{key}: unknown key (known: {', '.join(sorted(fields))})")
        kwargs[key] = _check_value(f"{prefix}{key}", hints.get(key, Any), value)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # the class's own validation
        raise ConfigError(f"{prefix.rstrip('.')}: {exc}") from None


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key}: must be > 0, got {value!r}")


def _validate(cfg: Config, base_dir: Path | None) -> Config:
    s = cfg.server
    for name in ("max_frame_size", "max_connections", "max_unauthenticated",
                 "max_unauthenticated_per_address", "auth_failures_per_second",
                 "max_buffered_bytes", "max_requests_per_connection", "idle_timeout",
                 "auth_timeout", "frame_timeout", "send_timeout"):
        _positive(f"server.{name}", getattr(s, name))
    if s.drain_timeout < 0:
        raise ConfigError(f"server.drain_timeout: must be >= 0, got {s.drain_timeout!r}")
    if s.max_frame_size > 0xFFFFFFFF:
        raise ConfigError("server.max_frame_size: at most 4294967295 (the length field is 32 bits)")
    if s.max_buffered_bytes < s.max_frame_size:
        raise ConfigError(f"server.max_buffered_bytes: must be >= server.max_frame_size "
                          f"({s.max_frame_size}), or the largest frame could never arrive; "
                          f"got {s.max_buffered_bytes}")
    if not 0 <= s.socket_mode <= 0o777:
        raise ConfigError(f"server.socket_mode: expected permission bits like 0o660, got {s.socket_mode!r}")
    try:
        s.tcp_address()
    except ValueError as exc:
        raise ConfigError(f"server.tcp: {exc}") from None
    for name, section in (("metrics", cfg.metrics), ("http", cfg.http), ("grpc", cfg.grpc)):
        try:
            section.listen_address()
        except ValueError as exc:
            raise ConfigError(f"{name}.listen: {exc}") from None
    if cfg.metrics.readyz not in ("all", "any"):
        raise ConfigError(f"metrics.readyz: expected \"all\" or \"any\", got {cfg.metrics.readyz!r}")
    if cfg.log.level not in LEVELS:
        raise ConfigError(f"log.level: expected one of {', '.join(LEVELS)}, got {cfg.log.level!r}")
    if cfg.log.format not in FORMATS:
        raise ConfigError(f"log.format: expected one of {', '.join(FORMATS)}, got {cfg.log.format!r}")
    if cfg.cpu.threads < 0:
        raise ConfigError(f"cpu.threads: must be >= 0 (0 = the cores this process may use), got {cfg.cpu.threads}")

    def resolve(p: str) -> str:
        return str(base_dir / p) if p and base_dir is not None and not os.path.isabs(p) else p

    server = dataclasses.replace(s, socket=resolve(s.socket), token_file=resolve(s.token_file))
    models = dataclasses.replace(cfg.models, repository=resolve(cfg.models.repository))
    return dataclasses.replace(cfg, server=server, models=models)


def parse_config(text: str, source: str = "<string>", base_dir: Path | None = None) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    try:
        sections: dict[str, Any] = {}
        for name, table in data.items():
            if name not in (*_SECTIONS, "scheduler"):
                raise ConfigError(f"{name}: unknown key (known tables: server, models, metrics, "
                                  "http, grpc, log, cpu, scheduler)")
            if not isinstance(table, dict):
                raise ConfigError(f"{name}: expected a table [{name}], got {_type_name(table)}")
            sections[name] = table
        cfg = Config(
            server=build_dataclass(ServerConfig, sections.get("server", {}), "server."),
            models=build_dataclass(ModelsConfig, sections.get("models", {}), "models."),
            metrics=build_dataclass(MetricsConfig, sections.get("metrics", {}), "metrics."),
            http=build_dataclass(HttpConfig, sections.get("http", {}), "http."),
            grpc=build_dataclass(GrpcConfig, sections.get("grpc", {}), "grpc."),
            log=build_dataclass(LogConfig, sections.get("log", {}), "log."),
            cpu=build_dataclass(CpuConfig, sections.get("cpu", {}), "cpu."),
            scheduler=dict(sections.get("scheduler", {})),
            source=source,
        )
        return _validate(cfg, base_dir)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """The config in ``path``, or the embedded default for ``None``."""
    if path is None:
        return parse_config(DEFAULT_CONFIG, "<embedded default>")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config: {exc}") from None
    return parse_config(text, str(p), p.resolve().parent)


def resolve_token(server: ServerConfig, env: Mapping[str, str] | None = None, *,
                  needed_by: str = "") -> str | None:
    """The TCP token: ``token``, else the first line of ``token_file``, else ``$VKSERVE_TOKEN``.

    ``None`` when TCP is off (and ``needed_by``, another listener that needs the token, is
    empty); ConfigError when one of them is on and no usable token is set.
    """
    if not server.tcp and not needed_by:
        return None
    env = os.environ if env is None else env
    token = server.token
    if not token and server.token_file:
        try:
            token = Path(server.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"server.token_file: cannot read {server.token_file}: {exc}") from None
    token = token or env.get("VKSERVE_TOKEN", "")
    if not token:
        raise ConfigError(f"{needed_by or 'server.tcp'} is set but no token: set server.token, "
                          "server.token_file or $VKSERVE_TOKEN")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"server token: at least {MIN_TOKEN_LENGTH} characters, got {len(token)}")
    return token


def scheduler_config(table: Mapping[str, Any], config_cls: type) -> Any:
    """``config_cls`` (the scheduler's config class) built from the ``[scheduler]`` table.

    A dataclass gets the same strict key and type checks as the other tables; any other class
    is called with the table as keyword arguments (its TypeError becomes a ConfigError).
    """
    if dataclasses.is_dataclass(config_cls):
        return build_dataclass(config_cls, table, "scheduler.")
    try:
        return config_cls(**table)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"scheduler: {exc}") from None
