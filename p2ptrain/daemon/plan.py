"""The hardware plan: precision, quantization, micro-batch and threads for one device.

`make_plan` is a pure function of (model facts, manifest, device facts,
policy). It sizes from the memory that is *free* now (a desktop's browser and
compositor hold VRAM too), not from the card's total, and says why it chose
each value in one line. The training worker then confirms it with real
passes before its first step (`p2ptrain.peers.calibration`), halving the
micro-batch on out-of-memory, and records the speed it measured. `run` is
`p2ptrain plan` (its arguments: `add_arguments`): the same answer for a hypothetical
device, so a run organiser sees what a T4, a 4090 or an A100 would do, and
for this machine's own device with what its worker measured.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field, replace

from p2ptrain.daemon.memory import (
    GIB,
    MIB,
    MemoryEstimate,
    estimate_memory,
    format_gib,
    format_parameters,
)
from p2ptrain.daemon.model_facts import ModelFacts, ModelFactsError, model_facts
from p2ptrain.peers.compression_ladder import LADDER, ROUND_UPLOAD_S, allowed_rungs, choose_rung, parse_rung, upload_bytes_per_value

TYPE_CHECKING = False
if TYPE_CHECKING:  # pydantic would slow down `p2ptrain plan`
    from p2ptrain.config import PolicySettings

QUANTIZATION_ORDER = ("none", "int8", "nf4")
BF16_COMPUTE_CAPABILITY = (8, 0)


class PlanError(ValueError):
    """No plan fits this device; `message` says why and `fix` what to do."""

    def __init__(self, message: str, fix: str):
        super().__init__(f"{message}; {fix}")
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class DeviceFacts:
    """What the plan needs to know about one device.

    `kind`: "cuda" or "cpu". `index`: the GPU's NVML index (None on the CPU).
    `name`: e.g. "Tesla T4" or the CPU model. `memory_total_mib` and
    `memory_free_mib`: VRAM, or RAM for the CPU. `compute_capability`:
    (major, minor) of a GPU. `cpu_cores`: physical cores of the host.
    `uplink_mbit_s`: the host's upload bandwidth in Mbit/s, configured or
    measured (None: unknown), which picks the compression rung.
    """

    kind: str
    name: str
    memory_total_mib: int
    memory_free_mib: int
    compute_capability: tuple[int, int] | None = None
    index: int | None = None
    cpu_cores: int = 1
    uplink_mbit_s: float | None = None

    @property
    def torch_device(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index or 0}"


@dataclass(frozen=True)
class PlanPolicy:
    """The volunteer's limits and the plan's tuning knobs.

    `memory_share`: the share of *free* GPU memory training may take
    (leaves room for the desktop and for allocator fragmentation).
    `ram_share`: the same for available RAM when training on the CPU, lower
    because the desktop's own programs grow into RAM while we train.
    `max_cpu_threads`: a cap on torch threads (None: all physical cores).
    `quantize_below_micro_batch`: when the unquantized model fits fewer
    samples than this (and than the manifest's micro-batch), quantize to make
    room: at one or two samples a step a GPU idles on kernel launches, which
    costs more than dequantizing. `max_micro_batch`: an upper bound.
    `round_upload_s`: the longest one averaging round's upload may take on the
    uplink; the compression rung is the most precise one the run allows within it.
    """

    memory_share: float = 0.9
    ram_share: float = 0.5
    max_cpu_threads: int | None = None
    quantize_below_micro_batch: int = 4
    max_micro_batch: int = 64
    round_upload_s: float = ROUND_UPLOAD_S

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> PlanPolicy:
        """The caps of the volunteer's ``[policy]`` table that shape the plan."""
        return cls(memory_share=settings.max_vram_share, ram_share=settings.max_ram_share,
                   max_cpu_threads=settings.max_cpu_threads)


@dataclass
class Plan:
    """What one worker runs with; `rationale` has one line per choice.

    `samples_per_second` is what this machine's training worker measured for
    the same model, device, precision and quantization (the plan cache), and
    `calibrated` says it was at this plan's micro-batch and seq_len;
    `memory_estimate_gib` is the plan's own arithmetic. `compression` is the
    rung this peer sends averaged tensors with (None when the plan was made
    without the run's manifest: `choose_compression` then).
    """

    model: str
    device: str
    device_name: str
    precision: str
    quantization: str
    micro_batch: int
    grad_accum: int
    cpu_threads: int
    seq_len: int
    memory_estimate_gib: float
    memory_allowed_gib: float
    rationale: list[str] = field(default_factory=list)
    compression: str | None = None
    samples_per_second: float | None = None
    calibrated: bool = False

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.grad_accum

    def to_dict(self) -> dict:
        return {**asdict(self), "samples_per_step": self.samples_per_step}

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        names = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in data.items() if key in names})


