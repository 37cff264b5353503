"""The planner against a real device: measured peak, estimate, samples/s, the plan's choice and the best by search.

For each model shape (a ``config.json``; random weights in that shape are saved
with p2ptrain's byte tokenizer, so no hub is needed), each quantization the
device allows (none; nf4 and int8 on CUDA) and micro-batches 1, 2, 4, ...
until one runs out of memory or passes ``--max-micro-batch``, it builds the
model as a worker would (``build_model``: LoRA r 16 on the default targets,
QLoRA with gradient checkpointing) and times real training steps (forward,
backward, AdamW) at ``--seq-len`` tokens. Per row: the peak the allocator held
(CUDA: ``max_memory_allocated`` and ``max_memory_reserved``; CPU: the process's
peak resident set less what it held before), the memory model's estimate of
it, samples/s, and, per shape and quantization, what ``make_plan`` picks for a
card of ``--cap-gib`` (the process is held to that much with
``set_per_process_memory_fraction``) beside the fastest micro-batch that fit.

On a CUDA machine (what GPU-FINDINGS' table came from, ``tests/fixtures/gpu_h100_2026-11-26.jsonl``):

    .venv/bin/python benchmarks/gpu_plan.py --cap-gib 16 --json benchmarks/gpu_plan_<date>.jsonl
    .venv/bin/python benchmarks/gpu_plan.py --report benchmarks/gpu_plan_<date>.jsonl
    .venv/bin/python benchmarks/gpu_plan.py --report tests/fixtures/gpu_h100_2026-11-26.jsonl --estimate-again

On the CPU (a smoke run; peaks are resident-set growth, so only roughly what the model counts):

    .venv/bin/python benchmarks/gpu_plan.py --device cpu --shape tests/fixtures/model-shapes/llama-tiny \\
        --seq-len 64 --max-micro-batch 4 --steps 2 --json /tmp/gpu_plan.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPES = REPO / "tests" / "fixtures" / "model-shapes"
GIB = 1024**3
LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": None}


def save_shape(config_file: Path, directory: Path) -> None:
    """Random weights in the shape of ``config_file``, saved with p2ptrain's byte tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from p2ptrain.peers.model.tokenizers import ByteTokenizer

    config = AutoConfig.from_pretrained(config_file.parent)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    ByteTokenizer().save_pretrained(directory)
    del model
    gc.collect()


