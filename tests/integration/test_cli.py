"""The command line as a user types it: global options anywhere, every command's --help,
and output nobody reads any more (``p2ptrain doctor --json | head -c 1``).

Each case runs the installed ``p2ptrain`` console script in a subprocess.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from daemons import P2PTRAIN, child_environment

pytestmark = pytest.mark.timeout(120)

PLAN_T4 = ["plan", "--model", "gemma-2b", "--gpu-memory", "16GiB", "--compute-capability", "7.5", "--json"]
COMMANDS = ["status", "join", "pause", "resume", "finish", "leave", "peers", "events", "config", "daemon", "service",
            "demo", "plan", "doctor", "tui", "export"]


def p2ptrain(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([*P2PTRAIN, *args], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60,
                          env=child_environment())


def with_global_options(command: list[str], home, where: str) -> list[str]:
    options = ["--home", str(home), "--timeout", "5"]
    return [*options, *command] if where == "before" else [*command, *options]


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("command", [["doctor", "--json"], PLAN_T4], ids=["doctor", "plan"])
def test_plan_and_doctor_take_the_global_options_before_or_after_the_command(short_tmp, command, where):
    result = p2ptrain(*with_global_options(command, short_tmp, where))
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), dict)


@pytest.mark.parametrize("where", ["before", "after"])
def test_status_takes_the_global_options_before_or_after_the_command(short_tmp, where):
    result = p2ptrain(*with_global_options(["status", "--json"], short_tmp / "nothing", where))
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout)["state"] == "stopped"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_help_that_lists_the_global_options(short_tmp, command):
    result = p2ptrain("--home", str(short_tmp), command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: p2ptrain {command} ") and "--home HOME" in result.stdout
    assert "--timeout TIMEOUT" in result.stdout


def test_a_module_command_lists_its_own_options_in_its_help(short_tmp):
    assert "--compute-capability" in p2ptrain("plan", "--help").stdout
    assert "--json" in p2ptrain("--home", str(short_tmp), "doctor", "--help").stdout
    assert "--theme" in p2ptrain("tui", "--help").stdout


def run_with_closed_output(*args: str) -> subprocess.CompletedProcess:
    """Run ``p2ptrain ARGS`` with its stdout a pipe whose reader is gone before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return p2ptrain(*args, stdout=write_end)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("command", [["doctor", "--json"], PLAN_T4, ["status", "--json"], ["--help"]],
                         ids=["doctor", "plan", "status-without-daemon", "help"])
def test_output_read_by_no_one_ends_the_command_quietly(short_tmp, command):
    result = run_with_closed_output("--home", str(short_tmp / "home"), *command)
    assert result.returncode in (0, 141) and result.stderr == ""


def test_status_and_events_of_a_daemon_end_quietly_when_the_output_is_closed(daemons):
    daemon = daemons.start()
    for command in (["status", "--json"], ["status"], ["events"], ["events", "--json"], ["peers", "--json"]):
        result = run_with_closed_output("--home", str(daemon.home), *command)
        assert (result.returncode, result.stderr) == (141, ""), command


def test_doctor_piped_into_head_leaves_no_traceback(short_tmp):
    line = f"{shlex.join(P2PTRAIN)} --home {shlex.quote(str(short_tmp))} doctor --json | head -c 1"
    result = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60, env=child_environment())
    assert (result.stdout, result.stderr) == ("{", "")
