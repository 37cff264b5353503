"""Where p2ptrain keeps its config, state, cache, socket and logs.

Three layouts:

- ``--home DIR`` (or ``P2PTRAIN_HOME``): everything under DIR, so several
  daemons can run side by side (tests, ``p2ptrain demo``);
- the system service (``P2PTRAIN_SYSTEM=1``, set by the unit):
  ``/etc/p2ptrain``, ``/var/lib/p2ptrain``, ``/var/cache/p2ptrain``,
  ``/run/p2ptrain``, or the directories systemd passes in
  ``STATE_DIRECTORY`` and friends;
- a user daemon: the XDG directories (platformdirs).

Standard library only at import time: the CLI resolves paths on every call.
"""

from __future__ import annotations

import os
from pathlib import Path

# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
SOCKET_NAME = "control.sock"


class Paths:
    """The directories of one p2ptrain installation (one daemon).

    A plain class, not a dataclass: ``dataclasses`` costs the CLI ~10 ms to import.
    """

    __slots__ = ("home", "config_file", "state_dir", "cache_dir", "runtime_dir", "log_dir", "system")

    def __init__(self, home: Path | None, config_file: Path, state_dir: Path, cache_dir: Path, runtime_dir: Path, log_dir: Path, system: bool = False):
        self.home = home
        self.config_file = config_file
        self.state_dir = state_dir
        self.cache_dir = cache_dir
        self.runtime_dir = runtime_dir
        self.log_dir = log_dir
        self.system = system

    def __repr__(self) -> str:
        return f"Paths(home={self.home}, state_dir={self.state_dir}, runtime_dir={self.runtime_dir})"

    @property
    def database(self) -> Path:
        return self.state_dir / "p2ptrain.db"

    @property
    def socket(self) -> Path:
        return self.runtime_dir / SOCKET_NAME

    @property
    def checkpoints_dir(self) -> Path:
        return self.state_dir / "checkpoints"

    @property
    def identity_key(self) -> Path:
        return self.state_dir / "identity.key"

    @property
    def worker_pgid_file(self) -> Path:
        return self.state_dir / "worker.pgid"

    @property
    def daemon_pid_file(self) -> Path:
        return self.runtime_dir / "daemon.pid"

    def home_option(self) -> str:
        """The ``--home`` option that reaches this installation from the CLI ('' if none)."""
        return f" --home {self.home}" if self.home else ""

    def create(self) -> None:
        """Create the directories the daemon writes to (private to its user, or group-readable for the system service)."""
        mode = 0o750 if self.system else 0o700
        for directory in (self.state_dir, self.cache_dir, self.runtime_dir, self.log_dir, self.checkpoints_dir):
            directory.mkdir(parents=True, exist_ok=True, mode=mode)
        if self.home is not None and self.runtime_dir.parent != self.home:
            (self.home / "run-dir").write_text(str(self.runtime_dir) + "\n")


def _home_runtime_dir(home: Path) -> Path:
    """``home/run``, or a short directory under /tmp when the socket path would be too long for AF_UNIX."""
    runtime = home / "run"
    if len(os.fsencode(runtime / SOCKET_NAME)) <= MAX_SOCKET_PATH_BYTES:
        return runtime
    import hashlib

    digest = hashlib.sha256(os.fsencode(home)).hexdigest()[:16]
    return Path("/tmp") / f"p2ptrain-{digest}"


def _system_dir(env_name: str, default: str) -> Path:
    # systemd passes colon-separated lists in StateDirectory= and friends.
    value = os.environ.get(env_name)
    return Path(value.split(":")[0]) if value else Path(default)


def resolve_paths(home: str | os.PathLike | None = None, system: bool | None = None) -> Paths:
    """Resolve the directories for one daemon.

    Args:
        home: a directory that holds everything (``--home``); falls back to
            ``P2PTRAIN_HOME``.
        system: use the system service's directories; falls back to
            ``P2PTRAIN_SYSTEM=1`` in the environment.
    """
    home = home or os.environ.get("P2PTRAIN_HOME") or None
    if home:
        root = Path(home).expanduser().absolute()
        return Paths(
            home=root,
            config_file=root / "config.toml",
            state_dir=root / "state",
            cache_dir=root / "cache",
            runtime_dir=_home_runtime_dir(root),
            log_dir=root / "log",
        )
    if system is None:
        system = os.environ.get("P2PTRAIN_SYSTEM") == "1"
    if system:
        configuration = _system_dir("CONFIGURATION_DIRECTORY", "/etc/p2ptrain")
        state = _system_dir("STATE_DIRECTORY", "/var/lib/p2ptrain")
        return Paths(
            home=None,
            config_file=configuration / "config.toml",
            state_dir=state,
            cache_dir=_system_dir("CACHE_DIRECTORY", "/var/cache/p2ptrain"),
            runtime_dir=_system_dir("RUNTIME_DIRECTORY", "/run/p2ptrain"),
            log_dir=_system_dir("LOGS_DIRECTORY", str(state / "log")),
            system=True,
        )
    import platformdirs

    return Paths(
        home=None,
        config_file=Path(platformdirs.user_config_dir("p2ptrain")) / "config.toml",
        state_dir=Path(platformdirs.user_state_dir("p2ptrain")),
        cache_dir=Path(platformdirs.user_cache_dir("p2ptrain")),
        runtime_dir=_user_runtime_dir(),
        log_dir=Path(platformdirs.user_log_dir("p2ptrain")),
    )


def _user_runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        return Path(base) / "p2ptrain"
    run_user = Path(f"/run/user/{os.getuid()}")
    return run_user / "p2ptrain" if run_user.is_dir() else Path(f"/tmp/p2ptrain-{os.getuid()}")


def control_socket(home: str | os.PathLike | None = None) -> Path:
    """The socket a client should talk to, without importing platformdirs (the CLI's hot path).

    With a home (``--home`` or ``P2PTRAIN_HOME``) it is that home's socket; else
    the user daemon's if one is listening there, else the system service's.
    """
    home = home or os.environ.get("P2PTRAIN_HOME") or None
    if home:
        return resolve_paths(home).socket
    system_socket = _system_dir("RUNTIME_DIRECTORY", "/run/p2ptrain") / SOCKET_NAME
    if os.environ.get("P2PTRAIN_SYSTEM") == "1":
        return system_socket
    user_socket = _user_runtime_dir() / SOCKET_NAME
    if not user_socket.exists() and system_socket.exists():
        return system_socket
    return user_socket
