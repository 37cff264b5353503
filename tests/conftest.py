"""Fixtures shared by all tests: real daemons under temporary homes, always cleaned up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemons import DaemonProcess, start_daemon, write_local_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def short_tmp(tmp_path_factory) -> Path:
    """A temporary directory; pytest's may be deep, which exercises the long-socket-path fallback too."""
    return tmp_path_factory.mktemp("p2p")


@pytest.fixture
def daemons(short_tmp):
    """Start daemons with ``daemons.start(name)``; every one (and its worker group) is killed at the end."""
    started: list[DaemonProcess] = []

    class Factory:
        def start(self, name: str = "a", configure: bool = True, **kwargs) -> DaemonProcess:
            home = short_tmp / name
            if configure and not (home / "config.toml").exists():
                write_local_config(home)
            daemon = start_daemon(home, **kwargs)
            started.append(daemon)
            return daemon

        @property
        def all(self) -> list[DaemonProcess]:
            return started

    yield Factory()
    for daemon in started:
        daemon.terminate(timeout=20)
        daemon.kill()