def machine_facts(device: str) -> dict:
    import torch

    facts = {"kind": "machine", "device": device, "torch": torch.__version__, "python": platform.python_version(),
             "date": time.strftime("%Y-%m-%d"), "load_1min": round(__import__("os").getloadavg()[0], 2),
             "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                      cwd=REPO).stdout.strip()}
    if device.startswith("cuda"):
        properties = torch.cuda.get_device_properties(0)
        facts.update(gpu=properties.name, compute_capability=f"{properties.major}.{properties.minor}",
                     memory_gib=round(properties.total_memory / GIB, 2), cuda=torch.version.cuda)
    return facts


class Peak:
    """The peak memory of what runs between ``start`` and ``read``, on CUDA or (roughly) on the CPU."""

    def __init__(self, device: str):
        self.device = device

    def start(self) -> None:
        import torch

        from p2ptrain.peers.worker.calibration import _reset_peak

        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        self.before = _reset_peak(self.device)

    def read(self) -> tuple[float, float]:
        """(allocated, reserved) peak in GiB; on the CPU both are the resident set's peak."""
        import torch

        from p2ptrain.peers.worker.calibration import _peak

        if self.device.startswith("cuda"):
            return torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB
        peak = _peak(self.device) / GIB
        return peak, peak


def time_steps(loaded, device: str, micro_batch: int, seq_len: int, steps: int) -> tuple[float, tuple[float, float]]:
    """samples/s of ``steps`` AdamW steps after a warm-up one, and the peak (allocated, reserved) GiB."""
    import torch

    from p2ptrain.peers.model.models import causal_lm_loss

    parameters = loaded.trainable()
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    vocab = loaded.model.get_input_embeddings().num_embeddings
    batch = torch.randint(0, vocab, (micro_batch, seq_len), generator=torch.Generator().manual_seed(0))
    peak = Peak(device)
    peak.start()

    def step():
        causal_lm_loss(loaded.model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return micro_batch * steps / (time.perf_counter() - started), peak.read()
    finally:
        optimizer.zero_grad(set_to_none=True)
        optimizer.state.clear()
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def measure_shape(shape: Path, device: str, options, write) -> None:
    """Every (quantization, micro-batch) row of one shape, then its plan row per quantization."""
    import torch

    from p2ptrain.daemon.memory import estimate_memory
    from p2ptrain.daemon.model_facts import model_facts
    from p2ptrain.daemon.plan import DeviceFacts, PlanError, make_plan
    from p2ptrain.peers.worker.calibration import _peak
    from p2ptrain.peers.model.models import build_model
    from p2ptrain.peers.worker.out_of_memory import is_out_of_memory

    name = shape.name
    facts = model_facts(str(shape), {"r": LORA["r"]})
    cuda = device.startswith("cuda")
    precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
    device_kind = "cuda" if cuda else "cpu"
    quantizations = options.quantizations or (["none", "nf4", "int8"] if cuda else ["none"])
    with tempfile.TemporaryDirectory() as directory:
        save_shape(shape / "config.json", Path(directory))
        for quantization in quantizations:
            checkpointing = quantization != "none"
            estimate = estimate_memory(facts, precision, quantization, options.seq_len, device_kind, checkpointing)
            before = 0 if cuda else _peak(device)
            try:
                loaded = build_model(directory, LORA, precision, quantization, device)
            except Exception as error:
                if not (isinstance(error, MemoryError) or is_out_of_memory(error)):
                    raise
                write({"kind": "load-failed", "model_shape": name, "quantization": quantization, "oom": True,
                       "error": str(error).splitlines()[0][:300]})
                continue
            loaded_gib = (torch.cuda.memory_allocated() if cuda else _peak(device) - before) / GIB
            write({"kind": "loaded", "model_shape": name, "quantization": quantization, "allocated_gib": round(loaded_gib, 3),
                   "estimate_weights_gib": round(estimate.weights / GIB, 3), "parameters": loaded.parameters,
                   "trainable": loaded.trainable_parameters})
            fastest = None
            micro_batch = 1
            while micro_batch <= options.max_micro_batch:
                try:
                    speed, (allocated, reserved) = time_steps(loaded, device, micro_batch, options.seq_len, options.steps)
                except Exception as error:
                    if not (isinstance(error, MemoryError) or is_out_of_memory(error)):
                        raise
                    write({"kind": "step-failed", "model_shape": name, "quantization": quantization, "micro_batch": micro_batch,
                           "seq_len": options.seq_len, "oom": True, "error": str(error).splitlines()[0][:300]})
                    break
                if not cuda:  # the resident set counts the process: what the allocator added is the growth
                    allocated = reserved = allocated - before / GIB
                row = {"kind": "step", "model_shape": name, "quantization": quantization, "micro_batch": micro_batch,
                       "seq_len": options.seq_len, "peak_gib": round(allocated, 3), "peak_reserved_gib": round(reserved, 3),
                       "estimate_gib": round(estimate.allocated(micro_batch) / GIB, 3), "samples_per_s": round(speed, 2)}
                write(row)
                if fastest is None or speed > fastest["samples_per_s"]:
                    fastest = row
                micro_batch *= 2
            del loaded
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            card = DeviceFacts(kind=device_kind, name=f"{options.cap_gib} GiB", memory_total_mib=int(options.cap_gib * 1024),
                               memory_free_mib=int(options.cap_gib * 1024), compute_capability=(9, 0) if cuda else None,
                               index=0, cpu_cores=8)
            try:
                plan = make_plan(facts, {"seq_len": options.seq_len, "micro_batch_hint": options.max_micro_batch}, card)
                chosen = {"plan_quantization": plan.quantization, "plan_checkpointing": plan.gradient_checkpointing,
                          "plan_micro_batch": plan.micro_batch}
            except PlanError as error:
                chosen = {"plan_error": error.message}
            write({"kind": "plan", "model_shape": name, "quantization": quantization, "cap_gib": options.cap_gib, **chosen,
                   "fastest_micro_batch": fastest and fastest["micro_batch"], "fastest_samples_per_s": fastest and fastest["samples_per_s"]})


def estimate_again(row: dict, lora_r: int) -> float:
    """The current memory model's estimate (GiB) of a measured step row, for its shape's config.json
    in tests/fixtures/model-shapes (QLoRA rows with gradient checkpointing, as they were measured)."""
    from p2ptrain.daemon.memory import estimate_memory
    from p2ptrain.daemon.model_facts import model_facts

    facts = model_facts(str(SHAPES / row["model_shape"]), {"r": lora_r})
    quantization = row["quantization"]
    estimate = estimate_memory(facts, "bf16", quantization, row["seq_len"], "cuda", quantization != "none")
    return estimate.allocated(row["micro_batch"]) / GIB


def report(path: Path, again: bool = False) -> str:
    """The table of a data file: a row per measured step, then the plan against the search.

    Args:
        path: the data file.
        again: estimate each step with the memory model as it is now (not as it was when measured).
    """
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lora_r = next((row.get("lora", {}).get("r") for row in rows if row["kind"] == "machine" and row.get("lora")), LORA["r"])
    if again:
        rows = [{**row, "estimate_gib": estimate_again(row, lora_r)} if row["kind"] == "step" else row for row in rows]
    machine = next((row for row in rows if row["kind"] == "machine"), {})
    lines = [f"{machine.get('gpu') or machine.get('device')}, torch {machine.get('torch')}, measured at commit "
             f"{machine.get('commit')} on {machine.get('date') or machine.get('measured_at')}"
             + (f", load {machine['load_1min']}" if "load_1min" in machine else "")
             + ("; estimates by the memory model as it is now" if again else ""), "",
             "| shape | quant | micro-batch x seq | measured peak GiB (reserved) | estimate GiB | estimate / measured | samples/s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["kind"] == "step":
            ratio = row["estimate_gib"] / row["peak_gib"] if row["peak_gib"] > 0 else float("nan")
            lines.append(f"| {row['model_shape']} | {row['quantization']} | {row['micro_batch']} x {row['seq_len']} | "
                         f"{row['peak_gib']:.2f} ({row['peak_reserved_gib']:.2f}) | {row['estimate_gib']:.2f} | {ratio:.2f} | "
                         f"{row['samples_per_s']:.1f} |")
        elif row["kind"] == "step-failed":
            lines.append(f"| {row['model_shape']} | {row['quantization']} | {row['micro_batch']} x {row.get('seq_len', '?')} | "
                         f"out of memory | | | |")
    lines += ["", "| shape | quant | card | plan | fastest by search |", "|---|---|---|---|---|"]
    for row in rows:
        if row["kind"] == "plan" and "fastest_micro_batch" in row:
            plan = row.get("plan_error") or (f"{row['plan_quantization']}{' + ckpt' if row['plan_checkpointing'] else ''}, "
                                             f"micro-batch {row['plan_micro_batch']}")
            lines.append(f"| {row['model_shape']} | {row['quantization']} | {row['cap_gib']} GiB | {plan} | "
                         f"{row['fastest_micro_batch']} ({row['fastest_samples_per_s']} samples/s) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    parser.add_argument("--shape", type=Path, action="append", help="a directory with a config.json (default: the "
                        "1.1B and 6.7B Llama shapes in tests/fixtures/model-shapes)")
    parser.add_argument("--quantization", dest="quantizations", action="append", choices=["none", "nf4", "int8"])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-micro-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per row, after a warm-up one")
    parser.add_argument("--cap-gib", type=float, default=16.0, help="hold the process to this much GPU memory, and "
                        "plan for a card of it")
    parser.add_argument("--json", type=Path, help="append the rows to this data file")
    parser.add_argument("--report", type=Path, help="print the tables of this data file and exit")
    parser.add_argument("--estimate-again", action="store_true", help="with --report: estimate every measured step "
                        "with the memory model as it is now")
    options = parser.parse_args()
    if options.report:
        print(report(options.report, options.estimate_again))
        return
    import torch

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.cuda.set_per_process_memory_fraction(min(1.0, options.cap_gib * GIB / torch.cuda.get_device_properties(0).total_memory))
    output = open(options.json, "a") if options.json else None

    def write(row: dict) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if output:
            output.write(line + "\n")
            output.flush()

    write(machine_facts(device))
    for shape in options.shape or [SHAPES / "llama-1.1b", SHAPES / "llama-6.7b"]:
        measure_shape(shape, device, options, write)
    if output:
        output.close()


if __name__ == "__main__":
    sys.exit(main())
