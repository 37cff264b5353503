"""The daemon's configuration: a TOML file validated by pydantic.

Every key has a default, so an empty or missing file is a valid config. A bad
key or value is reported in one line that names the key, the value and the
fix (``ConfigError``), never as a traceback.

Only the daemon imports this module (the CLI and TUI read and change the
config through the control protocol: ``config.get`` / ``config.set``).
"""

from __future__ import annotations

import os
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from p2ptrain.daemon.policies import PolicySettings
from p2ptrain.peers.dht import validate_multiaddr

def _check_multiaddrs(values: list[str]) -> list[str]:
    return [validate_multiaddr(value) for value in values]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DhtSettings(_Section):
    """How this peer joins the hivemind DHT."""

    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/31337"],
        description="addresses to listen on; open this TCP port in your router to be directly reachable",
    )
    announce_maddrs: list[str] = Field(
        default_factory=list, description="public addresses to announce when behind NAT with a forwarded port"
    )
    initial_peers: list[str] = Field(
        default_factory=list, description="bootstrap peers used when a join gives none"
    )
    use_relay: bool = True
    use_auto_relay: bool = True
    client_mode: bool = False
    start_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="seconds to wait for the DHT to start and reach a bootstrap peer; raise it on a slow or loaded machine"
    )

    _check = field_validator("host_maddrs", "announce_maddrs", "initial_peers")(_check_multiaddrs)


class TrainingSettings(_Section):
    """What the training worker does on this machine."""

    gpus: Literal["all"] | list[int] = "all"
    checkpoint_interval_s: float = Field(600.0, gt=0, description="seconds between checkpoints while training")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    uplink_mbit_s: float | None = Field(
        None, gt=0, description="this machine's upload bandwidth in Mbit/s: picks the compression rung (unset: the run's top rung)"
    )


class StorageSettings(_Section):
    flush_interval_s: float = Field(2.0, gt=0, le=60)
    keep_steps_days: float = Field(30.0, gt=0)
    keep_events: int = Field(100_000, gt=0)


class Config(_Section):
    """The whole ``config.toml``."""

    nickname: str = Field(default_factory=lambda: socket.gethostname()[:32], max_length=32)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    dht: DhtSettings = Field(default_factory=DhtSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)


class ConfigError(ValueError):
    """A config file or value the daemon cannot use; ``str()`` is the one-line message with the fix."""


def _describe(error: ValidationError, source: str) -> ConfigError:
    first = error.errors()[0]
    # A union type adds its member's name (e.g. "literal['all']") to the location; the user knows only the key.
    key = ".".join(part for part in first["loc"] if isinstance(part, str) and part.isidentifier()) or "(top level)"
    if first["type"] == "extra_forbidden":
        return ConfigError(f"{source}: unknown key {key!r}; remove it or check its spelling (p2ptrain config show lists the keys)")
    value = first.get("input")
    message = first["msg"].removeprefix("Value error, ")
    return ConfigError(f"{source}: {key} = {value!r}: {message}; fix it in {source} or with p2ptrain config set {key} VALUE")


def load_config(path: Path) -> Config:
    """Read and validate the config file; a missing file gives the defaults.

    Raises:
        ConfigError: the file is not TOML, or a key or value is wrong.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config()
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}; check its permissions") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path} is not UTF-8 text (byte {error.start}); save it as UTF-8 or delete it to use defaults") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML ({error}); fix the line or delete the file to use defaults") from None
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        raise _describe(error, str(path)) from None


def config_as_dict(config: Config) -> dict[str, Any]:
    return config.model_dump(mode="json")


def parse_value(text: str) -> Any:
    """A CLI value: a TOML literal when it is one (``true``, ``600``, ``["a", "b"]``), else the plain string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def with_value(config: Config, key: str, value: Any) -> Config:
    """A copy of ``config`` with the dotted ``key`` set to ``value``, validated.

    Raises:
        ConfigError: unknown key or invalid value.
    """
    data = config_as_dict(config)
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            raise ConfigError(f"unknown config key {key!r}; p2ptrain config show lists the keys")
        node = node[part]
    if parts[-1] not in node:
        raise ConfigError(f"unknown config key {key!r}; p2ptrain config show lists the keys")
    node[parts[-1]] = parse_value(value) if isinstance(value, str) else value
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        raise _describe(error, "config") from None


def save_config(config: Config, path: Path) -> None:
    """Write the config atomically (temp file + rename), only the keys that differ from the defaults."""
    data = config.model_dump(mode="json", exclude_defaults=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(tomli_w.dumps(data), encoding="utf-8")
    os.replace(temporary, path)
