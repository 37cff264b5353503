"""Real swarms driven only through the CLI, as the issue's users would: daemons on 127.0.0.1.

One module-scoped `sync` swarm of three daemons serves the checks that build
on it (they run in file order); DiLoCo gets its own pair.
"""

from __future__ import annotations

import json
import sqlite3
import time

import psutil
import pytest

from daemons import cli, local_swarm, start_daemon, still_running
from p2ptrain.paths import resolve_paths

pytestmark = [pytest.mark.swarm]

SYNC_RUN = ["--mode", "sync", "--target-batch-size", "192", "--micro-batch", "8"]
IDENTITY_CHECK = "is not used by other peers"  # hivemind's log line when it probes whether an identity is taken


def status_json(home) -> dict:
    result = cli(home, "status", "--json")
    return json.loads(result.stdout)


def epochs_rows(home) -> int:
    with sqlite3.connect(resolve_paths(home).database) as connection:
        return connection.execute("SELECT count(*) FROM epochs").fetchone()[0]


def events(home) -> list[dict]:
    return json.loads(cli(home, "events", "--json", "--limit", "1000").stdout)["events"]


def validation_losses(home) -> list[float]:
    """Validation loss of each recorded epoch, oldest first."""
    with sqlite3.connect(resolve_paths(home).database) as connection:
        rows = connection.execute("SELECT val_loss FROM epochs WHERE val_loss IS NOT NULL ORDER BY epoch").fetchall()
    return [row[0] for row in rows]


