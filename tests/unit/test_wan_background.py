"""The WAN lab's background table (``wan.background_report``, RESULTS.md's ``wan-background``) from a small
synthetic ``--json`` file: each budget kind's range over the peers, the sums, the goal, ``other`` beside them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import wan  # noqa: E402


def peer(matchmaking, progress, metrics, dht, other) -> dict:
    return {"averaging": 500_000.0, "matchmaking": matchmaking, "progress": progress, "metrics": metrics, "dht": dht,
            "other": other}


def row(mode, background_only, reached, peers, paused_received=0.0, **extra) -> dict:
    return {"mode": mode, "background_only": background_only, "target_loss": 3.5, "reached_s_from_creation": reached,
            "wire_window_s": 180.2, "best_val_loss": 3.1, "training_peer_kinds_bytes_per_s": peers,
            "paused_line_bytes_per_s": {"pub": {"sent": 0.0, "received": paused_received},
                                        "h1": {"sent": 0.0, "received": 0.0}},
            "load": [1.25, 1.0, 1.0], **extra}


def test_the_background_table_renders_each_run_from_the_peers_meters(tmp_path):
    rows = [
        row("sync", True, None, {"pub": peer(1000, 2000, 100, 500, 30_000), "h1": peer(200, 300, 100, 1500, 4000),
                                 "h2": peer(200, 350, 100, 1200, 0), "h3": peer(150, 300, 140, 1300, 9000)},
            paused_received=3.5, commit="0123456789abcdef-dirty", load_while_training=[4.0, 3.0, 2.0]),
        row("diloco", False, 290.4, {"pub": peer(1000, 1000, 100, 9100, 0), "h1": peer(100, 100, 100, 700, 1000),
                                     "h2": peer(100, 100, 100, 700, 1000), "h3": peer(100, 100, 100, 700, 1000)},
            commit="fedcba9876543210", not_paused=["h1", "h3"]),
        row("sync", False, None, {"pub": peer(0, 0, 0, 0, 0), "h1": peer(0, 0, 0, 0, 0)}),
    ]
    del rows[2]["background_only"]  # a row of before wan.py recorded the flag
    path = tmp_path / "wan.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in rows))
    lines = wan.background_report(path).splitlines()
    assert len(lines) == 5
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[:8] == ["run", "matchmaking", "progress", "metrics", "dht", "sum: pub", "sum: homes", "**mean of 4**"]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    # sums: pub 3.6, homes 2.1, 1.85, 1.89 KB/s; mean 2.36
    assert cells[0] == ["sync, background only (180 s of 4 training)", "0.15-1.00", "0.30-2.00", "0.10-0.14",
                        "0.50-1.50", "3.60", "1.85-2.10", "**2.36**", "met (worst pub: 3.60)", "30.00 / 0.00-9.00",
                        "3.5", "0123456-dirty, 4.0; 1.2"]
    # the public peer at 11.2 KB/s: not met, though the mean (3.55) is under the goal
    assert cells[1][0] == "diloco, to loss 3.5 (reached at 290 s; 180 s of 4 training)"
    assert cells[1][4:10] == ["0.70-9.10", "11.20", "1.00", "**3.55**", "**not met** (worst pub: 11.20)",
                              "0.00 / 1.00"]
    assert cells[1][10:] == ["0.0 (no answer to pause: h1, h3)", "fedcba9, 1.2"]
    assert cells[2][0] == "sync, 180 s of 4 training, best loss 3.10" and cells[2][11] == "not kept, 1.2"