def choose_precision(device: DeviceFacts) -> tuple[str, str]:
    """bf16 on GPUs of compute capability >= 8.0, fp16 below, fp32 on the CPU; with the reason."""
    if device.kind == "cpu":
        return "fp32", "precision fp32: training on the CPU"
    capability = device.compute_capability or (0, 0)
    shown = f"{capability[0]}.{capability[1]}"
    if capability >= BF16_COMPUTE_CAPABILITY:
        return "bf16", f"precision bf16: compute capability {shown} supports bfloat16"
    return "fp16", f"precision fp16: compute capability {shown} has no bfloat16 (needs 8.0)"


def largest_divisor_at_most(total: int, limit: int) -> int:
    """The largest micro-batch <= `limit` that divides `total`, so accumulation reaches it exactly."""
    for size in range(max(1, min(total, limit)), 0, -1):
        if total % size == 0:
            return size
    return 1


def make_plan(facts: ModelFacts, manifest: dict, device: DeviceFacts, policy: PlanPolicy | None = None) -> Plan:
    """Choose precision, quantization, micro-batch, accumulation and threads for `device`.

    Args:
        facts: the model's shape, with the run's LoRA settings (`model_facts(model, lora)`).
        manifest: the run manifest as a dict; uses `seq_len` (default 128),
            `micro_batch_hint` (samples per step, default 8) and, for a `diloco`
            run that names one, `compression` with `compression_rungs`
            (`choose_compression`; sync mode sends the manifest's compression).
        device: the device to train on, with its free memory now.
        policy: the volunteer's caps; defaults to `PlanPolicy()`.

    Quantization is the least of none / int8 / nf4 that fits
    `quantize_below_micro_batch` samples at once (or the manifest's
    micro-batch, if smaller); if none does, nf4, which leaves the most room.
    The micro-batch is the largest that fits and divides the manifest's
    micro-batch, so accumulation reaches it exactly.

    Raises:
        PlanError: the model does not fit even at one sample with the strongest quantization.
    """
    policy = policy or PlanPolicy()
    seq_len = int(manifest.get("seq_len") or 128)
    wanted = int(manifest.get("micro_batch_hint") or 8)
    precision, precision_reason = choose_precision(device)
    free = device.memory_free_mib * MIB
    share = policy.ram_share if device.kind == "cpu" else policy.memory_share
    allowed = int(free * share)
    options = QUANTIZATION_ORDER if device.kind == "cuda" and facts.can_quantize else ("none",)
    estimates = {q: estimate_memory(facts, precision, q, seq_len, device.kind) for q in options}
    limit = min(wanted, policy.max_micro_batch)
    # Samples that fit at once, per quantization (capped by what the run wants).
    fits = {q: min(limit, estimate.samples_that_fit(allowed)) for q, estimate in estimates.items()}
    memory_words = f"{format_gib(allowed)} allowed ({share:.0%} of {format_gib(free)} free)"
    if not any(fits.values()):
        strongest = options[-1]
        raise PlanError(
            f"{facts.name} does not fit on {device.name}: one sample of {seq_len} tokens needs "
            f"{format_gib(estimates[strongest].total(1))} in {precision}"
            f"{'' if strongest == 'none' else ' with ' + strongest} but {memory_words}",
            "use a device with more free memory, a smaller model, or a shorter seq_len",
        )
    floor = min(wanted, policy.quantize_below_micro_batch)
    # A device too tight for the floor even in nf4 gets nf4 anyway: the most headroom.
    quantization = next((q for q in options if fits[q] >= floor), options[-1])
    micro_batch = largest_divisor_at_most(wanted, fits[quantization])
    chosen = estimates[quantization]
    cpu_threads = _cpu_threads(device, policy)
    rationale = [
        precision_reason,
        _quantization_reason(facts, estimates, fits, quantization, precision, seq_len, memory_words,
                             device),
        f"micro-batch {micro_batch} x {wanted // micro_batch} accumulation steps: the manifest wants {wanted} "
        f"samples per step, {micro_batch} fit at once (needs {format_gib(chosen.total(micro_batch))})",
        _threads_reason(device, policy, cpu_threads),
    ]
    compression = None
    if "compression" in manifest and manifest.get("mode") == "diloco":
        compression, reason = choose_compression(manifest, facts.trainable_parameters, device.uplink_mbit_s, policy)
        rationale.append(reason)
    return Plan(
        model=facts.name,
        device=device.torch_device,
        device_name=device.name,
        precision=precision,
        quantization=quantization,
        micro_batch=micro_batch,
        grad_accum=wanted // micro_batch,
        cpu_threads=cpu_threads,
        seq_len=seq_len,
        memory_estimate_gib=round(chosen.total(micro_batch) / GIB, 2),
        memory_allowed_gib=round(allowed / GIB, 2),
        rationale=rationale,
        compression=compression,
    )


