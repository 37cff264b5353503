"""``Trust``: the averagers' round reports become suspect-peer and peer-banned events."""

from __future__ import annotations

from p2ptrain.peers.robust.trust import Trust


class ReportingAverager:
    """An averager as ``Trust`` sees it: round reports to hand over, a ban list to take."""

    averaging_name = "state"

    def __init__(self):
        self.reports: list[dict] = []
        self.banned: set[str] = set()

    def pop_round_reports(self) -> list[dict]:
        reports, self.reports = self.reports, []
        return reports

    def set_banned(self, peer_ids) -> None:
        self.banned = set(peer_ids)


def refused_state(peer_id: str, problem: str) -> dict:
    return {"time": 0.0, "group": None, "senders": 0,
            "suspects": [{"peer_id": peer_id, "reason": "bad-state", "ratio": float("inf"), "role": "state", "detail": problem}]}


def test_a_refused_state_names_its_peer_with_the_problem_and_three_rounds_ban_it():
    averager = ReportingAverager()
    trust = Trust()
    trust.attach(averager)
    for _ in range(3):
        averager.reports.append(refused_state("QmRogue", "a tensor holds non-finite values"))
    events = trust.collect(epoch=4)
    assert [event.kind for event in events] == ["suspect-peer"] * 3 + ["peer-banned"]
    first = events[0]
    assert "served a state far from ours (a tensor holds non-finite values)" in first.message, first.message
    assert first.data["detail"] == "a tensor holds non-finite values" and first.data["epoch"] == 4
    assert averager.banned == {"QmRogue"}
    # a banned peer is not named again
    averager.reports.append(refused_state("QmRogue", "again"))
    assert trust.collect(epoch=5) == []


def test_a_peer_named_twice_in_one_round_counts_once_and_a_report_without_detail_says_none():
    averager = ReportingAverager()
    trust = Trust()
    trust.attach(averager)
    averager.reports.append({"group": "g1", "suspects": [
        {"peer_id": "QmA", "reason": "outlier", "ratio": 2.0, "role": "sender"},
        {"peer_id": "QmA", "reason": "bad-result", "ratio": 5.0, "role": "reducer"},
    ]})
    events = trust.collect(epoch=1)
    assert len(events) == 1 and events[0].data["reason"] == "bad-result" and events[0].data["detail"] is None
    assert "returned back an average far from our own piece in a state round (ratio 5)" in events[0].message
