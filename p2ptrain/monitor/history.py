"""What the run monitor keeps of a run: its latest swarm view, and loss and throughput over time, in memory.

Fed one ``worker_pipe.Swarm`` per read of the DHT (``peers/swarm/view.py:
read_swarm``), it answers ``/api/run.json`` (:meth:`RunHistory.to_json`), which
the page and ``/metrics`` are drawn from. Nothing is stored on disk: a
restarted monitor starts its curves afresh.

Bounds, since anyone may publish records in a run: each series keeps its last
``max_points`` points (a day at the default 15 s between reads), and at most
``MAX_PEERS`` peers are remembered, those gone longest forgotten first.
"""

from __future__ import annotations

from collections import deque

from p2ptrain.worker_pipe import PeerRow, Swarm

MAX_PEERS = 1000
DEFAULT_MAX_POINTS = 5760
MAX_EPOCHS = 1000


class RunHistory:
    """The run as the monitor has seen it since it started.

    Args:
        run: the run's facts from its manifest: ``id``, ``mode``, ``model``,
            ``manifest_hash``, ``target_batch_size`` (the keys of ``status.run``).
        max_points: points kept per series (loss per peer, speed per peer, the run's throughput).
    """

    def __init__(self, run: dict, max_points: int = DEFAULT_MAX_POINTS):
        self.run = dict(run)
        self.max_points = max_points
        self.peers: dict[str, dict] = {}  # peer id -> the PeerRow's fields, "present" and "first_seen"
        self.loss: dict[str, deque] = {}  # peer id -> (record time, loss)
        self.speed: dict[str, deque] = {}  # peer id -> (record time, samples per second)
        self.throughput: deque = deque(maxlen=max_points)  # (read time, samples/s summed, epoch, compatible peers)
        self.epochs: deque = deque(maxlen=MAX_EPOCHS)  # {"epoch", "at", "peers"}: each epoch the monitor saw begin
        self.rounds: dict[int, dict[str, int]] = {}  # epoch -> peer id -> peers in the round that took it there
        self.swarm: Swarm | None = None
        self.reads = 0
        self.read_errors = 0
        self.last_error: str | None = None
        self.read_at: float | None = None

    def add(self, swarm: Swarm, at: float) -> None:
        """Take one read of the swarm, made at Unix time ``at``."""
        if self.swarm is not None and swarm.epoch > self.swarm.epoch:
            self.epochs.append({"epoch": swarm.epoch, "at": at, "peers": swarm.num_peers})
            self.run["last_epoch_at"] = at
        self.swarm = swarm
        self.reads += 1
        self.read_at = at
        self.last_error = None
        seen = {row.peer_id for row in swarm.peers}
        for peer in self.peers.values():
            peer["present"] = peer["peer_id"] in seen
        for row in swarm.peers:
            self._add_peer(row, at)
        speed = sum(row.samples_per_second or 0.0 for row in swarm.peers if row.compatible)
        self.throughput.append((at, speed, swarm.epoch, swarm.num_peers))
        self._forget_the_longest_gone()

    def failed(self, message: str, at: float) -> None:
        """A read that failed (the DHT did not answer in time): counted, and shown until the next one succeeds."""
        self.read_errors += 1
        self.last_error = message
        self.read_at = at

    def _add_peer(self, row: PeerRow, at: float) -> None:
        fields = row.to_dict()
        del fields["is_local"], fields["banned"]  # the monitor is no peer of the run, and bans nobody
        known = self.peers.get(row.peer_id)
        self.peers[row.peer_id] = {**fields, "present": True, "first_seen": known["first_seen"] if known else at}
        # a record is republished every 30 s: one point per record, however often the monitor reads
        when = row.last_seen if row.last_seen is not None else at
        if row.loss is not None:
            self._append(self.loss, row.peer_id, when, row.loss)
        if row.samples_per_second is not None:
            self._append(self.speed, row.peer_id, when, row.samples_per_second)
        if row.last_group and row.epoch is not None:
            self.rounds.setdefault(row.epoch, {})[row.peer_id] = row.last_group
            for epoch in sorted(self.rounds)[:-MAX_EPOCHS]:
                del self.rounds[epoch]

    def _append(self, series: dict[str, deque], peer_id: str, when: float, value: float) -> None:
        points = series.setdefault(peer_id, deque(maxlen=self.max_points))
        if points and points[-1][0] >= when:
            return
        points.append((when, value))

    def _forget_the_longest_gone(self) -> None:
        if len(self.peers) <= MAX_PEERS:
            return
        gone = sorted((peer for peer in self.peers.values() if not peer["present"]), key=lambda peer: peer["last_seen"] or 0)
        for peer in gone[: len(self.peers) - MAX_PEERS]:
            for table in (self.peers, self.loss, self.speed):
                table.pop(peer["peer_id"], None)

    def run_status(self) -> dict:
        """The run as ``status.run`` shapes it, plus ``samples_per_second`` (the compatible peers' speeds, summed)."""
        swarm = self.swarm
        return {
            **self.run,
            "epoch": swarm.epoch if swarm else None,
            "samples_accumulated": swarm.samples_accumulated if swarm else None,
            "eta_next_epoch_s": swarm.eta_next_epoch_s if swarm else None,
            "num_peers": swarm.num_peers if swarm else None,
            "samples_per_second": self.throughput[-1][1] if self.throughput else None,
        }

    def bans(self) -> list[dict]:
        """Each peer that a present peer bans: ``peer_id``, ``nickname`` (when the monitor knows it)
        and ``by``, the peer ids of the present peers that ban it."""
        banned: dict[str, list[str]] = {}
        for peer in self.peers.values():
            if peer["present"]:
                for peer_id in peer.get("bans") or ():
                    banned.setdefault(peer_id, []).append(peer["peer_id"])
        return [
            {"peer_id": peer_id, "nickname": (self.peers.get(peer_id) or {}).get("nickname"), "by": sorted(by)}
            for peer_id, by in sorted(banned.items())
        ]

    def to_json(self) -> dict:
        """``/api/run.json``: ``run``, ``peers`` (present ones first, then by nickname), ``epochs``
        (newest last), ``rounds`` (``epoch`` and ``groups``, peer id -> peers in the averaging round
        that took it to that epoch, as the peers' records say; newest last), ``bans`` (:meth:`bans`),
        ``series`` (``throughput``: [time, samples/s, epoch, peers]; ``loss`` and
        ``samples_per_second``: peer id -> [time, value]) and ``reads``."""
        peers = sorted(self.peers.values(), key=lambda peer: (not peer["present"], peer["nickname"] or "", peer["peer_id"]))
        return {
            "run": self.run_status(),
            "peers": peers,
            "epochs": list(self.epochs),
            "rounds": [{"epoch": epoch, "groups": self.rounds[epoch]} for epoch in sorted(self.rounds)],
            "bans": self.bans(),
            "series": {
                "throughput": [list(point) for point in self.throughput],
                "loss": {peer_id: [list(point) for point in points] for peer_id, points in self.loss.items()},
                "samples_per_second": {peer_id: [list(point) for point in points] for peer_id, points in self.speed.items()},
            },
            "reads": {"count": self.reads, "failed": self.read_errors, "last_error": self.last_error, "at": self.read_at},
        }
