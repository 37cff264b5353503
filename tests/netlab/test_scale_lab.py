"""The scale lab's smoke run (``benchmarks/scale.py``): two daemons, one behind NAT, measured as the benchmark does.

The benchmark itself measures N = 2, 4, 8 for minutes each (RESULTS.md); this
runs it for N = 2 with a short window in which the peer behind NAT leaves and
joins again (``--churn``, a seed whose schedule is one leave at 29 s and one
join at 53 s; every peer computes half the time, ``--compute-share 0.5``), so a
change that breaks the lab or what it measures fails here, and checks the row
against what two peers must show, and the peer behind NAT's request log: it
serves no DHT request once its reachability was measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(900)]

SCALE = Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"
REACHABILITY_MEASURED_S = 30  # a worker's DHT serves until its dial-back check says nobody dials it directly


def late_serves(log_directory: Path) -> list[str]:
    """The DHT requests a peer answered later than ``REACHABILITY_MEASURED_S`` after its DHT process began
    (its request log has a file a process, ``p2ptrain/peers/net/request_log.py``)."""
    late = []
    for path in sorted(log_directory.glob("*.tsv")):
        lines = [line.split("\t") for line in path.read_text(errors="replace").splitlines()]
        lines = [fields for fields in lines if len(fields) == 7]
        began = float(lines[0][0]) if lines else 0.0
        late += ["\t".join(fields) for fields in lines
                 if fields[1] == "serve" and float(fields[0]) - began > REACHABILITY_MEASURED_S]
    return late


def test_two_peers_one_behind_nat_join_and_the_lab_measures_their_costs(lab_machine, tmp_path):
    data = tmp_path / "scale.jsonl"
    result = subprocess.run(
        [sys.executable, str(SCALE), "--peers", "2", "--train-s", "120", "--churn", "--session-s", "30", "--away-s", "15",
         "--pause-share", "0.5", "--seed", "5", "--compute-share", "0.5", "--json", str(data), "--request-log", str(tmp_path / "requests")],
        capture_output=True, text=True, timeout=840,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = [json.loads(line) for line in data.read_text().splitlines()]
    assert row["peers"] == 2 and set(row["join_s"]) == {"pub", "h1"} and row["join"]["worst"] < 600
    # Not asserted: that the window holds an epoch. A 2-peer sync swarm in this lab now and then made none for a
    # minute before a73a947 (the 4-peer stall in RESULTS.md, fixed there); the benchmark measures it, this smoke
    # run does not judge it.
    for name in ("pub", "h1"):
        assert row["rounds_taken"][name] <= row["epochs"] + 1, (row["rounds_taken"], row["epochs"])
        assert set(row["group_sizes"][name]) <= {"1", "2"}, row["group_sizes"]
        # None: the peer's status counted no trained sample at the end (once here, cause not found: the message
        # carries what the row knew)
        assert row["used_over_trained"][name] is not None and 0 < row["used_over_trained"][name] <= 1.0, \
            (name, row["used_over_trained"], row["churn"]["moves"], row["churn"]["returns"], row["join_phases"], row["epochs"])
    # both lines carried traffic; the meters put some upkeep beside the averaging, below twice the 10 KB/s budget
    assert row["line_bytes_per_s_per_peer"]["mean"] > 0 and row["background_bytes_per_s"]["mean"] > 0, row["meter_bytes_per_s"]
    assert row["background_bytes_per_s"]["worst"] < 20_000, row["meter_bytes_per_s"]
    assert "commit" in row and "machine" in row and len(row["load"]) == 3
    # the churn: h1 left and joined again through the CLI, and its return was timed
    assert [(move["action"], move["returncode"]) for move in row["churn"]["moves"]] == [("leave", 0), ("join", 0)], row["churn"]["moves"]
    assert [entry["peer"] for entry in row["churn"]["returns"]] == ["h1"], row["churn"]["returns"]
    for phases in row["churn"]["return_phases"]:  # the return's worker started, downloaded the state, then contributed
        assert phases["peer"] == "h1" and 0 < phases["calibrated"] <= phases["joined"] <= phases["used"], row["churn"]
    # every state download names the peer that served it, and only pub can (h1 averages as a client)
    assert row["state_downloads"]["count"] >= 1 and set(row["state_downloads"]["by_server"]) == {"pub"}, row["state_downloads"]
    assert set(row["state_downloads"]["by_peer"]) == {"h1"}, row["state_downloads"]  # the one that returned downloads
    assert set(row["missed_rounds"]) == {"pub", "h1"}, row["missed_rounds"]
    # h1 is behind NAT: once it knew, it answered no DHT request (they came through pub's relay before)
    assert list((tmp_path / "requests" / "n2" / "h1").glob("*.tsv")), "h1 logged no request"
    late = late_serves(tmp_path / "requests" / "n2" / "h1")
    assert not late, f"{len(late)} DHT requests answered by h1, the first: {late[:3]}"
    assert row["compute_share"] == 0.5  # every daemon was set to rest half the time, through the CLI
    assert "| 2 (1) at 50% |" in subprocess.run([sys.executable, str(SCALE), "--report", str(data)], capture_output=True,
                                     text=True, timeout=60, check=True).stdout
