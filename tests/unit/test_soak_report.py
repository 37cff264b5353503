"""``benchmarks/soak.py``'s RESULTS.md table (``report``) from a small synthetic ``--json`` file: a column
per run, sync first, a mode that ran twice numbered, every cell from the file's rows and kills."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import results  # noqa: E402
import soak  # noqa: E402


def row(minute: float, training: int, of: int, p0_mib: int, downloads: int = 0) -> dict:
    names = [f"p{number}" for number in range(of)]
    return {"minute": minute, "time": "10:00:00", "global_epoch": int(minute * 2), "peer_epochs": {name: 1 for name in names},
            "states": {name: "joining" for name in names[training:]}, "attempted": 4, "succeeded": 3,
            "downloads": downloads, "totals": {"downloads": downloads}, "rss_mib": {"p0": p0_mib}, "load": 1.0, "churn": "x"}


def run(mode: str, commit: str, *, kills: list[dict], left_behind: list[str] = ()) -> dict:
    rows = [row(0.0, 4, 4, 1000), row(1.0, 4, 4, 1040, 2), row(3.1, 3, 4, 1060, 1), row(4.2, 2, 4, 1055, 3)]
    rows[-1]["totals"]["downloads"] = 9
    return {"benchmark": "soak", "commit": commit, "date": "2026-11-27T11:00:00+00:00",
            "machine": {"cpu": "x", "cores": 2, "memory_gib": 23.5, "torch": "2", "python": "3"}, "load": [1.5, 1, 1],
            "load_end": [2.25, 1, 1], "mode": mode, "peers": 4, "minutes": 4.0, "churn_every_s": 60.0, "churns": 4,
            "rows": rows, "kills": kills, "attempted": 12, "succeeded": 9, "success_share": 0.75, "epochs_advanced": 8,
            "downloads": 6, "downloads_total": 9,
            "rss_growth": {"p0#0": {"minutes": 4.2, "first_mib": 1000, "last_mib": 1055, "mib_per_10_min": 131.0,
                                    "uss_mib_per_10_min": 120.0}},
            "left_behind": list(left_behind), "home": "/tmp/p2p-soak-x"}


def cells(table: str) -> dict[str, list[str]]:
    lines = table.splitlines()
    body = {line.split(" | ")[0].lstrip("| "): [cell.strip(" |") for cell in line.split(" | ")[1:]] for line in lines[2:]}
    body["head"] = [cell.strip(" |") for cell in lines[0].split(" | ")[1:]]
    return body


def test_report_has_a_column_per_run_with_its_cells(tmp_path):
    data = tmp_path / "soak.jsonl"
    kill = {"minute": 2.0, "peer": "p2", "processes": 7}
    data.write_text("\n".join(json.dumps(line) for line in [
        run("diloco", "d" * 40, kills=[{**kill, "still_up": 0, "gone_s": 27.6}, {**kill, "still_up": 2, "gone_s": None}],
            left_behind=["123 p2pd"]),
        run("sync", "a" * 40, kills=[{**kill, "still_up": 0, "gone_s": 8.4}, {**kill, "still_up": 0, "gone_s": 6.3}]),
        run("sync", "b" * 40 + "-dirty", kills=[{**kill, "still_up": 0, "gone_s": 5.0}]),
    ]) + "\n")
    table = cells(soak.report(data))
    assert table["head"] == ["sync #1", "sync #2", "diloco"]
    assert table["run"][0] == "4 peers, 4 min, a churn every 60 s (4 churns)"
    assert table["epochs advanced during the churn"] == ["8", "8", "8"]
    assert table["averaging rounds with >= 2 peers / attempted"][0] == "9 / 12 (0.75)"
    assert table["state downloads during the churn (peers that fell behind or joined)"][0] == "6 (9 from the start)"
    assert table["peers training from minute 3 on"][0] == "2–3 of 4"
    # growth over the life, then the second half of the run (rows from minute 2 on: 3.1 and 4.2)
    assert table["RSS growth of the peer that stayed (p0), MiB per 10 min"][0] == \
        "+131 (1000 → 1055 MiB in 4.2 min); -5 MiB from minute 3.1 to 4.2"
    kills = table["a SIGKILLed daemon's processes gone after"]
    assert kills == ["6.3, 8.4 s (2 kills)", "5.0 s (1 kill)", "27.6 s; 1 with processes still up after 30 s (2 kills)"]
    assert table["processes left behind at the end"] == ["0", "0", "1"]
    assert table["measured"][1] == "commit bbbbbbbbb-dirty, 2026-11-27T11:00:00+00:00, 2 cores, load 1.5 at the start, 2.2 at the end (1 min)"


def test_results_py_renders_soak_tables_with_report(tmp_path):
    data = tmp_path / "soak.jsonl"
    data.write_text(json.dumps(run("sync", "c" * 40, kills=[])) + "\n")
    assert results.RENDERERS["soak"](data) == soak.report(data)
    table = cells(soak.report(data))
    assert table["head"] == ["sync"] and table["a SIGKILLed daemon's processes gone after"] == ["no kill"]
