"""Volunteers coming and going for a lab benchmark (``scale.py --churn``): a random schedule and its driver.

Each churning peer alternates sessions and absences of exponential lengths
(a volunteer's day, compressed in time). An absence is a ``leave`` and a later
``join`` of the run, or, for a share of them, a ``pause`` and a ``resume``.
Newcomers join the running swarm for the first time, once each.
The schedule is drawn from a seed, so a run can be repeated; ``Churn`` carries
it out against real daemons through the CLI and records, for every return,
how long the peer took to contribute a sample again, and, for every peer, the
stretches of time it was training (from its first contribution of a session
to the command that ended it).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Move:
    """One step of the schedule: at ``at`` seconds into the window, ``peer`` does ``action``
    (``leave``, ``join``, ``pause`` or ``resume``)."""

    at: float
    peer: str
    action: str


RETURNS = {"leave": "join", "pause": "resume"}


def schedule(peers: list[str], window_s: float, session_s: float, away_s: float, pause_share: float, seed: int,
             newcomers: list[str] = (), newcomers_between: tuple[float, float] = (0.0, 0.0)) -> list[Move]:
    """Every peer's leaves and returns within ``window_s`` seconds, in time order.

    Args:
        peers: the peers that come and go (each is training at the start).
        window_s: the length of the window; a peer still away at its end stays away.
        session_s: the mean session length (exponential), seconds.
        away_s: the mean absence (exponential), seconds.
        pause_share: the share of absences that are a pause and resume rather than a leave and join.
        seed: the random generator's seed.
        newcomers: peers that join the run for the first time during the window (they are not in it at the
            start), each once at a moment drawn evenly from ``newcomers_between`` (seconds into the window),
            and then stay.
    """
    draw = random.Random(seed)
    moves = []
    for peer in peers:
        now = draw.expovariate(1 / session_s)
        while now < window_s:
            going = "pause" if draw.random() < pause_share else "leave"
            moves.append(Move(now, peer, going))
            now += draw.expovariate(1 / away_s)
            if now >= window_s:
                break
            moves.append(Move(now, peer, RETURNS[going]))
            now += draw.expovariate(1 / session_s)
    moves += [Move(draw.uniform(*newcomers_between), peer, "join") for peer in newcomers]  # drawn last: the others' as before
    return sorted(moves, key=lambda move: move.at)


@dataclass
class Churn:
    """Carries out a schedule against real daemons and records what each return cost.

    Each peer's moves run in order in a thread of its own: a move starts at its time in the
    schedule, or when the peer's previous command has answered, whichever is later.

    Args:
        daemons: name -> daemon (``tests/daemons.py``) of every peer in the swarm.
        command: runs the CLI against a daemon: ``command(daemon, *arguments)`` returns a completed process.
        join_arguments: the ``join`` command's arguments (the run's name, ``--peers`` and its address).
        contributed: reads a daemon's contributed samples for the run now (its status), or None while
            it has no training worker. A return's baseline is the first number its new worker shows:
            a worker that joins again shows its checkpoint's totals at once, and only samples past
            those are new (a round that ended before the first reading makes the return look one
            round slower, never faster).
        newcomers: peers not in the run at the start (``schedule``'s newcomers): their first ``join``
            is recorded among ``returns`` with ``"first": True``.
    """

    daemons: dict
    command: object
    join_arguments: list[str]
    contributed: object
    newcomers: frozenset = frozenset()
    returns: list[dict] = field(default_factory=list)
    moves: list[dict] = field(default_factory=list)
    training: dict[str, list[list[float]]] = field(default_factory=dict)
    _waiting: dict[str, dict] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, moves: list[Move], window_s: float, every_s: float = 2.0, sample=None) -> None:
        """Carry out ``moves`` over ``window_s`` seconds from now; ``sample(live)`` is called every
        ``every_s`` with the peers training then (for meters)."""
        start = time.time()
        for name in self.daemons:
            self.training[name] = [] if name in self.newcomers else [[start, None]]
        threads = [threading.Thread(target=self._carry_out, args=(start, [move for move in moves if move.peer == name], start + window_s),
                                    daemon=True) for name in self.daemons]
        for thread in threads:
            thread.start()
        while time.time() - start < window_s:
            with self._lock:
                waiting = list(self._waiting.items())
            for name, record in waiting:
                now = self.contributed(self.daemons[name])
                if now is not None and record["baseline"] is None:
                    record["baseline"] = now
                elif now is not None and now > record["baseline"]:
                    arrived = time.time()
                    with self._lock:
                        if self._waiting.get(name) is record:
                            self.returns.append({"peer": name, "action": record["action"], "at": record["at"],
                                                 "seconds": arrived - record["at"], "first": record["first"]})
                            self.training[name].append([arrived, None])
                            del self._waiting[name]
            if sample is not None:
                sample(self.live())
            time.sleep(every_s)
        end = time.time()
        with self._lock:
            for name, record in self._waiting.items():
                self.returns.append({"peer": name, "action": record["action"], "seconds": None, "first": record["first"]})
            self._waiting.clear()
            for spans in self.training.values():
                if spans and spans[-1][1] is None:
                    spans[-1][1] = end
        for thread in threads:
            thread.join(timeout=180)

    def live(self) -> list[str]:
        """The peers training now (their session has contributed and not ended)."""
        with self._lock:
            return [name for name, spans in self.training.items() if spans and spans[-1][1] is None]

    def _carry_out(self, start: float, moves: list[Move], end: float) -> None:
        """One peer's moves, in order (in its own thread)."""
        for move in moves:
            time.sleep(max(0.0, start + move.at - time.time()))
            if time.time() >= end:
                return
            daemon = self.daemons[move.peer]
            record = {"peer": move.peer, "action": move.action, "at": time.time(),
                      "baseline": None if move.action not in RETURNS else self.contributed(daemon),
                      "first": move.peer in self.newcomers and not self.training[move.peer]}
            with self._lock:
                if move.action in RETURNS:
                    spans = self.training[move.peer]
                    if spans and spans[-1][1] is None:
                        spans[-1][1] = record["at"]
                    unfinished = self._waiting.pop(move.peer, None)
                    if unfinished is not None:  # it left again before contributing
                        self.returns.append({"peer": move.peer, "action": unfinished["action"], "seconds": None,
                                             "first": unfinished["first"]})
                else:
                    self._waiting[move.peer] = record
            done = self.command(daemon, move.action, *(self.join_arguments if move.action == "join" else []))
            with self._lock:
                self.moves.append({**record, "returncode": done.returncode, "seconds": time.time() - record["at"],
                                   "error": done.stderr.strip()[-200:] if done.returncode else None})