def descendants(pid: int) -> list[psutil.Process]:
    """The worker and everything under it that still runs: not multiprocessing's resource tracker, which lives
    as long as the daemon, nor a process that has ended and waits to be reaped (a zombie holds no memory)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    running = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                running.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return running


@pytest.fixture(scope="module")
def sync_swarm(tmp_path_factory):
    with local_swarm(tmp_path_factory.mktemp("sync"), "cli-sync", SYNC_RUN) as (daemons, address):
        yield daemons, address


@pytest.mark.timeout(600)
def test_three_daemons_reach_epoch_3_together_through_the_cli(sync_swarm):
    daemons, _ = sync_swarm
    for daemon in daemons:
        daemon.wait_until(
            lambda s: s["state"] == "training" and (s.get("run") or {}).get("num_peers") == 3 and s["run"]["epoch"] >= 3,
            240,
            what="training with 3 peers at epoch >= 3",
        )
    for daemon in daemons:
        # a peer that just downloaded the swarm's state has no fresh step report yet: wait for one
        daemon.wait_until(lambda s: s["state"] == "training" and ((s.get("local") or {}).get("samples_per_second") or 0) > 0, 60, what="a step report")
        status = status_json(daemon.home)
        assert status["run"]["epoch"] >= 3
        deadline = time.monotonic() + 30
        while epochs_rows(daemon.home) < 3 and time.monotonic() < deadline:
            time.sleep(1)
        assert epochs_rows(daemon.home) >= 3
    for daemon in daemons:
        # a peer that caught up by downloading state may not have averaged yet, and its first rounds may
        # lose a share (late for a round it just joined): give it rounds until the startup's losses are
        # a third of the complete ones. Every peer is reachable, so rounds keep every peer's share
        # (hivemind's "received <100% results"); an unreachable peer loses its share in every round it
        # is in and never gets there
        deadline = time.monotonic() + 150
        while True:
            recorded = events(daemon.home)
            # a row of repeated rounds stands for `count` of them (daemon/event_bursts.py)
            together = sum(event["count"] for event in recorded if event["kind"] == "averaged" and event["data"]["peers"] >= 2)
            incomplete = sum(event["count"] for event in recorded if event["kind"] == "averaging-incomplete")
            if (together >= 3 and incomplete * 3 <= together) or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert together >= 3, recorded
        assert incomplete * 3 <= together, (incomplete, together)
    for daemon in daemons:
        val_losses = validation_losses(daemon.home)
        assert len(val_losses) >= 3 and val_losses[-1] < val_losses[0], val_losses
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        peers = json.loads(cli(daemons[0].home, "peers", "--json").stdout)["peers"]
        if len(peers) == 3:
            break
        time.sleep(2)
    assert len(peers) == 3 and sum(peer["is_local"] for peer in peers) == 1, peers


@pytest.mark.timeout(120)
def test_a_joiner_is_planned_from_the_manifest_it_read_and_shows_the_plan(sync_swarm):
    daemons, _ = sync_swarm
    b = daemons[1]
    recorded = events(b.home)
    kinds = [event["kind"] for event in recorded]
    # joined with a run name and an address only: the plan is made once the worker read the manifest
    assert kinds.index("planned") < kinds.index("joined"), kinds
    planned = next(event for event in recorded if event["kind"] == "planned")["data"]
    assert (planned["worker"], planned["precision"], planned["quantization"]) == ("cpu", "fp32", "none")
    assert planned["micro_batch"] * planned["grad_accum"] == 8 and planned["cpu_threads"] == 1  # max_cpu_threads = 1
    local = status_json(b.home)["local"]
    assert local["plan"]["rationale"] == planned["rationale"] and local["workers"][0]["plan"] == local["plan"]
    assert local["micro_batch"] * local["grad_accum"] == 8
    shown = cli(b.home, "status").stdout
    assert "      Plan: ~" in shown and "- 1 CPU thread: capped by max_cpu_threads = 1" in shown, shown
    doctor = json.loads(cli(b.home, "doctor", "--json", timeout=60).stdout)
    assert doctor["plans"][0]["run"] == "cli-sync" and doctor["plans"][0]["rationale"] == planned["rationale"]


@pytest.mark.timeout(420)
def test_pause_resume_and_a_timed_pause(sync_swarm):
    daemons, _ = sync_swarm
    c = daemons[2]
    # the worker checkpoints, sends its last step report and exits: pause returns only then, so a
    # script's next command (`p2ptrain pause && my_gpu_job`) finds the device free
    paused = cli(c.home, "pause")
    assert paused.returncode == 0 and "paused; now paused (user)" in paused.stdout, paused.stdout + paused.stderr
    assert not descendants(c.process.pid), "pause returned while the worker still ran"
    stopped = status_json(c.home)
    assert (stopped["state"], stopped["pause_reason"], stopped["local"]["workers"][0]["state"]) == ("paused", "user", "paused")
    trained = stopped["local"]["trained_samples"]
    time.sleep(4)
    assert status_json(c.home)["local"]["trained_samples"] == trained
    logged = c.log_path.stat().st_size
    assert cli(c.home, "resume").returncode == 0
    # a paused worker has exited: resuming starts one (imports, DHT, calibration, state download)
    c.wait_until(lambda s: s["state"] == "training", 150, what="resume")
    with open(c.log_path) as log:
        log.seek(logged)
        # this daemon's worker left the swarm under that identity seconds ago: hivemind's probe is skipped
        assert IDENTITY_CHECK not in log.read()
    assert cli(c.home, "pause", "--for", "3s", "--no-wait").returncode == 0
    assert status_json(c.home)["state"] == "paused"
    c.wait_until(lambda s: s["state"] == "training", 150, what="the timed pause to end by itself")


@pytest.mark.timeout(240)
def test_finish_completes_the_epoch_then_pauses(sync_swarm):
    daemons, _ = sync_swarm
    b = daemons[1]
    epoch = status_json(b.home)["run"]["epoch"]
    assert cli(b.home, "finish").returncode == 0
    status = b.wait_until(lambda s: s["state"] == "paused", 180, what="finish to pause after the epoch")
    assert status["pause_reason"] == "user" and status["run"]["epoch"] >= epoch
    assert cli(b.home, "resume").returncode == 0
    b.wait_until(lambda s: s["state"] == "training", 60, what="resume after finish")


@pytest.mark.timeout(300)
def test_a_restarted_daemon_rejoins_its_run_by_itself(sync_swarm):
    daemons, _ = sync_swarm
    b = daemons[1]
    assert b.terminate(timeout=120) == 0
    restarted = start_daemon(b.home)
    daemons[1] = restarted
    epoch = status_json(daemons[0].home)["run"]["epoch"]
    restarted.wait_until(
        lambda s: s["state"] == "training" and (s.get("run") or {}).get("id") == "cli-sync" and s["run"]["epoch"] >= epoch + 1,
        240,
        what="the restarted daemon to rejoin and reach the next epoch",
    )
    # a new daemon does not know who used its identity while it was down: the probe runs
    assert IDENTITY_CHECK in restarted.log_path.read_text()


@pytest.mark.timeout(300)
def test_sigkill_of_a_daemon_leaves_no_orphans_and_the_others_go_on(sync_swarm):
    daemons, _ = sync_swarm
    a, b, c = daemons
    children = descendants(c.process.pid)
    assert any("p2pd" in " ".join(child.cmdline()) for child in children if child.is_running())
    c.process.kill()  # the daemon alone, not its group
    c.process.wait(10)
    assert still_running(children, timeout=12) == []
    with sqlite3.connect(resolve_paths(c.home).database) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    epoch = status_json(a.home)["run"]["epoch"]
    for daemon in (a, b):
        daemon.wait_until(lambda s: s["run"]["epoch"] >= epoch + 1, 180, what="the others to go on without C")


@pytest.mark.timeout(180)
def test_leave_checkpoints_and_ends_every_process_of_the_worker(sync_swarm):
    daemons, _ = sync_swarm
    b = daemons[1]
    children = descendants(b.process.pid)
    assert cli(b.home, "leave").returncode == 0
    b.wait_until(lambda s: s["state"] == "idle", 120, what="leave to finish")
    assert still_running(children, timeout=15) == []
    assert list(resolve_paths(b.home).checkpoints_dir.glob("*"))
    events = json.loads(cli(b.home, "events", "--json", "--limit", "200").stdout)["events"]
    assert "left" in [event["kind"] for event in events]


@pytest.mark.timeout(420)
def test_two_diloco_daemons_reach_epoch_2(daemons):
    a = daemons.start("da")
    b = daemons.start("db")
    created = cli(a.home, "join", "--new-run", "cli-diloco", "--mode", "diloco", "--local-steps", "20", "--micro-batch", "8")
    assert created.returncode == 0, created.stderr
    address = a.wait_until(lambda s: (s.get("local") or {}).get("addresses"), 180, what="A to create the run")["local"]["addresses"][0]
    assert cli(b.home, "join", "cli-diloco", "--peers", address).returncode == 0
    for daemon in (a, b):
        daemon.wait_until(
            lambda s: s["state"] == "training" and s["run"]["mode"] == "diloco" and s["run"]["epoch"] >= 2, 300, what="DiLoCo epoch 2"
        )
