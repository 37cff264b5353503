"""A rogue in the averaging rounds, every attack at least 3 rounds long, beside a clean control run (issue 27).

    nice -n 10 .venv/bin/python benchmarks/rogue.py --modes diloco sync --json benchmarks/rogue_<date>.jsonl
    .venv/bin/python benchmarks/rogue.py --report benchmarks/rogue_<date>.jsonl

For each mode, the attack catalogue of ``tests/integration/test_faults_rogue.py``
(two honest workers started as the daemon starts them, on 127.0.0.1, and a rogue
process that joins their rounds one attack at a time under a fresh identity),
with every phase lasting until the rogue has joined ``--rounds`` rounds with an
honest peer (the noise: until both ban it, three rounds). Then a control run:
the same two honest workers, the same run, nobody else, trained to the same
epochs. Each phase is judged per honest peer by its validation loss two epochs
after the phase's last round against the control peer's at that same epoch
(``after ÷ control``), beside the attacked peer's own ``after ÷ before``.
Each mode appends one JSON row (phases, control curve, commit, date, machine,
load) to ``--json``; ``--report`` renders RESULTS.md's table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests"), str(HERE.parent / "tests" / "integration")]

BOUND = 1.10  # an attacked peer's loss after a phase, at most this times the control's at the same epoch


def control_curve(temp: Path, manifest: dict, until_epoch: int) -> dict[str, dict[int, float]]:
    """Validation loss by epoch of the two honest peers alone, up to ``until_epoch``."""
    from test_faults_rogue import start_honest_peers
    from test_worker_swarm import stop_all

    workers = []
    try:
        start_honest_peers(temp, manifest, workers)
        for worker in workers:
            worker.wait_for(lambda w: w.epoch() >= until_epoch, 1800, f"epoch {until_epoch} in the control run")
        return {worker.spec["nickname"]: {report["epoch"]: report["val_loss"] for report in worker.of_type("epoch")}
                for worker in workers}
    finally:
        stop_all(workers)


def measure(mode: str, rounds: int) -> dict:
    """The attacked run and its control for one mode."""
    from test_faults_rogue import attack_catalogue, diloco_catalogue_run, sync_catalogue_run

    manifest, prefixes = diloco_catalogue_run() if mode == "diloco" else sync_catalogue_run()
    with tempfile.TemporaryDirectory(prefix="p2ptrain-rogue-") as temp:
        phases = attack_catalogue(Path(temp) / "attacked", manifest, prefixes, rounds_per_phase=rounds)
    last = max(row["after"]["epoch"] for row in phases)
    with tempfile.TemporaryDirectory(prefix="p2ptrain-rogue-control-") as temp:
        control = control_curve(Path(temp), {**manifest, "run_id": manifest["run_id"] + "-control"}, last)
    return {"mode": mode, "rounds_per_phase": rounds, "manifest": manifest, "phases": phases,
            "control": {peer: {str(epoch): loss for epoch, loss in curve.items()} for peer, curve in control.items()}}


def control_at(row: dict, peer: str, epoch: int) -> float | None:
    """The control peer's validation loss at ``epoch`` (the nearest later epoch it reported)."""
    curve = {int(e): loss for e, loss in row["control"].get(peer, {}).items()}
    later = [e for e in curve if e >= epoch]
    return curve[min(later)] if later else None


def report(path: Path) -> str:
    """RESULTS.md's table of the rows in ``path``: per mode, attack and honest peer."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    lines = ["| mode | attack | peer | rogue's rounds | before (epoch) | after (epoch) | after ÷ before | control at that epoch | "
             "after ÷ control | named for |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    worst = {}
    for row in rows:
        for phase in row["phases"]:
            before, after = phase["before"], phase["after"]
            control = control_at(row, phase["peer"], after["epoch"])
            versus = after["val_loss"] / control if control else None
            if versus is not None:
                worst[row["mode"]] = max(worst.get(row["mode"], 0.0), versus)
            lines.append(f"| {row['mode']} | {phase['attack']} | {phase['peer']} | {phase['rounds']} | {before['val_loss']:.3f} "
                         f"({before['epoch']}) | {after['val_loss']:.3f} ({after['epoch']}) | "
                         f"{after['val_loss'] / before['val_loss']:.3f} | {f'{control:.3f}' if control else 'n/a'} | "
                         f"{f'{versus:.3f}' if versus else 'n/a'} | {', '.join(phase['reasons'])} |")
    lines.append("")
    for row in rows:
        mode = row["mode"]
        verdict = "met" if worst.get(mode, float("inf")) <= BOUND else "not met"
        lines.append(f"- {mode} ({row['date']}, commit {row['commit'][:7]}, 1-min load {row['load'][0]:.1f}): the worst "
                     f"after ÷ control is {worst.get(mode, float('nan')):.3f} (bound <= {BOUND:.2f} per phase and peer): {verdict}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=["diloco", "sync"], default=["diloco", "sync"])
    parser.add_argument("--rounds", type=int, default=3, help="rounds the rogue joins in each phase (at least)")
    parser.add_argument("--json", type=Path, help="append each mode's row to this JSON-lines file")
    parser.add_argument("--report", type=Path, help="print the table of this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    from run_facts import facts

    for mode in args.modes:
        row = {"benchmark": "rogue", **facts(), **measure(mode, args.rounds)}
        if args.json:
            with args.json.open("a") as file:
                file.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    if args.json:
        print(report(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
