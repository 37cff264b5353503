"""`p2ptrain plan`: what a device would do with a model, and what this machine measured.

The same answer the daemon gives its workers (``plan.py: make_plan``), for
this machine's device or a hypothetical one (``--gpu-memory 16GiB
--compute-capability 7.5``), so a run organiser sees what a T4, a 4090 or an
A100 would do. ``run`` is the command, ``add_arguments`` its arguments; the
parsers of sizes, uplinks and compute capabilities are the CLI's and the
config's one way to read them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, replace

from p2ptrain.daemon.model_facts import ModelFactsError, model_facts
from p2ptrain.daemon.plan import DeviceFacts, Plan, PlanPolicy, choose_precision, make_plan
from p2ptrain.peers.compression.ladder import LADDER, parse_rung, upload_bytes_per_value

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(tib|tb|t|gib|gb|g|mib|mb|m)?\s*$", re.IGNORECASE)
_UNITS = {"t": 1024**2, "g": 1024, "m": 1}


def parse_size_mib(text: str) -> int:
    """A memory size like "16GiB", "16 GB", "24576MiB" or "80G" in MiB (GB is taken as GiB, as GPU specs mean it).

    Raises ValueError with the accepted forms.
    """
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"cannot read the size {text!r}; write it like 16GiB, 12GB or 8192MiB")
    unit = (match.group(2) or "g")[0].lower()
    return int(float(match.group(1)) * _UNITS[unit])


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(g|m|k)?(?:bit|b)?(?:ps|/s)?\s*$", re.IGNORECASE)
_RATE_UNITS = {"g": 1000.0, "m": 1.0, "k": 0.001}


def parse_rate_mbit(text: str) -> float:
    """An uplink like "20Mbit", "20 Mbit/s", "1Gbit", "512kbit" or "20" (Mbit/s) in Mbit/s.

    Raises ValueError with the accepted forms.
    """
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"cannot read the uplink {text!r}; write it like 20Mbit, 512kbit or 1Gbit (bits per second)")
    return float(match.group(1)) * _RATE_UNITS[(match.group(2) or "m").lower()]


def parse_compute_capability(text: str) -> tuple[int, int]:
    """"7.5" -> (7, 5). Raises ValueError with the accepted form."""
    match = re.match(r"^\s*(\d+)\.(\d+)\s*$", text)
    if not match:
        raise ValueError(f"cannot read the compute capability {text!r}; write it like 7.5 (T4) or 8.9 (RTX 4090)")
    return int(match.group(1)), int(match.group(2))


def with_measurement(plan: Plan, home: str | None) -> Plan:
    """`plan` with what this machine's worker measured for it, if it ever ran it (`cache_dir/plans.json`)."""
    import time

    from p2ptrain.paths import resolve_paths
    from p2ptrain.peers.worker.plan_cache import cache_key, read_plan_cache

    measured = read_plan_cache(resolve_paths(home).cache_dir).get(cache_key(plan.model, plan.device_name, plan.precision, plan.quantization))
    if not isinstance(measured, dict) or not isinstance(measured.get("samples_per_second"), (int, float)):
        return plan
    same = measured.get("micro_batch") == plan.micro_batch and measured.get("seq_len") == plan.seq_len
    when = time.strftime("%Y-%m-%d", time.localtime(measured.get("measured_at") or 0))
    line = (f"measured here on {when}: {measured['samples_per_second']:.2f} samples/s forward and backward at micro-batch "
            f"{measured.get('micro_batch')} x {measured.get('seq_len')} tokens")
    return Plan(**{**asdict(plan), "samples_per_second": measured["samples_per_second"], "calibrated": same,
                   "rationale": [*plan.rationale, line]})