def choose_compression(manifest: dict, trainable_parameters: int, uplink_mbit_s: float | None,
                       policy: PlanPolicy | None = None) -> tuple[str, str]:
    """The compression rung this peer sends with, and why (one line).

    The most precise rung the run allows (`compression`, the run's top rung, and the
    cheaper `compression_rungs`) whose averaging round uploads within
    `policy.round_upload_s` on this uplink; never more than the top rung
    (`compression_ladder.choose_rung`).

    Args:
        manifest: the run manifest as a dict (default compression "none").
        trainable_parameters: the averaged values.
        uplink_mbit_s: upload bandwidth in Mbit/s, or None when unknown (then the top rung).
        policy: the volunteer's limits; defaults to `PlanPolicy()`.

    Raises:
        ValueError: a rung the ladder does not know, or one above the top rung.
    """
    policy = policy or PlanPolicy()
    allowed = allowed_rungs(manifest.get("compression") or "none", manifest.get("compression_rungs") or [])
    rung, reason = choose_rung(allowed, trainable_parameters, uplink_mbit_s, policy.round_upload_s)
    return rung.name, reason


def _quantization_reason(facts: ModelFacts, estimates: dict[str, MemoryEstimate], fits: dict[str, int],
                         quantization: str, precision: str, seq_len: int, memory_words: str,
                         device: DeviceFacts) -> str:
    plain = estimates["none"]
    need = (f"{format_parameters(facts.parameters)} params need {format_gib(plain.weights)} in {precision} plus "
            f"{format_gib(plain.per_sample)} per sample of {seq_len} tokens")
    if quantization != "none":
        return (f"quantization {quantization}: {need}; a micro-batch of {fits['none']} fits in "
                f"{memory_words}, in {quantization} the weights take {format_gib(estimates[quantization].weights)} "
                f"and a micro-batch of {fits[quantization]} fits")
    if device.kind == "cpu":
        why = "bitsandbytes quantization needs a CUDA GPU"
    elif not facts.can_quantize:
        why = "full training cannot update quantized weights"
    else:
        why = f"a micro-batch of {fits['none']} fits in {memory_words}"
    return f"quantization none: {need}; {why}"


def _cpu_threads(device: DeviceFacts, policy: PlanPolicy) -> int:
    cores = max(1, device.cpu_cores)
    cap = policy.max_cpu_threads or cores
    # A GPU worker's CPU threads only feed the GPU; two keep it busy and leave the desktop alone.
    wanted = cores if device.kind == "cpu" else 2
    return max(1, min(wanted, cap, cores))


def _threads_reason(device: DeviceFacts, policy: PlanPolicy, threads: int) -> str:
    words = f"{threads} CPU thread{'' if threads == 1 else 's'}"
    if policy.max_cpu_threads is not None and threads == policy.max_cpu_threads:
        return f"{words}: capped by max_cpu_threads = {policy.max_cpu_threads}"
    if device.kind == "cpu":
        return f"{words}: one per physical core"
    return f"{words}: enough to feed the GPU"


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
    from p2ptrain.peers.calibration import cache_key, read_plan_cache

    measured = read_plan_cache(resolve_paths(home).cache_dir).get(cache_key(plan.model, plan.device_name, plan.precision, plan.quantization))
    if not isinstance(measured, dict) or not isinstance(measured.get("samples_per_second"), (int, float)):
        return plan
    same = measured.get("micro_batch") == plan.micro_batch and measured.get("seq_len") == plan.seq_len
    when = time.strftime("%Y-%m-%d", time.localtime(measured.get("measured_at") or 0))
    line = (f"measured here on {when}: {measured['samples_per_second']:.2f} samples/s forward and backward at micro-batch "
            f"{measured.get('micro_batch')} x {measured.get('seq_len')} tokens")
    return Plan(**{**asdict(plan), "samples_per_second": measured["samples_per_second"], "calibrated": same,
                   "rationale": [*plan.rationale, line]})


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
        plan = make_plan(facts, manifest, device, PlanPolicy(memory_share=options.memory_share))
        if not options.gpu_memory:
            plan = with_measurement(plan, getattr(options, "home", None))
    except (ValueError, ModelFactsError) as error:
        print(f"p2ptrain plan: {error}", file=sys.stderr)
        return 2
    if options.json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    print(f"{plan.model} on {plan.device_name} ({plan.device}): {plan.precision}, quantization "
          f"{plan.quantization}, micro-batch {plan.micro_batch} x {plan.grad_accum}, {plan.cpu_threads} CPU threads, "
          f"~{plan.memory_estimate_gib} GiB of {plan.memory_allowed_gib} GiB allowed"
          f"{f', sends {plan.compression}' if plan.compression else ''}")
    for line in plan.rationale:
        print(f"  - {line}")
    return 0

