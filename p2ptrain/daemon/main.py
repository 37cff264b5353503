"""``p2ptrain daemon``: set up logging, config, lock and database, then serve until SIGTERM."""

from __future__ import annotations

import asyncio
import fcntl
import grp
import logging
import os
import signal
import sys

from p2ptrain.config import Config, ConfigError, load_config
from p2ptrain.daemon.methods import ControlMethods
from p2ptrain.daemon.metrics_endpoint import serve_metrics
from p2ptrain.daemon.notify import SystemdNotifier
from p2ptrain.daemon.server import ControlServer
from p2ptrain.daemon.supervisor import Daemon
from p2ptrain.daemon.temp_files import give_back_temp_dir, take_temp_dir
from p2ptrain.daemon.worker_process import reap_leftover_groups
from p2ptrain.http_endpoint import ListenError, bound_address
from p2ptrain.paths import Paths, resolve_paths
from p2ptrain.storage import Database, SchemaTooNewError, StorageError
from p2ptrain.storage.retention import RetentionLimits, RetentionThread

log = logging.getLogger("p2ptrain.daemon")
SOCKET_GROUP = "p2ptrain"


def _setup_logging(level: str) -> None:
    # journald adds its own timestamps; a terminal user wants them.
    timestamps = "" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s "
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=f"{timestamps}%(levelname)s %(name)s: %(message)s")


def _fail(message: str) -> int:
    print(f"p2ptrain daemon: {message}", file=sys.stderr)
    return 1


def _take_lock(paths: Paths):
    """An exclusive lock on the state directory: one daemon per home."""
    lock_file = open(paths.state_dir / "daemon.lock", "a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.close()
        return None
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(f"{os.getpid()}\n")
    lock_file.flush()
    return lock_file


def run_daemon(home: str | None = None, log_level: str | None = None) -> int:
    """Run the daemon in the foreground; returns the process exit code.

    Args:
        home: put everything under this directory (``--home``), or None for the standard places.
        log_level: overrides the config's ``log_level``.
    """
    paths = resolve_paths(home)
    try:
        config = load_config(paths.config_file)
    except ConfigError as error:
        return _fail(str(error))
    _setup_logging(log_level or config.log_level)
    try:
        paths.create()
    except OSError as error:
        return _fail(f"cannot create {error.filename}: {error.strerror}; check the permissions of its parent, or pass --home DIR")
    lock = _take_lock(paths)
    if lock is None:
        return _fail(f"another p2ptrain daemon already runs with {paths.state_dir}; stop it first (or use another --home)")
    reap_leftover_groups(paths.state_dir)
    take_temp_dir(paths)  # after the leftover groups: their files go with them
    try:
        database = Database.open(paths.database, flush_interval_s=config.storage.flush_interval_s)
    except (StorageError, SchemaTooNewError) as error:
        give_back_temp_dir(paths)
        return _fail(str(error))
    try:
        return asyncio.run(_serve(paths, config, database))
    finally:
        give_back_temp_dir(paths)
        lock.close()


def _socket_group(paths: Paths) -> str | None:
    if not paths.system:
        return None
    try:
        grp.getgrnam(SOCKET_GROUP)
    except KeyError:
        log.warning("group %r does not exist; the control socket is for root only (run systemd-sysusers)", SOCKET_GROUP)
        return None
    return SOCKET_GROUP


async def _serve(paths: Paths, config: Config, database: Database) -> int:
    notifier = SystemdNotifier.from_environment()
    daemon = Daemon(paths, config, database, notifier)
    methods = ControlMethods(daemon.status, daemon.control, daemon.run, database, daemon.config, daemon.events)
    server = ControlServer(paths.socket, methods.handlers(), daemon.broadcaster, group=_socket_group(paths))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, daemon.request_stop)
    try:
        await server.start()
    except OSError as error:
        database.close()
        return _fail(f"cannot listen on {paths.socket}: {error.strerror}; check that directory's permissions")
    metrics = None
    if config.metrics.listen:
        try:
            metrics = await serve_metrics(config.metrics.listen, lambda: daemon.status().to_dict(), methods.peers)
        except ListenError as error:
            await server.stop()
            database.close()
            return _fail(f"{error}; change listen under [metrics] in {paths.config_file}, or remove it to turn /metrics off")
        log.info("serving /metrics on http://%s/metrics", bound_address(metrics))
    paths.daemon_pid_file.write_text(f"{os.getpid()}\n")
    # retention reads the storage settings before each pass: `config set storage.*` applies at the next one
    retention = RetentionThread(paths.database, lambda: RetentionLimits(daemon.config.config.storage.keep_steps_days, daemon.config.config.storage.keep_events))
    retention.start()
    try:
        await daemon.start()
        notifier.ready(daemon.one_line_status())
        log.info("p2ptrain daemon ready (home %s)", paths.home or paths.state_dir)
        await daemon.run_forever()
    finally:
        await server.stop()
        if metrics is not None:
            metrics.close()
        retention.stop()
        await daemon.shutdown()
        paths.daemon_pid_file.unlink(missing_ok=True)
    return 0
