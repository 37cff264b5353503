"""What a paused daemon shows: no worker runs, so ``status`` shows the run as last seen (marked with
``run.as_of``), the contributed samples as the worker last counted them, and the same after a restart
of the daemon (``RunView.snapshot`` / ``restore``)."""

from __future__ import annotations

import json

from test_multi_gpu_status import joined_report, step

from p2ptrain.daemon.run_view import RunView
from p2ptrain.worker_pipe import decode_report


def swarm_report(*peer_ids: str) -> object:
    return decode_report({"type": "swarm", "epoch": 7, "samples_accumulated": 40, "target_batch_size": 512,
                          "eta_next_epoch_s": 12.0, "num_peers": len(peer_ids), "peers": [{"peer_id": peer_id, "loss": 2.0} for peer_id in peer_ids]})


def training_view() -> RunView:
    run = RunView(run_id="r")
    run.worker("gpu0", "cuda:0")
    run.apply_joined("gpu0", joined_report("QmMine", 8))
    run.states.move("gpu0", run.workers["gpu0"], "training")
    run.apply_step("gpu0", step(8, 20.0, 2.5, trained=980, contributed=960, late=20))
    run.apply_swarm(swarm_report("QmMine", "QmOther"))
    return run


def test_a_joined_worker_shows_its_checkpointed_total_at_once():
    run = RunView(run_id="r")
    run.worker("cpu", "cpu")
    joined = decode_report({**json.loads(json.dumps(joined_report("QmMine", 4).to_dict())), "type": "joined",
                            "trained_samples": 5100, "contributed_samples": 5000, "unused_samples": {"late": 100, "failed_round": 0, "rejected": 0}})
    run.apply_joined("cpu", joined)
    local = run.local_status()
    assert (local.trained_samples, local.contributed_samples, local.unused_samples["late"]) == (5100, 5000, 100), \
        "not 0 until the first step report"
    run.apply_step("cpu", step(16, 3.0, 2.0, trained=5116, contributed=5016, late=100))
    assert run.local_status().contributed_samples == 5016


def test_a_paused_run_shows_its_last_numbers_marked_with_when_the_swarm_was_seen():
    run = training_view()
    live = run.run_status()
    assert live.as_of is None and live.eta_next_epoch_s == 12.0

    run.workers["gpu0"].stopped()
    run.states.move("gpu0", run.workers["gpu0"], "paused")

    paused = run.run_status()
    assert paused.as_of == run.reported_at is not None
    assert paused.eta_next_epoch_s is None, "no estimate without a worker"
    assert (paused.epoch, paused.num_peers) == (7, 2)
    local = run.local_status()
    assert local.peer_id == "QmMine"
    assert (local.trained_samples, local.contributed_samples, local.unused_samples["late"]) == (980, 960, 20)
    assert local.samples_per_second is None
    assert local.workers[0].state == "paused"
    assert [peer.peer_id for peer in run.peers] == ["QmMine", "QmOther"]


def test_a_restarted_daemon_shows_the_paused_run_as_it_was_last_seen():
    run = training_view()
    run.workers["gpu0"].stopped()
    run.states.move("gpu0", run.workers["gpu0"], "paused")
    stored = json.loads(json.dumps(run.snapshot()))  # what the settings table keeps

    # the daemon starts the view with the manifest its desired state kept, then restores the rest
    restarted = RunView(run_id="r", manifest=run.manifest)
    restarted.restore(stored, "paused")

    assert restarted.run_status() == run.run_status()
    assert restarted.local_status() == run.local_status()
    assert [peer.to_dict() for peer in restarted.peers] == [peer.to_dict() for peer in run.peers]
    assert restarted.peers[0].is_local and not restarted.joined


class Settings:
    """The daemon database's settings table, no more (what ``RunControl`` saves the paused view in)."""

    def __init__(self):
        self.settings: dict = {}
        self.writes: list[str] = []

    def get_setting(self, key, default=None):
        return self.settings.get(key, default)

    def set_setting(self, key, value):
        self.settings[key] = value
        self.writes.append(key)
        return True


class Events:
    def record(self, kind, message, data=None):
        pass


class Process:
    def __init__(self):
        self.sent = []

    def send(self, command):
        self.sent.append(command)
        return True


def test_the_paused_view_is_saved_at_the_pause_and_again_once_the_worker_ended_with_its_last_totals():
    from p2ptrain.daemon.run_control import RunControl
    from p2ptrain.daemon.state import PAUSED_VIEW_KEY, TRAINING
    from p2ptrain.daemon.worker_pool import WorkerPool

    run, db = training_view(), Settings()
    pool = WorkerPool(paths=None, config=None, run=run, events=Events(), listener=None)
    control = RunControl(db, pool, run, Events(), listener=type("Daemon", (), {"state_changed": lambda self: None})())
    control.desired.run = {"run_id": "r"}
    control.lifecycle.enter(TRAINING)
    process = pool.processes["gpu0"] = Process()

    control.pause("user")

    assert run.workers["gpu0"].state == "pausing" and process.sent
    assert db.settings[PAUSED_VIEW_KEY]["workers"]["gpu0"]["trained_samples"] == 980
    # the worker finishes its step, checkpoints and ends
    run.apply_step("gpu0", step(8, 20.0, 2.4, trained=988, contributed=960, late=28))
    del pool.processes["gpu0"]
    control.worker_exited("gpu0", process, 0)

    assert run.workers["gpu0"].state == "paused"
    saved = db.settings[PAUSED_VIEW_KEY]
    assert (saved["workers"]["gpu0"]["trained_samples"], saved["workers"]["gpu0"]["loss"]) == (988, 2.4)
    restarted = RunView(run_id="r", manifest=run.manifest)
    restarted.restore(json.loads(json.dumps(saved)), "paused")
    assert restarted.local_status() == run.local_status()
