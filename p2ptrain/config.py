"""The daemon's configuration: a TOML file validated by pydantic.

Every key has a default, so an empty or missing file is a valid config. A bad
key or value is reported in one line that names the key, the value and the
fix (``ConfigError``), never as a traceback.

Only the daemon imports this module (the CLI and TUI read and change the
config through the control protocol: ``config.get`` / ``config.set``). It is a
leaf: it imports nothing of the daemon or the peers, so both may use it.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from p2ptrain.http_endpoint import ListenError, parse_listen
from p2ptrain.multiaddr import validate_multiaddr

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW = re.compile(r"^([01]\d|2[0-4]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)$")


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


class PolicySettings(_Section):
    """The `[policy]` table of config.toml: when to lend the machine, and how much of it.

    Defaults follow BOINC: pause on battery, GPU paused while the user is
    active (input in the last 3 minutes), CPU keeps training at idle priority.
    `schedule` maps "all" or a weekday ("mon".."sun", overriding "all") to
    windows "HH:MM-HH:MM" when training may run; a window whose end is before
    its start wraps past midnight ("22:00-07:00"); an empty schedule means any
    time, an empty list for a day means never that day.
    """

    pause_on_battery: bool = True
    pause_gpu_when_user_active: bool = True
    pause_cpu_when_user_active: bool = False
    user_idle_minutes: float = Field(3.0, gt=0, description="no input for this long means the user is away")
    pause_when_gpu_busy: bool = Field(True, description="pause while another program computes on our GPU")
    gpu_busy_after_s: float = Field(10.0, ge=0, description="another program must hold the GPU this long")
    max_gpu_temperature_c: float = Field(83.0, ge=40, le=110, description="pause at or above this temperature")
    resume_gpu_temperature_c: float = Field(75.0, ge=20, le=110, description="resume at or below this one")
    schedule: dict[str, list[str]] = Field(default_factory=dict)
    max_vram_share: float = Field(0.9, gt=0, le=1, description="share of free GPU memory training may take")
    max_ram_share: float = Field(0.5, gt=0, le=1, description="share of available RAM for CPU training")
    max_cpu_threads: int | None = Field(None, ge=1, description="cap on CPU threads (unset: all cores)")
    max_compute_share: float = Field(
        1.0, gt=0, le=1, description="the most of the time training computes, like BOINC's 'use at most X % of CPU time': "
        "it rests the remainder after each step (0.5: half the heat and fan noise, half the contribution); "
        "applies at the next pause and resume")
    max_monthly_traffic_gb: float | None = Field(
        None, gt=0, description="pause training once this machine's peers sent and received this many GB "
        "this calendar month (unset: no limit); the DHT stays up, so a few KB/s go on while paused")
    min_pause_s: float = Field(60.0, ge=0, description="a pause lasts at least this long")
    resume_after_s: float = Field(30.0, ge=0, description="a reason must stay clear this long to resume")

    @field_validator("schedule")
    @classmethod
    def _check_schedule(cls, schedule: dict[str, list[str]]) -> dict[str, list[str]]:
        for day, windows in schedule.items():
            if day not in WEEKDAYS and day != "all":
                raise ValueError(f"schedule day {day!r} is unknown; use 'all' or one of {', '.join(WEEKDAYS)}")
            for window in windows:
                if not _WINDOW.match(window):
                    raise ValueError(f"schedule window {window!r} is not HH:MM-HH:MM, e.g. '18:00-08:00'")
        return schedule

    @model_validator(mode="after")
    def _resume_below_pause(self) -> PolicySettings:
        if self.resume_gpu_temperature_c >= self.max_gpu_temperature_c:
            raise ValueError(f"resume_gpu_temperature_c ({self.resume_gpu_temperature_c}) must be below "
                             f"max_gpu_temperature_c ({self.max_gpu_temperature_c}), e.g. 8 degrees lower")
        return self

    def allowed_at(self, moment: datetime) -> bool:
        """True when the schedule lets training run at `moment` (local wall-clock time)."""
        if not self.schedule:
            return True
        day = WEEKDAYS[moment.weekday()]
        windows = self.schedule.get(day, self.schedule.get("all"))
        if windows is None:
            return True
        minute = moment.hour * 60 + moment.minute
        return any(_in_window(minute, window) for window in windows)


def _in_window(minute: int, window: str) -> bool:
    match = _WINDOW.match(window)
    start = int(match.group(1)) * 60 + int(match.group(2))
    end = int(match.group(3)) * 60 + int(match.group(4))
    if start <= end:
        return start <= minute < end
    return minute >= start or minute < end  # wraps past midnight


class MetricsSettings(_Section):
    """The `[metrics]` table: the daemon's Prometheus endpoint (daemon/metrics_endpoint.py), off by default."""

    listen: str | None = Field(
        None, description='serve /metrics at this HOST:PORT, e.g. "127.0.0.1:9464" (unset or "": off); '
        "applies when the daemon starts")

    @field_validator("listen", mode="before")
    @classmethod
    def _check_listen(cls, listen: str | None) -> str | None:
        if listen is None or listen == "":
            return None
        try:
            parse_listen(str(listen))  # `config set metrics.listen 9464` arrives as a number
        except ListenError as error:
            raise ValueError(str(error)) from None
        return listen


class Config(_Section):
    """The whole ``config.toml``."""

    nickname: str = Field(default_factory=lambda: socket.gethostname()[:32], max_length=32)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    dht: DhtSettings = Field(default_factory=DhtSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)


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
