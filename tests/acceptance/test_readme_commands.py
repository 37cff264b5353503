"""The README's command table and "Volunteering on your machine", run as written, with the default configuration.

Two volunteer accounts (``volunteers.py``) each install the user service as
the README says and start its daemon (systemd's part aside). Neither has a
config file, so both daemons want TCP 31337 on this machine: the second
listens on the next free port and says so. One starts a run with the table's
``join --new-run``, the other joins it with the README's ``join RUN --peers
...`` and the starter's ``local.addresses[0]``; then every other command of
the table runs against them. The tests run in file order.

Cost: about 2-3 minutes (two CPU peers of the tiny model).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from daemons import stop_all
from readme import code_blocks, command_table, shell_commands
from volunteers import Volunteer

from p2ptrain.cli import RELEASE_TIMEOUT_S

pytestmark = [pytest.mark.swarm]

RUN = "readme-run"
EXAMPLE_ADDRESS = "/ip4/203.0.113.5/tcp/31337/p2p/Qm..."
# Every synopsis of the README's command table, and the command lines run here for it.
COMMANDS = {
    "p2ptrain status [--json]": [["p2ptrain", "status"], ["p2ptrain", "status", "--json"]],
    "p2ptrain join RUN --peers MULTIADDR": [["p2ptrain", "join", "RUN", "--peers", "MULTIADDR"]],
    "p2ptrain join --new-run NAME [--mode sync|diloco] [--model tiny] [--target-batch-size N] [--local-steps H] ...": [
        ["p2ptrain", "join", "--new-run", RUN, "--mode", "sync", "--model", "tiny", "--target-batch-size", "96"],
        ["p2ptrain", "join", "--new-run", "broken", "--model", "./no-such-model"]],
    "p2ptrain pause [--for 2h]": [["p2ptrain", "pause", "--for", "2h"], ["p2ptrain", "pause"]],
    "resume": [["p2ptrain", "resume"]],
    "finish": [["p2ptrain", "finish"]],
    "leave": [["p2ptrain", "leave"]],
    "p2ptrain peers [--json]": [["p2ptrain", "peers"], ["p2ptrain", "peers", "--json"]],
    "events": [["p2ptrain", "events"]],
    "p2ptrain unban PEER | --all": [["p2ptrain", "unban", "--all"]],
    "p2ptrain config show | get KEY | set KEY VALUE": [
        ["p2ptrain", "config", "show"], ["p2ptrain", "config", "get", "storage.keep_events"],
        ["p2ptrain", "config", "set", "storage.keep_events", "50000"]],
    "p2ptrain plan --model M --gpu-memory 16GiB --compute-capability 7.5": [
        ["p2ptrain", "plan", "--model", "gemma-2b", "--gpu-memory", "16GiB", "--compute-capability", "7.5"]],
    "p2ptrain doctor [--json]": [["p2ptrain", "doctor"], ["p2ptrain", "doctor", "--json"]],
    "p2ptrain service install [--user]": [["p2ptrain", "service", "install", "--user"]],
    "service uninstall [--user]": [["p2ptrain", "service", "uninstall", "--user"]],
    "p2ptrain demo [--peers N]": [],  # the quick start: test_quick_start.py
    "p2ptrain monitor RUN --peers MULTIADDR [--listen HOST:PORT]": [],  # a run of three peers: tests/integration/test_monitor.py
}


def commands_of(synopsis: str) -> list[list[str]]:
    return COMMANDS[synopsis]


def succeeded(result, code: int = 0) -> str:
    assert result.returncode == code, f"exit {result.returncode} (expected {code}): {result.stdout[-1500:]}{result.stderr[-1500:]}"
    return result.stdout


def status_json(volunteer: Volunteer, code: int | None = None) -> dict:
    result = volunteer.run(commands_of("p2ptrain status [--json]")[1])
    if code is not None:
        succeeded(result, code)
    return json.loads(result.stdout)


def test_every_command_of_the_table_is_run_here_with_its_documented_options():
    assert set(command_table()) == set(COMMANDS), "the README's command table changed: update COMMANDS"
    for synopsis, lines in COMMANDS.items():
        for line in lines:
            subcommand = line[1]
            assert subcommand in synopsis, (synopsis, line)
            for option in (word for word in line if word.startswith("--")):
                assert option in synopsis, f"{option} is not documented in `{synopsis}`"


@pytest.fixture(scope="module")
def volunteers(tmp_path_factory):
    """The starter and a volunteer, each set up as "Volunteering on your machine" says, minus systemd."""
    steps = [command for block in code_blocks("Volunteering on your machine") for command in shell_commands(block)]
    programs = [command[0] for command in steps]
    assert programs == ["pipx", "p2ptrain", "systemctl", "p2ptrain", "p2ptrain-tui"], steps
    install, enable = steps[1], steps[2]
    assert install in commands_of("p2ptrain service install [--user]") and enable[:3] == ["systemctl", "--user", "enable"]
    root = tmp_path_factory.mktemp("volunteers")
    accounts = []
    try:
        for name in ("starter", "volunteer"):
            account = Volunteer.create(root / name)
            accounts.append(account)
            # `pipx install` of the wheel: this test environment has p2ptrain (test_release.py installs the wheel)
            succeeded(account.run(install))
            assert account.unit_file().is_file()
            account.start_service()  # `systemctl --user enable --now p2ptrain`
            assert not (account.home / ".config/p2ptrain/config.toml").exists()  # the default configuration
        yield accounts[0], accounts[1], steps[3]
    finally:
        stop_all((account for account in accounts if account.process is not None), timeout=60)


@pytest.mark.timeout(60)
def test_status_without_a_daemon_exits_3(tmp_path):
    nobody = Volunteer.create(tmp_path / "nobody")
    assert "p2ptrain daemon is not running" in succeeded(nobody.run(commands_of("p2ptrain status [--json]")[0]), 3)
    assert status_json(nobody, 3)["state"] == "stopped"


@pytest.mark.timeout(180)
def test_status_exits_1_in_the_error_state_and_leave_clears_it(volunteers):
    _, volunteer, _ = volunteers
    broken = commands_of("p2ptrain join --new-run NAME [--mode sync|diloco] [--model tiny] [--target-batch-size N] [--local-steps H] ...")[1]
    succeeded(volunteer.run(broken))  # accepted; the worker finds no such model
    volunteer.wait_until(lambda s: s["state"] == "error", 150, what="the error state")
    assert "no-such-model" in succeeded(volunteer.run(commands_of("p2ptrain status [--json]")[0]), 1)
    assert status_json(volunteer, 1)["health"][0]["level"] == "error"
    succeeded(volunteer.run(commands_of("leave")[0]))
    volunteer.wait_until(lambda s: s["state"] == "idle", 60, what="leave to clear the error")


@pytest.mark.timeout(420)
def test_a_volunteer_joins_the_starters_run_with_one_address(volunteers):
    starter, volunteer, readme_join = volunteers
    assert status_json(volunteer, 5)["state"] == "idle"
    succeeded(starter.run(commands_of("p2ptrain join --new-run NAME [--mode sync|diloco] [--model tiny] [--target-batch-size N] [--local-steps H] ...")[0]))
    starter.wait_until(lambda s: (s.get("local") or {}).get("addresses"), 240, what="the starter to create the run")
    # "one address (`local.addresses` in the starter's `p2ptrain status --json`)"
    address = status_json(starter, 0)["local"]["addresses"][0]
    assert readme_join[:2] == ["p2ptrain", "join"] and EXAMPLE_ADDRESS in readme_join
    line = [RUN if word == "RUN" else address if word == EXAMPLE_ADDRESS else word for word in readme_join]
    succeeded(volunteer.run(line))
    for account in (starter, volunteer):
        account.wait_until(lambda s: s["state"] == "training" and (s.get("run") or {}).get("num_peers") == 2, 240,
                           what="both training, 2 peers")
    assert "training" in succeeded(volunteer.run(commands_of("p2ptrain status [--json]")[0]))
    # both wanted TCP 31337 (the default): the second one says where it listens instead
    moved = [line for line in status_json(volunteer, 0)["health"] if "is taken by" in line["message"]]
    assert moved and "dht.host_maddrs" in moved[0]["fix"], moved


@pytest.mark.timeout(120)
def test_peers_and_events(volunteers):
    starter, volunteer, _ = volunteers
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        peers = json.loads(succeeded(volunteer.run(commands_of("p2ptrain peers [--json]")[1])))["peers"]
        if len(peers) == 2:
            break
        time.sleep(2)
    assert len(peers) == 2 and sum(peer["is_local"] for peer in peers) == 1, peers
    table = succeeded(volunteer.run(commands_of("p2ptrain peers [--json]")[0]))
    assert all(peer["peer_id"][:8] in table or peer["nickname"] in table for peer in peers), table
    history = succeeded(volunteer.run(commands_of("events")[0]))
    assert "joined" in history and "port-taken" in history
    unbanned = succeeded(volunteer.run(commands_of("p2ptrain unban PEER | --all")[0]))
    assert unbanned.startswith("lifted the ban of nobody; 0 still banned"), unbanned  # honest peers ban nobody


@pytest.mark.timeout(720)
def test_pause_for_resume_finish_and_leave(volunteers):
    _, volunteer, _ = volunteers
    timed_pause, pause = commands_of("p2ptrain pause [--for 2h]")
    # pause returns once the worker has let go of its device, which it may take up to the CLI's own
    # bound for (a loaded machine: it needed over 120 s once): the test waits as long as the command does
    succeeded(volunteer.run(pause, timeout=RELEASE_TIMEOUT_S + 30))
    status = status_json(volunteer, 5)
    assert (status["state"], status["pause_reason"], status["paused_until"]) == ("paused", "user", None)
    succeeded(volunteer.run(timed_pause))  # a paused peer's pause gets an end
    status = status_json(volunteer, 5)
    assert (status["state"], status["pause_reason"]) == ("paused", "user")
    assert 7100 < status["paused_until"] - time.time() <= 7200
    succeeded(volunteer.run(commands_of("resume")[0]))
    volunteer.wait_until(lambda s: s["state"] == "training", 60, what="resume")
    epoch = status_json(volunteer)["run"]["epoch"]
    succeeded(volunteer.run(commands_of("finish")[0]))
    status = volunteer.wait_until(lambda s: s["state"] == "paused", 180, what="finish to complete the epoch, then pause")
    assert status["run"]["epoch"] >= epoch
    succeeded(volunteer.run(commands_of("leave")[0], timeout=RELEASE_TIMEOUT_S + 30))
    volunteer.wait_until(lambda s: s["state"] == "idle", 120, what="leave")
    assert list((volunteer.state_dir / "checkpoints").glob("*.pt"))


@pytest.mark.timeout(60)
def test_config_show_get_and_set(volunteers):
    _, volunteer, _ = volunteers
    show, get, set_ = commands_of("p2ptrain config show | get KEY | set KEY VALUE")
    shown = succeeded(volunteer.run(show))
    assert json.loads(shown.split("\n", 1)[1])["dht"]["host_maddrs"] == ["/ip4/0.0.0.0/tcp/31337"]
    assert succeeded(volunteer.run(get)).strip() == "100000"
    succeeded(volunteer.run(set_))
    assert succeeded(volunteer.run(get)).strip() == "50000"
    assert 'keep_events = 50000' in (volunteer.home / ".config/p2ptrain/config.toml").read_text()


@pytest.mark.timeout(180)
def test_plan_and_doctor(volunteers):
    starter, volunteer, _ = volunteers
    planned = succeeded(starter.run(commands_of("p2ptrain plan --model M --gpu-memory 16GiB --compute-capability 7.5")[0]))
    assert re.search(r"on a 16 GiB GPU of compute capability 7\.5 .*micro-batch \d+ x \d+", planned), planned
    text, as_json = commands_of("p2ptrain doctor [--json]")
    assert "dht-port" in succeeded(starter.run(text, timeout=120))
    report = json.loads(succeeded(volunteer.run(as_json, timeout=120)))
    port = next(check for check in report["checks"] if check["name"] == "dht-port")
    assert port["level"] == "warning" and "TCP port 31337 is taken by" in port["message"], port
    if "/tcp/31337/" in status_json(starter)["local"]["addresses"][0]:  # not some other program of this machine
        assert f"another p2ptrain daemon (pid {starter.process.pid}" in port["message"], port


@pytest.mark.timeout(60)
def test_service_uninstall_keeps_the_training_state(volunteers):
    _, volunteer, _ = volunteers
    output = succeeded(volunteer.run(commands_of("service uninstall [--user]")[0]))
    assert not volunteer.unit_file().exists()
    assert "systemctl --user" in output
    assert (volunteer.state_dir / "p2ptrain.db").is_file() and list((volunteer.state_dir / "checkpoints").glob("*.pt"))
