"""A rogue in the averaging rounds, every attack at least 3 rounds long, beside clean control runs of the same run (issue 27).

    nice -n 10 .venv/bin/python benchmarks/rogue.py --modes diloco sync --json benchmarks/rogue_<date>.jsonl
    .venv/bin/python benchmarks/rogue.py --report benchmarks/rogue_<date>.jsonl

For each mode, the attack catalogue of ``tests/integration/test_faults_rogue.py``
(two honest workers started as the daemon starts them, on 127.0.0.1, and a rogue
process that joins their rounds one attack at a time under a fresh identity),
with every phase lasting until the rogue has joined ``--rounds`` rounds with an
honest peer (the noise: until both ban it, three rounds). Then a control run:
the same two honest workers, the same run, nobody else, trained to the same
epochs, ``--controls`` times (two clean runs of the same run differ too: the
spread between them is the comparison's own noise). Each phase is judged per
honest peer by what the phase itself did: its ``after ÷ control`` (validation loss
two epochs after the phase's last round, over the controls' mean at that epoch)
over its ``before ÷ control`` (the last epoch before the phase's first round),
so that an earlier phase's cost is not counted again; the bound is 1.10. Beside
it: the attacked peer's own ``after ÷ before``, the cumulative ``after ÷
control``, and the controls' spread. Each mode appends one JSON row (phases,
control curves, commit, date, machine, load) to ``--json``; ``--report`` renders
RESULTS.md's table.
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
    """Validation loss by epoch of the two honest peers alone, until each has reported an epoch
    at or past ``until_epoch`` (a peer that caught up by downloading skips the epochs in between)."""
    from test_faults_rogue import start_honest_peers
    from test_worker_swarm import stop_all

    workers = []
    try:
        start_honest_peers(temp, manifest, workers)
        for worker in workers:
            worker.wait_for(lambda w: any(report["epoch"] >= until_epoch for report in w.of_type("epoch")), 1800,
                            f"an epoch report at or past {until_epoch} in the control run")
        return {worker.spec["nickname"]: {report["epoch"]: report["val_loss"] for report in worker.of_type("epoch")}
                for worker in workers}
    finally:
        stop_all(workers)


def measure(mode: str, rounds: int, controls: int) -> dict:
    """The attacked run and ``controls`` clean runs of it for one mode."""
    from test_faults_rogue import attack_catalogue, diloco_catalogue_run, sync_catalogue_run

    manifest, prefixes = diloco_catalogue_run() if mode == "diloco" else sync_catalogue_run()
    with tempfile.TemporaryDirectory(prefix="p2ptrain-rogue-") as temp:
        phases = attack_catalogue(Path(temp) / "attacked", manifest, prefixes, rounds_per_phase=rounds)
    last = max(row["after"]["epoch"] for row in phases)
    curves = []
    for index in range(controls):
        with tempfile.TemporaryDirectory(prefix="p2ptrain-rogue-control-") as temp:
            curve = control_curve(Path(temp), {**manifest, "run_id": f"{manifest['run_id']}-control{index}"}, last)
        curves.append({peer: {str(epoch): loss for epoch, loss in losses.items()} for peer, losses in curve.items()})
    return {"mode": mode, "rounds_per_phase": rounds, "manifest": manifest, "phases": phases, "controls": curves}


def control_curves(row: dict) -> list[dict]:
    """The row's control runs (rows before 2026-11-27 08:00 held one, as ``control``)."""
    return row.get("controls") or [row["control"]]


def control_at(curve: dict, peer: str, epoch: int) -> float | None:
    """One control run's validation loss of ``peer`` at ``epoch`` (the nearest later epoch it reported)."""
    losses = {int(e): loss for e, loss in curve.get(peer, {}).items()}
    later = [e for e in losses if e >= epoch]
    return losses[min(later)] if later else None


def controls_at(row: dict, peer: str, epoch: int) -> list[float]:
    """Every control run's loss of ``peer`` at ``epoch`` (runs that did not reach it left out)."""
    return [loss for loss in (control_at(curve, peer, epoch) for curve in control_curves(row)) if loss is not None]


def phase_effect(row: dict, phase: dict) -> tuple[float | None, float | None, float | None]:
    """(after ÷ control, before ÷ control, the phase's own effect: their ratio); None where a
    control did not reach the epoch. Control: the mean of the control runs."""
    after, before = controls_at(row, phase["peer"], phase["after"]["epoch"]), controls_at(row, phase["peer"], phase["before"]["epoch"])
    versus_after = phase["after"]["val_loss"] / (sum(after) / len(after)) if after else None
    versus_before = phase["before"]["val_loss"] / (sum(before) / len(before)) if before else None
    effect = versus_after / versus_before if versus_after and versus_before else None
    return versus_after, versus_before, effect


def control_spread(row: dict) -> float | None:
    """The largest ratio between two control runs' losses of one peer at one epoch (None: one run)."""
    curves = control_curves(row)
    if len(curves) < 2:
        return None
    ratios = [max(losses) / min(losses) for peer in curves[0] for epoch in curves[0][peer]
              if len(losses := [curve[peer][epoch] for curve in curves if epoch in curve.get(peer, {})]) == len(curves)]
    return max(ratios) if ratios else None


def report(path: Path) -> str:
    """RESULTS.md's table of the rows in ``path``: per mode, attack and honest peer."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    lines = ["| mode | attack | peer | rogue's rounds | before (epoch) | after (epoch) | after ÷ before | before ÷ control | "
             "after ÷ control | the phase's effect | named for |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        for phase in row["phases"]:
            before, after = phase["before"], phase["after"]
            versus_after, versus_before, effect = phase_effect(row, phase)
            lines.append(f"| {row['mode']} | {phase['attack']} | {phase['peer']} | {phase['rounds']} | {before['val_loss']:.3f} "
                         f"({before['epoch']}) | {after['val_loss']:.3f} ({after['epoch']}) | "
                         f"{after['val_loss'] / before['val_loss']:.3f} | {_ratio(versus_before)} | {_ratio(versus_after)} | "
                         f"{_ratio(effect)} | {', '.join(phase['reasons'])} |")
    lines.append("")
    for row in rows:
        effects = [phase_effect(row, phase)[2] for phase in row["phases"]]
        measured = [effect for effect in effects if effect is not None]
        worst = max(measured) if measured else None
        verdict = "met" if worst is not None and worst <= BOUND and len(measured) == len(effects) else "not met"
        spread = control_spread(row)
        lines.append(f"- {row['mode']} ({row['date']}, commit {row['commit'][:7]}, 1-min load {row['load'][0]:.1f}, "
                     f"{len(control_curves(row))} control run(s)"
                     f"{f', the control runs up to {spread:.3f} apart' if spread else ''}): the worst phase's effect is "
                     f"{_ratio(worst)} over {len(measured)} of {len(effects)} phases and peers (bound <= {BOUND:.2f}): {verdict}")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=["diloco", "sync"], default=["diloco", "sync"])
    parser.add_argument("--rounds", type=int, default=3, help="rounds the rogue joins in each phase (at least)")
    parser.add_argument("--controls", type=int, default=2, help="clean runs of the same run to compare with")
    parser.add_argument("--json", type=Path, help="append each mode's row to this JSON-lines file")
    parser.add_argument("--report", type=Path, help="print the table of this file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    from run_facts import facts

    for mode in args.modes:
        row = {"benchmark": "rogue", **facts(), **measure(mode, args.rounds, args.controls)}
        if args.json:
            with args.json.open("a") as file:
                file.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    if args.json:
        print(report(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
