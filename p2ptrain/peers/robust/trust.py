"""Who misbehaves in this peer's averaging rounds: suspects, bans (in the training worker's process).

Each ``RobustAverager`` reports, once per round, the peers its reducers named
(``robust_reduce``: an outlier piece, NaN, an implausible weight, a replayed
piece; ``robust_allreduce``: a result far from ours; ``state_check``: a state
far from ours). ``Trust.collect`` turns those reports into the worker's events:

- ``suspect-peer`` for each peer named in a round: its peer id, the epoch, the
  round (hivemind's group id), why (``reason``, and ``detail`` where the reducer
  said more: a refused state's problem), the ratio (how far past the bound) and
  how many rounds it was named in so far;
- ``peer-banned`` when a peer has been named in ``BAN_AFTER_ROUNDS`` (3)
  rounds: from then on this peer's averagers refuse its join requests, leave
  its pieces and results out of their rounds, and skip it when downloading
  state, for the rest of the run. The daemon stores the ban (the ``bans`` table)
  and hands the run's bans to the next worker it starts (``banned_peers`` in the
  spec), so a ban survives a restart until ``p2ptrain unban``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Protocol

logger = logging.getLogger(__name__)

BAN_AFTER_ROUNDS = 3

REASON_WORDS = {
    "outlier": "a piece far from everyone else's (clipped)",
    "non-finite": "NaN or infinity",
    "implausible-weight": "an implausible sample count",
    "implausible-update": "values no honest update can hold",
    "far-from-own": "a piece far from ours",
    "replayed": "the same piece as in an earlier round",
    "bad-result": "back an average far from our own piece",
    "bad-state": "a state far from ours",
}


class ReportingAverager(Protocol):
    """What ``Trust`` needs of an averager (``robust_averager.RobustAverager``)."""

    averaging_name: str

    def pop_round_reports(self) -> list[dict]: ...

    def set_banned(self, peer_ids: Iterable[str]) -> None: ...


@dataclasses.dataclass
class TrustEvent:
    """An event for the worker to report: ``kind`` (``suspect-peer`` or ``peer-banned``), ``message``, ``data``."""

    kind: str
    message: str
    data: dict


class Trust:
    """This peer's count of who was named in its rounds, and its ban list.

    Args:
        banned: peer ids (base58) banned earlier in this run (the daemon's ``bans``).
        ban_after: rounds a peer may be named in before it is banned.
    """

    def __init__(self, banned: Iterable[str] = (), ban_after: int = BAN_AFTER_ROUNDS):
        self.banned: set[str] = set(banned)
        self.ban_after = ban_after
        self.named_rounds: dict[str, int] = {}
        self._averagers: list[ReportingAverager] = []

    def attach(self, averager: ReportingAverager) -> None:
        """Collect ``averager``'s reports and keep its ban list in step with this one."""
        self._averagers.append(averager)

    def collect(self, epoch: int) -> list[TrustEvent]:
        """The events of the rounds reported since the last call (``epoch``: this peer's epoch now)."""
        events = []
        newly_banned = []
        for averager in self._averagers:
            for report in averager.pop_round_reports():
                # a peer named for several things in one round (as a sender and as a reducer) counts once
                worst = {}
                for suspect in report.get("suspects", []):
                    if suspect["peer_id"] not in worst or suspect["ratio"] > worst[suspect["peer_id"]]["ratio"]:
                        worst[suspect["peer_id"]] = suspect
                for suspect in worst.values():
                    events += self._named(suspect, report, averager.averaging_name, epoch, newly_banned)
        if newly_banned:
            self._push_bans()
        return events

    def _named(self, suspect: dict, report: dict, averaging: str, epoch: int, newly_banned: list[str]) -> list[TrustEvent]:
        peer_id = suspect["peer_id"]
        if peer_id in self.banned:
            return []
        rounds = self.named_rounds[peer_id] = self.named_rounds.get(peer_id, 0) + 1
        reason, ratio = suspect["reason"], float(suspect["ratio"])
        sent = "returned" if reason == "bad-result" else "served" if reason == "bad-state" else "sent"
        detail = suspect.get("detail")
        events = [TrustEvent(
            "suspect-peer",
            f"peer {peer_id} {sent} {REASON_WORDS.get(reason, reason)}{f' ({detail})' if detail else ''} in a "
            f"{averaging} round (ratio {ratio:.3g}); named in {rounds} round{'s' if rounds > 1 else ''}",
            {"peer_id": peer_id, "epoch": epoch, "round": report.get("group"), "reason": reason, "ratio": ratio,
             "role": suspect.get("role"), "averaging": averaging, "rounds_named": rounds, "detail": detail},
        )]
        if rounds >= self.ban_after:
            self.banned.add(peer_id)
            newly_banned.append(peer_id)
            events.append(TrustEvent(
                "peer-banned",
                f"banned peer {peer_id} from this peer's rounds and state downloads for the rest of the run: "
                f"named in {rounds} rounds (last: {REASON_WORDS.get(reason, reason)}); p2ptrain unban {peer_id} lifts it",
                {"peer_id": peer_id, "epoch": epoch, "reason": reason, "rounds_named": rounds},
            ))
        return events

    def unban(self, peer_ids: Iterable[str] | None) -> list[str]:
        """Lift the bans of ``peer_ids`` (all when None) and forget their rounds; returns those lifted."""
        forgotten = list(self.named_rounds) if peer_ids is None else list(peer_ids)
        lifted = sorted(self.banned if peer_ids is None else self.banned & set(forgotten))
        self.banned -= set(lifted)
        for peer_id in forgotten:
            self.named_rounds.pop(peer_id, None)
        self._push_bans()
        return lifted

    def _push_bans(self) -> None:
        for averager in self._averagers:
            try:
                averager.set_banned(self.banned)
            except Exception:
                logger.exception("Could not hand the ban list to %s", averager.averaging_name)
