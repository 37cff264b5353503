"""Fixtures shared by all tests: real daemons under temporary homes, always cleaned up."""

from __future__ import annotations

import os
import tempfile
import time
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


# the lines of a daemon's log a failed test's report shows: what went wrong in its rounds and workers
_TELLING = ("WARNING", "ERROR", "Traceback", "averaging failed", "Averaging failed", "Outer averaging", "Error")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """When a test that drove daemons fails, keep their logs (workers' included) where the run can
    be read afterwards, ``$P2PTRAIN_TEST_LOGS`` or ``<tmp>/p2ptrain-test-logs``, and show each one's
    telling lines in the report: a failure once in many runs is read from these, not rerun."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    running = _daemons_of(item.funcargs.values())
    if not running:
        return
    kept = Path(os.environ.get("P2PTRAIN_TEST_LOGS") or Path(tempfile.gettempdir()) / "p2ptrain-test-logs")
    kept = kept / f"{item.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    kept.mkdir(parents=True, exist_ok=True)
    lines = [f"daemon logs kept in {kept}"]
    for daemon in running:
        text = daemon.log()
        (kept / f"{daemon.home.name}.log").write_text(text)
        telling = [line for line in text.splitlines() if any(mark in line for mark in _TELLING)]
        lines += [f"--- {daemon.home.name}: {len(telling)} telling lines, the last 40:", *telling[-40:]]
    report.sections.append(("daemon logs", "\n".join(lines)))


def _daemons_of(values) -> list[DaemonProcess]:
    """The daemons among a test's fixture values (a fixture may hand a dict or a list of them)."""
    found = []
    for value in values:
        if isinstance(value, DaemonProcess):
            found.append(value)
        elif isinstance(value, dict):
            found += _daemons_of(value.values())
        elif isinstance(value, (list, tuple)):
            found += _daemons_of(value)
        elif isinstance(getattr(value, "all", None), list):  # the ``daemons`` fixture's factory
            found += _daemons_of(value.all)
    return list({id(daemon): daemon for daemon in found}.values())
