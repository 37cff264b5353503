"""What the hardware plan gives the common volunteer cards, for the built-in models.

The plan (``p2ptrain.daemon.plan.make_plan``) is arithmetic: this runs it for
each card (memory, compute capability; all of it free, as ``p2ptrain plan
--gpu-memory`` assumes) and each built-in model, with the defaults of a
fine-tuning run (LoRA r 8 at 512 tokens a sample, 8 samples a step; the tiny
model trained whole at 128 tokens), writes the plans to a data file, and
renders the table RESULTS.md shows from it:

    .venv/bin/python benchmarks/plan_table.py --write benchmarks/plan_table.json
    .venv/bin/python benchmarks/plan_table.py --report benchmarks/plan_table.json
    .venv/bin/python benchmarks/results.py --write     # RESULTS.md's table, through ``render``

``tests/unit/test_results_tables.py`` fails when RESULTS.md's table differs
from what the data file renders, or the data file from what the planner says now.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

from p2ptrain.daemon.model_facts import built_in_models, model_facts
from p2ptrain.daemon.plan import DeviceFacts, PlanError, make_plan

REPO = Path(__file__).resolve().parents[1]
# (what a volunteer has, memory in GiB, compute capability)
CARDS = [
    ("GTX 1070 / 1080", 8, (6, 1)),
    ("RTX 2070 / 2080", 8, (7, 5)),
    ("RTX 3070", 8, (8, 6)),
    ("RTX 3060", 12, (8, 6)),
    ("Tesla T4", 16, (7, 5)),
    ("RTX 4060 Ti 16 GB", 16, (8, 9)),
    ("RTX 3090", 24, (8, 6)),
    ("RTX 4090", 24, (8, 9)),
    ("H100 80 GB", 80, (9, 0)),
]


def plan_rows() -> list[dict]:
    """One row per (card, built-in model): the plan's choices, or why nothing fits."""
    rows = []
    for card, gib, capability in CARDS:
        device = DeviceFacts(kind="cuda", name=card, memory_total_mib=gib * 1024, memory_free_mib=gib * 1024,
                             compute_capability=capability, index=0, cpu_cores=8)
        for model in built_in_models():
            tiny = model == "tiny"
            manifest = {"seq_len": 128 if tiny else 512, "micro_batch_hint": 8}
            row = {"card": card, "memory_gib": gib, "compute_capability": f"{capability[0]}.{capability[1]}", "model": model}
            try:
                plan = make_plan(model_facts(model, None if tiny else {"r": 8}), manifest, device)
            except PlanError as error:
                rows.append({**row, "fits": False, "why": error.message})
                continue
            rows.append({**row, "fits": True, "precision": plan.precision, "quantization": plan.quantization,
                         "gradient_checkpointing": plan.gradient_checkpointing, "micro_batch": plan.micro_batch,
                         "grad_accum": plan.grad_accum, "memory_estimate_gib": plan.memory_estimate_gib,
                         "memory_allowed_gib": plan.memory_allowed_gib})
    return rows


def cell(row: dict) -> str:
    if not row["fits"]:
        return "does not fit"
    way = row["precision"] + ("" if row["quantization"] == "none" else f" {row['quantization']}")
    checkpointing = " + ckpt" if row["gradient_checkpointing"] else ""
    return f"{way}{checkpointing}, {row['micro_batch']} x {row['grad_accum']}"


def render(data: dict) -> str:
    """The markdown table of a data file: a row per model, a column per card."""
    rows = data["rows"]
    cards = list(dict.fromkeys((row["card"], row["memory_gib"], row["compute_capability"]) for row in rows))
    models = list(dict.fromkeys(row["model"] for row in rows))
    by_key = {(row["card"], row["model"]): row for row in rows}
    header = "| model | " + " | ".join(f"{card} ({gib} GiB, {capability})" for card, gib, capability in cards) + " |"
    lines = [header, "|---|" + "---|" * len(cards)]
    for model in models:
        lines.append(f"| {model} | " + " | ".join(cell(by_key[(card, model)]) for card, _, _ in cards) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="compute the plans and write them to this data file")
    parser.add_argument("--report", type=Path, help="print the markdown table of this data file")
    options = parser.parse_args()
    if options.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
        data = {"what": "p2ptrain plan for common cards, all memory free; LoRA r 8 at 512 tokens, 8 samples a step "
                        "(tiny: full training at 128 tokens)",
                "commit": commit, "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
                "note": "arithmetic only: no GPU, the load does not matter", "rows": plan_rows()}
        options.write.write_text(json.dumps(data, indent=1) + "\n")
    if options.report:
        print(render(json.loads(options.report.read_text())))


if __name__ == "__main__":
    main()
