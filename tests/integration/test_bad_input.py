"""The bad-input catalogue (docs/bad-input.md), run as a user meets it.

Every case goes through the real ``p2ptrain`` CLI or the real control socket
of one real daemon shared by the module, and must end in a short error that
names the fix, with no traceback, the daemon still answering ``status`` and
its config file untouched. Bad configs, homes and databases are given to a
fresh ``p2ptrain daemon``, which must refuse to start in one line and leave
the bad file as it was. Cases already pinned elsewhere are listed in the doc
with the test that pins them.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from daemons import cli, raw_exchange, start_daemon, write_local_config
from p2ptrain.paths import resolve_paths
from p2ptrain.storage import SCHEMA_VERSION, Database

pytestmark = pytest.mark.timeout(120)

EXIT_USAGE, EXIT_ERROR, EXIT_NO_DAEMON = 2, 1, 3


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """One idle daemon for every case of the module; cases must leave it idle."""
    home = tmp_path_factory.mktemp("bad-input") / "home"
    write_local_config(home)
    started = start_daemon(home)
    yield started
    started.terminate(timeout=20)
    started.kill()


def assert_short_error(result: subprocess.CompletedProcess, code: int, fix: str, max_lines: int = 1) -> str:
    """The command failed with ``code``, said so in at most ``max_lines`` lines on stderr, naming ``fix``."""
    message = result.stderr.strip()
    assert result.returncode == code, f"exit {result.returncode}, stderr: {message}"
    assert "Traceback" not in result.stdout + result.stderr
    assert message, "no error message at all"
    assert len(message.splitlines()) <= max_lines, message
    assert fix in message, message
    return message


def assert_still_answering(daemon, config_before: str) -> None:
    assert daemon.process.poll() is None, daemon.log()[-3000:]
    assert daemon.status()["state"] == "idle"
    assert (daemon.home / "config.toml").read_text() == config_before, "a refused command changed the config"


# ----- CLI arguments against a running daemon ----------------------------------------------

CLI_CASES = {
    "unknown-command": (["frobnicate"], EXIT_USAGE, "see p2ptrain --help"),
    "unknown-config-action": (["config", "frob"], EXIT_USAGE, "see p2ptrain config --help"),
    "pause-for-soon": (["pause", "--for", "soon"], EXIT_USAGE, "use e.g. 90s, 45m, 2h, 1h30m or 1d"),
    "pause-for-zero": (["pause", "--for", "0m"], EXIT_USAGE, "use e.g. 90s, 45m, 2h, 1h30m or 1d"),
    "pause-for-bare-number": (["pause", "--for", "90"], EXIT_USAGE, "'90' has no unit; use e.g. 90s, 45m, 2h, 1h30m or 1d"),
    "timeout-negative": (["status", "--timeout", "-1"], EXIT_USAGE, "use e.g. --timeout 30"),
    "events-limit-zero": (["events", "--limit", "0"], EXIT_USAGE, "send a limit >= 1"),
    "events-limit-text": (["events", "--limit", "many"], EXIT_USAGE, "see p2ptrain events --help"),
    "daemon-log-level": (["daemon", "--log-level", "loud"], EXIT_USAGE, "see p2ptrain daemon --help"),
    "join-without-a-name": (["join"], EXIT_USAGE, "p2ptrain join --new-run NAME"),
    "join-run-and-new-run": (["join", "r", "--new-run", "x"], EXIT_USAGE, "not both"),
    "join-without-peers": (["join", "somerun"], EXIT_USAGE, "pass --peers MULTIADDR"),
    "join-bad-run-name": (["join", "Bad Name!", "--peers", "/ip4/127.0.0.1/tcp/1"], EXIT_USAGE, "use 1-64 characters"),
    "new-run-bad-name": (["join", "--new-run=-dash"], EXIT_USAGE, "starting with a letter or digit"),
    "new-run-mode-fast": (["join", "--new-run", "x", "--mode", "fast"], EXIT_USAGE, "choose from 'sync', 'diloco'"),
    "new-run-negative-batch": (["join", "--new-run", "x", "--target-batch-size", "-5"], EXIT_USAGE, "use a whole number of samples >= 1"),
    "new-run-lora-r-text": (["join", "--new-run", "x", "--lora-r", "abc"], EXIT_USAGE, "see p2ptrain join --help"),
    "new-run-lora-r-zero": (["join", "--new-run", "x", "--lora-r", "0"], EXIT_USAGE, "rank"),
    "new-run-seq-len-zero": (["join", "--new-run", "x", "--seq-len", "0"], EXIT_USAGE, "use a whole number of tokens"),
    "new-run-hub-dataset-without-name": (["join", "--new-run", "x", "--dataset", "hub:"], EXIT_USAGE, "--dataset hub:NAME[:CONFIG]"),
    "new-run-hub-dataset-and-files": (["join", "--new-run", "x", "--dataset", "hub:wikitext", "notes.txt"], EXIT_USAGE, "give one hub dataset"),
    "new-run-compression-zip": (["join", "--new-run", "x", "--compression", "zip"], EXIT_USAGE, "use none, fp16"),
    "new-run-momentum-1.5": (["join", "--new-run", "x", "--outer-momentum", "1.5"], EXIT_USAGE, "use a number in [0, 1)"),
    "new-run-inner-lr-nan": (["join", "--new-run", "x", "--inner-lr", "nan"], EXIT_USAGE, "use a finite number > 0"),
    "new-run-round-end-time": (["join", "--new-run", "x", "--round-end", "time"], EXIT_USAGE, "choose from 'samples', 'local_steps'"),
    "new-run-round-time-limit-zero": (["join", "--new-run", "x", "--round-time-limit", "0"], EXIT_USAGE, "use a number of seconds > 0"),
    "config-set-unknown-key": (["config", "set", "training.turbo", "true"], EXIT_USAGE, "p2ptrain config show lists the keys"),
    "config-set-negative": (["config", "set", "storage.flush_interval_s", "-3"], EXIT_USAGE, "p2ptrain config set storage.flush_interval_s VALUE"),
    "config-set-wrong-type": (["config", "set", "dht.use_relay", "maybe"], EXIT_USAGE, "p2ptrain config set dht.use_relay VALUE"),
    "config-set-long-nickname": (["config", "set", "nickname", "n" * 40], EXIT_USAGE, "at most 32 characters"),
    "config-set-bad-multiaddr": (["config", "set", "dht.host_maddrs", '["0.0.0.0:31337"]'], EXIT_USAGE, "expected e.g. /ip4/"),
    "config-set-without-value": (["config", "set", "nickname"], EXIT_USAGE, "usage: p2ptrain config set KEY VALUE"),
    "config-get-unknown-key": (["config", "get", "nope"], EXIT_USAGE, "p2ptrain config show lists the keys"),
}


@pytest.mark.parametrize("args, code, fix", CLI_CASES.values(), ids=CLI_CASES.keys())
def test_bad_command_line_gets_one_line_naming_the_fix(daemon, args, code, fix):
    config_before = (daemon.home / "config.toml").read_text()
    assert_short_error(cli(daemon.home, *args), code, fix)
    assert_still_answering(daemon, config_before)


def test_join_with_a_peer_that_is_not_a_multiaddr_says_what_one_looks_like(daemon):
    config_before = (daemon.home / "config.toml").read_text()
    result = cli(daemon.home, "join", "somerun", "--peers", "not-a-multiaddr")
    message = assert_short_error(result, EXIT_USAGE, "expected e.g. /ip4/203.0.113.5/tcp/31337/p2p/Qm...", max_lines=3)
    assert "'not-a-multiaddr' is not a multiaddr" in message
    assert_still_answering(daemon, config_before)


def test_a_new_run_with_an_outer_step_the_study_found_unstable_is_created_with_a_one_line_warning(daemon):
    result = cli(daemon.home, "join", "--new-run", "paper-outer", "--mode", "diloco", "--outer-lr", "0.7", "--outer-momentum", "0.9")
    try:
        assert result.returncode == 0, result.stderr
        [warning] = result.stderr.splitlines()
        assert warning.startswith("warning: outer lr 0.7 with momentum 0.9 moves the model 7.0x") and "--outer-lr 1" in warning
    finally:
        assert cli(daemon.home, "leave").returncode == 0
        daemon.wait_until(lambda s: s["state"] == "idle", 60, what="idle again")


def test_unknown_config_key_is_not_written_to_the_file(daemon):
    cli(daemon.home, "config", "set", "training.turbo", "true")
    assert "turbo" not in (daemon.home / "config.toml").read_text()
    assert json.loads(cli(daemon.home, "config", "get", "training").stdout).keys() >= {"device", "gpus"}


def test_a_home_under_a_regular_file_is_reported_as_no_daemon(tmp_path):
    (tmp_path / "a-file").write_text("not a directory\n")
    result = cli(tmp_path / "a-file" / "home", "status")
    # status prints its "not running" line on stdout (scripts read it there); other commands on stderr.
    assert result.returncode == EXIT_NO_DAEMON and "Traceback" not in result.stdout + result.stderr
    assert len(result.stdout.strip().splitlines()) == 1 and "start it with: p2ptrain daemon --home" in result.stdout
    assert_short_error(cli(tmp_path / "a-file" / "home", "pause"), EXIT_NO_DAEMON, "start it with: p2ptrain daemon --home")


# ----- control messages on the socket (beyond test_daemon_skeleton.py) ------------------------

def exchange(daemon, payload: bytes) -> list[dict]:
    return raw_exchange(resolve_paths(daemon.home).socket, payload)


SOCKET_CASES = {
    "nested-too-deep": (b"[" * 100_000 + b"\n", "not a JSON line"),
    "integer-id-of-5000-digits": (b'{"id":' + b"7" * 5000 + b',"method":"status"}\n', "not a JSON line"),
    "line-cut-off-before-eof": (b'{"id":1,"method":"status"', "not a JSON line"),
    "limit-nan": (b'{"id":1,"method":"events","params":{"limit":NaN}}\n', "limit must be a number"),
    "limit-infinite": (b'{"id":1,"method":"events","params":{"limit":1e999}}\n', "limit must be a number"),
    "run-id-a-number": (b'{"id":1,"method":"metrics","params":{"run_id":5}}\n', "run_id must be a non-empty string"),
    "subscribe-params-a-number": (b'{"id":1,"method":"subscribe","params":5}\n', "'params' must be an object"),
    "new-run-yes": (b'{"id":1,"method":"join","params":{"run":"r","new_run":"yes"}}\n', "new_run must be true or false"),
    "manifest-a-list": (b'{"id":1,"method":"join","params":{"run":"r","new_run":true,"manifest":[1]}}\n', "manifest must be an object"),
    "manifest-lora-yes": (b'{"id":1,"method":"join","params":{"run":"r","new_run":true,"manifest":{"lora":"yes"}}}\n', "'lora'"),
    "manifest-seq-len-infinite": (b'{"id":1,"method":"join","params":{"run":"r","new_run":true,"manifest":{"seq_len":1e400}}}\n', "'seq_len'"),
    "manifest-unknown-field": (b'{"id":1,"method":"join","params":{"run":"r","new_run":true,"manifest":{"learning_rate":1}}}\n', "'learning_rate' is unknown"),
    "config-set-without-value": (b'{"id":1,"method":"config.set","params":{"key":"nickname"}}\n', "needs a value"),
    "config-set-section-wrong-type": (b'{"id":1,"method":"config.set","params":{"key":"dht","value":{"use_relay":"maybe"}}}\n', "dht.use_relay"),
    "config-get-key-a-list": (b'{"id":1,"method":"config.get","params":{"key":["x"]}}\n', "key must be a non-empty string"),
}


@pytest.mark.parametrize("payload, says", SOCKET_CASES.values(), ids=SOCKET_CASES.keys())
def test_bad_control_message_gets_a_bad_request_reply(daemon, payload, says):
    config_before = (daemon.home / "config.toml").read_text()
    replies = exchange(daemon, payload)
    assert len(replies) == 1, replies
    error = replies[0]["error"]
    assert error["code"] == "bad-request"
    assert says in error["message"]
    assert "\n" not in error["message"] + error["fix"]
    # The fix is in the reply's fix field, or (config errors) already in the message.
    assert error["fix"] or "fix it" in error["message"] or "p2ptrain config" in error["message"]
    assert_still_answering(daemon, config_before)


def test_a_bad_line_leaves_the_same_connection_usable(daemon):
    replies = exchange(daemon, b"[" * 100_000 + b'\n{"id":2,"method":"status"}\n')
    assert replies[0]["error"]["code"] == "bad-request"
    assert replies[1]["id"] == 2 and replies[1]["result"]["state"] == "idle"


# ----- what the daemon refuses to start with ------------------------------------------------

BAD_CONFIGS = {
    "unknown-key": (b"turbo = true\n", "unknown key 'turbo'; remove it"),
    "unknown-key-in-a-section": (b"[policy]\nfoo = 1\n", "unknown key 'policy.foo'; remove it"),
    "wrong-type": (b'[storage]\nflush_interval_s = "fast"\n', "storage.flush_interval_s = 'fast'"),
    "out-of-range": (b"[storage]\nflush_interval_s = 600\n", "less than or equal to 60; fix it in"),
    "bad-multiaddr": (b'[dht]\nhost_maddrs = ["0.0.0.0:31337"]\n', "expected e.g. /ip4/"),
    "multiaddr-not-a-list": (b'[dht]\nhost_maddrs = "/ip4/0.0.0.0/tcp/1"\n', "valid list; fix it in"),
    "gpus-not-all-or-a-list": (b'[training]\ngpus = "some"\n', "training.gpus = 'some'"),
    "device-tpu": (b'[training]\ndevice = "tpu"\n', "'auto', 'cpu' or 'cuda'"),
    "log-level-loud": (b'log_level = "loud"\n', "'debug', 'info', 'warning' or 'error'"),
    "section-a-number": (b"dht = 5\n", "p2ptrain config set dht VALUE"),
    "not-utf-8": (b"\xff\xfe\x00nickname = 1\n", "save it as UTF-8"),
}


def start_refused(home, fix: str) -> str:
    """``p2ptrain daemon --home HOME`` must exit 1 with one line on stderr naming ``fix``, and leave no socket."""
    result = cli(home, "daemon", timeout=60)
    message = assert_short_error(result, EXIT_ERROR, fix)
    assert message.startswith("p2ptrain daemon: ")
    assert not resolve_paths(home).socket.exists()
    return message


@pytest.mark.parametrize("content, fix", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_daemon_refuses_a_bad_config_in_one_line_and_leaves_the_file(tmp_path, content, fix):
    (tmp_path / "config.toml").write_bytes(content)
    message = start_refused(tmp_path, fix)
    assert "literal[" not in message, "the key is named as the user writes it"
    assert (tmp_path / "config.toml").read_bytes() == content


def test_daemon_refuses_a_config_that_is_a_directory(tmp_path):
    (tmp_path / "config.toml").mkdir()
    start_refused(tmp_path, "cannot read")


def test_daemon_refuses_a_home_inside_a_regular_file(tmp_path):
    (tmp_path / "a-file").write_text("not a directory\n")
    start_refused(tmp_path / "a-file" / "home", "Not a directory")


def test_daemon_refuses_a_home_whose_state_dir_cannot_be_created(tmp_path):
    home = tmp_path / "home"
    write_local_config(home)
    # chmod does not stop root; an immutable directory does.
    made_immutable = subprocess.run(["chattr", "+i", str(home)], capture_output=True)
    if made_immutable.returncode != 0:
        pytest.skip(f"chattr +i failed: {made_immutable.stderr.decode().strip()}")
    try:
        start_refused(home, "check the permissions of its parent, or pass --home DIR")
    finally:
        subprocess.run(["chattr", "-i", str(home)], check=True)
    assert not (home / "state").exists()


def test_daemon_refuses_a_database_that_is_not_sqlite_and_keeps_it(tmp_path):
    write_local_config(tmp_path)
    database = resolve_paths(tmp_path).database
    database.parent.mkdir(parents=True)
    content = b"my notes, not a database\n" * 100
    database.write_bytes(content)
    start_refused(tmp_path, "move it aside")
    assert database.read_bytes() == content


def test_daemon_refuses_a_database_from_a_newer_p2ptrain_and_keeps_it(tmp_path):
    write_local_config(tmp_path)
    database = resolve_paths(tmp_path).database
    database.parent.mkdir(parents=True)
    Database.open(database).close()
    with sqlite3.connect(database) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    start_refused(tmp_path, "upgrade p2ptrain")
    with sqlite3.connect(database) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


@pytest.mark.timeout(90)
def test_new_run_with_a_model_that_is_nowhere_ends_in_error_saying_what_to_use(daemons):
    """An unknown model passes the manifest check (it may be a hub id); the worker's failure must explain it."""
    daemon = daemons.start("unknown-model")
    result = cli(daemon.home, "join", "--new-run", "nowhere", "--model", "no-such-model")
    assert result.returncode == 0, result.stderr
    status = daemon.wait_until(lambda status: status["state"] == "error", timeout=60, what="the worker to fail")
    errors = [health for health in status["health"] if health["level"] == "error"]
    assert errors and "no-such-model" in errors[0]["message"] and "tiny" in errors[0]["fix"]
    assert "\n" not in errors[0]["message"] + errors[0]["fix"]
    human = cli(daemon.home, "status")
    assert human.returncode == EXIT_ERROR and "Traceback" not in human.stdout + human.stderr
    # A fatal error already dropped the run; leave acknowledges the error and the daemon is idle again.
    daemon.wait_until(lambda status: status["run"] is None, timeout=30, what="the failed run to be dropped")
    assert cli(daemon.home, "leave").returncode == 0
    assert daemon.status()["state"] == "idle"