def _measured_here(facts, device: DeviceFacts, home: str | None) -> dict[str, float]:
    """What this machine's workers measured for the model on this device, by quantization (the plan cache)."""
    from p2ptrain.paths import resolve_paths
    from p2ptrain.peers.worker.plan_cache import measured_speeds

    precision, _ = choose_precision(device)
    return measured_speeds(resolve_paths(home).cache_dir, facts.name, device.name, precision)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `p2ptrain plan` (the CLI adds its global options)."""
    parser.add_argument("--model", required=True, help="built-in name (tiny, gemma-2b, ...), hub id or local dir")
    parser.add_argument("--gpu-memory", help="plan for a GPU with this much free memory, e.g. 16GiB")
    parser.add_argument("--compute-capability", help="that GPU's compute capability, e.g. 7.5 (T4), 8.0 (A100)")
    parser.add_argument("--device", choices=["cpu"], help="plan for this machine's CPU")
    parser.add_argument("--seq-len", type=int, help="tokens per sample (default 128 for tiny, 512 otherwise)")
    parser.add_argument("--micro-batch-hint", type=int, default=8, help="samples per step the run wants (8)")
    parser.add_argument("--lora-r", type=int, default=8, help="LoRA rank for pretrained models (8)")
    parser.add_argument("--full-training", action="store_true", help="train every weight instead of LoRA")
    parser.add_argument("--memory-share", type=float, default=PlanPolicy.memory_share,
                        help="share of free memory training may use (0.9)")
    parser.add_argument("--uplink", help="this machine's upload bandwidth, e.g. 20Mbit: picks the compression rung")
    parser.add_argument("--compression", help="the run's top compression rung (default none: the whole ladder "
                                              "is allowed)")
    parser.add_argument("--compression-rungs", nargs="*",
                        help="cheaper rungs the run allows (default: every rung of the ladder below --compression)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def _device_from_arguments(options: argparse.Namespace) -> DeviceFacts:
    from p2ptrain.daemon.hardware_probe import probe

    hardware = probe()
    if options.gpu_memory or options.compute_capability:
        if not (options.gpu_memory and options.compute_capability):
            raise ValueError("give --gpu-memory and --compute-capability together, e.g. --gpu-memory 16GiB "
                             "--compute-capability 7.5")
        memory = parse_size_mib(options.gpu_memory)
        capability = parse_compute_capability(options.compute_capability)
        return DeviceFacts(kind="cuda", name=f"a {memory / 1024:.3g} GiB GPU of compute capability "
                           f"{capability[0]}.{capability[1]}", memory_total_mib=memory, memory_free_mib=memory,
                           compute_capability=capability, index=0, cpu_cores=hardware.cpu.cores_physical)
    devices = hardware.devices()
    if options.device == "cpu":
        return next(device for device in devices if device.kind == "cpu")
    return devices[0]


def _compression_arguments(options: argparse.Namespace) -> dict:
    """The manifest's compression fields for `p2ptrain plan`: by default the whole ladder below the top rung."""
    top = parse_rung(options.compression or "none")
    if options.compression_rungs is not None:
        return {"mode": "diloco", "compression": top.name, "compression_rungs": options.compression_rungs}
    cheaper = [name for name in LADDER if upload_bytes_per_value(parse_rung(name)) < upload_bytes_per_value(top)]
    return {"mode": "diloco", "compression": top.name, "compression_rungs": cheaper}


def run(options: argparse.Namespace) -> int:
    """`p2ptrain plan`: print the plan; exit 0, or 2 with a one-line error for bad input or no fit."""
    tiny = options.model.lower() == "tiny"
    lora = None if tiny or options.full_training else {"r": options.lora_r}
    manifest = {"seq_len": options.seq_len or (128 if tiny else 512), "micro_batch_hint": options.micro_batch_hint}
    try:
        if options.device and options.gpu_memory:
            raise ValueError("give either --device cpu or --gpu-memory, not both")
        if not 0 < options.memory_share <= 1:
            raise ValueError(f"--memory-share {options.memory_share} is out of range; use a share in (0, 1]")
        if manifest["seq_len"] < 1 or manifest["micro_batch_hint"] < 1:
            raise ValueError("--seq-len and --micro-batch-hint must be at least 1")
        device = _device_from_arguments(options)
        if options.uplink or options.compression or options.compression_rungs is not None:
            manifest.update(_compression_arguments(options))
            device = replace(device, uplink_mbit_s=parse_rate_mbit(options.uplink) if options.uplink else None)
        facts = model_facts(options.model, lora)
        measured = None if options.gpu_memory else _measured_here(facts, device, getattr(options, "home", None))
        plan = make_plan(facts, manifest, device, PlanPolicy(memory_share=options.memory_share), measured)
        if not options.gpu_memory:
            plan = with_measurement(plan, getattr(options, "home", None))
    except (ValueError, ModelFactsError) as error:
        print(f"p2ptrain plan: {error}", file=sys.stderr)
        return 2
    if options.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    checkpointing = ", gradient checkpointing" if plan.gradient_checkpointing else ""
    print(f"{plan.model} on {plan.device_name} ({plan.device}): {plan.precision}, quantization "
          f"{plan.quantization}{checkpointing}, micro-batch {plan.micro_batch} x {plan.grad_accum}, {plan.cpu_threads} CPU threads, "
          f"~{plan.memory_estimate_gib} GiB of {plan.memory_allowed_gib} GiB allowed"
          f"{f', sends {plan.compression}' if plan.compression else ''}")
    for line in plan.rationale:
        print(f"  - {line}")
    return 0

