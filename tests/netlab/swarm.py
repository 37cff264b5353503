"""Real p2ptrain daemons on the lab's hosts: each runs inside its host's namespace, driven through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from daemons import DaemonProcess, cli, start_daemon


def lab_config(home: Path, nickname: str) -> None:
    """A volunteer's config: the default DHT settings (port 31337 on every interface, relays on),
    a fast database flush and one torch thread (several peers share this machine's cores)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'nickname = "{nickname}"\n[storage]\nflush_interval_s = 0.5\n[policy]\nmax_cpu_threads = 1\n')


def start_on(host, root: Path, env: dict | None = None) -> DaemonProcess:
    """``p2ptrain daemon`` on ``host`` (inside its namespace), home ``root/<host name>``, with ``env``
    added to its environment."""
    home = root / host.name
    lab_config(home, host.name)
    daemon = start_daemon(home, env=env, prefix=tuple(host.command([])))
    daemon.host = host
    return daemon


def run_cli(daemon: DaemonProcess, *args: str, timeout: float = 120):
    """The CLI against ``daemon``, run inside its host's namespace (as its user would)."""
    return cli(daemon.home, *args, timeout=timeout, prefix=tuple(daemon.host.command([])))


def events(daemon: DaemonProcess, kind: str | None = None) -> list[dict]:
    found = json.loads(cli(daemon.home, "events", "--json", "--limit", "2000").stdout)["events"]
    return [event for event in found if kind is None or event["kind"] == kind]
