"""Fixtures shared by all tests: real daemons under temporary homes, always cleaned up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemons import DaemonProcess, start_daemon, stop_all, write_local_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a worker-state move the table lacks raises (daemon/worker_state.py), in the tests and the daemons they start
os.environ.setdefault("P2PTRAIN_STRICT_STATES", "1")


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left():
    """Removes, after the run, the torch shared-memory files (``/dev/shm/torch_<pid>_*``) that the
    run's ended processes left: hivemind peers that tests start straight, not through a daemon
    (which removes its workers' own), share tensors through them, and /dev/shm is RAM. A file
    still mapped by a live process stays (this one holds tensors its ended children made, and
    torch unlinks those itself at exit: a file removed under it aborts the interpreter)."""
    from p2ptrain.daemon.temp_files import SHARED_MEMORY

    def names() -> set[str]:
        try:
            return {name for name in os.listdir(SHARED_MEMORY) if name.startswith("torch_")}
        except OSError:
            return set()

    before = names()
    yield
    for name in names() - before - _mapped_shared_memory():
        pid = name.split("_")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            (SHARED_MEMORY / name).unlink(missing_ok=True)


def _mapped_shared_memory() -> set[str]:
    """The names of the /dev/shm files that live processes have mapped."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            lines = maps.read_text().splitlines()
        except OSError:
            continue
        mapped.update(line.rsplit("/dev/shm/", 1)[1].split()[0] for line in lines if "/dev/shm/torch_" in line)
    return mapped


def pytest_collection_modifyitems(items):
    """Real swarms on 2 shared cores miss averaging deadlines now and then: a swarm test gets one
    more try (pytest-rerunfailures); failing twice fails the run."""
    for item in items:
        if item.get_closest_marker("swarm"):
            item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=5))


@pytest.fixture
def meter():
    """p2ptrain's traffic meter, installed in this process: DHT peers started afterwards count their bytes."""
    from metered_peers import installed_meter  # imports hivemind: only for the tests that ask

    return installed_meter()


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
    stop_all(started, timeout=20)
