"""Bans through the daemon and the CLI: ``p2ptrain peers`` shows them, ``p2ptrain unban`` lifts them.

A real daemon in a run of its own (a real worker); the ban itself is put in its
database as a worker's ``peer-banned`` event leaves it (the rogue swarm tests
in ``test_faults_rogue.py`` make workers ban peers for real).
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from daemons import cli
from p2ptrain.paths import resolve_paths

pytestmark = [pytest.mark.swarm]

ROGUE = "QmRogueRogueRogueRogueRogueRogueRogueRogueRogue1"


def peers(home) -> dict:
    result = cli(home, "peers", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.timeout(300)
def test_bans_are_shown_by_peers_and_lifted_by_unban(daemons):
    daemon = daemons.start("bans")
    idle = cli(daemon.home, "unban", "--all")
    assert idle.returncode == 1 and idle.stderr.count("\n") == 1 and "not in a run" in idle.stderr
    usage = cli(daemon.home, "unban")
    assert usage.returncode == 2 and "give one peer id" in usage.stderr and "Traceback" not in usage.stderr

    assert cli(daemon.home, "join", "--new-run", "bans-run", "--micro-batch", "2").returncode == 0
    daemon.wait_until(lambda s: s["state"] == "training", 180, what="training")
    with sqlite3.connect(resolve_paths(daemon.home).database) as connection:
        connection.execute("INSERT INTO bans (run_id, peer_id, banned_at, reason, rounds_named) VALUES (?, ?, ?, ?, ?)",
                           ["bans-run", ROGUE, time.time(), "implausible-update", 3])
    shown = peers(daemon.home)
    assert [ban["peer_id"] for ban in shown["bans"]] == [ROGUE]
    assert all(row["banned"] is False for row in shown["peers"])
    text = cli(daemon.home, "peers").stdout
    assert f"banned {ROGUE}" in text and f"p2ptrain unban {ROGUE}" in text

    wrong = cli(daemon.home, "unban", "QmSomebodyElse")
    assert wrong.returncode == 2 and "is not banned in run 'bans-run'" in wrong.stderr and wrong.stderr.count("\n") == 1
    lifted = cli(daemon.home, "unban", ROGUE)
    assert lifted.returncode == 0 and ROGUE in lifted.stdout and "0 still banned" in lifted.stdout
    assert peers(daemon.home)["bans"] == []
    events = json.loads(cli(daemon.home, "events", "--json").stdout)["events"]
    assert [event["data"]["peers"] for event in events if event["kind"] == "peers-unbanned"] == [[ROGUE]]
    # the worker took the command (an undecodable one is answered with a worker-error, a failing handler
    # crashes the worker) and goes on training
    time.sleep(2)
    assert daemon.status()["state"] == "training"
    events = json.loads(cli(daemon.home, "events", "--json").stdout)["events"]
    assert [event["message"] for event in events if event["kind"] in ("worker-error", "worker-crashed")] == []
