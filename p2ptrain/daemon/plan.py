"""The hardware plan: precision, quantization, gradient checkpointing, micro-batch and threads for one device.

`make_plan` is a pure function of (model facts, manifest, device facts,
policy, what this device measured before). It sizes from the memory that is
*free* now (a desktop's browser and compositor hold VRAM too) within the
volunteer's share, not from the card's total, and says why it chose each value
in one line. Every worker is planned: the run's creator before its worker
starts, a peer that joins once its worker has read the run's manifest from the
swarm (the worker asks the daemon: ``PlanWanted``). The worker then holds its
allocator to the plan's cap and confirms the micro-batch with real passes
(``p2ptrain.peers.worker.calibration``), growing it while that is faster and halving
it on out-of-memory. ``p2ptrain plan`` (``plan_command.py``) shows the same
answer for any device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from p2ptrain import control_types
from p2ptrain.daemon.memory import GIB, MIB, MemoryEstimate, estimate_memory, format_gib, format_parameters
from p2ptrain.daemon.model_facts import ModelFacts
from p2ptrain.peers.compression.ladder import ROUND_UPLOAD_S, allowed_rungs, choose_rung

TYPE_CHECKING = False
if TYPE_CHECKING:  # pydantic would slow down `p2ptrain plan`
    from p2ptrain.config import PolicySettings

BF16_COMPUTE_CAPABILITY = (8, 0)
# Below this, GPUs have no tensor cores and (consumer Pascal) run fp16 arithmetic at a small fraction of fp32's speed.
FP16_COMPUTE_CAPABILITY = (7, 0)
# bitsandbytes' int8 matrix multiplication needs Turing or newer.
INT8_COMPUTE_CAPABILITY = (7, 5)


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

    `memory_share`: the share of *free* GPU memory training may take (the
    worker's allocator is capped there: leaves room for the desktop).
    `ram_share`: the same for available RAM when training on the CPU, lower
    because the desktop's own programs grow into RAM while we train.
    `max_cpu_threads`: a cap on torch threads (None: all physical cores).
    `compute_share`: the most of the wall time the training loop computes (it
    rests the remainder after each step; 1: it never rests).
    `enough_micro_batch`: a micro-batch that keeps a GPU busy. The plan takes
    the fastest way to train (no gradient checkpointing, no quantization) that
    fits this many samples at once, or the manifest's micro-batch if smaller;
    only when it does not fit does it trade speed for memory. At one or two
    samples a step a GPU idles on kernel launches, which costs more than
    recomputing activations or dequantizing weights.
    `max_micro_batch`: an upper bound.
    `round_upload_s`: the longest one averaging round's upload may take on the
    uplink; the compression rung is the most precise one the run allows within it.
    """

    memory_share: float = 0.9
    ram_share: float = 0.5
    max_cpu_threads: int | None = None
    compute_share: float = 1.0
    enough_micro_batch: int = 4
    max_micro_batch: int = 64
    round_upload_s: float = ROUND_UPLOAD_S

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> PlanPolicy:
        """The caps of the volunteer's ``[policy]`` table that shape the plan."""
        return cls(memory_share=settings.max_vram_share, ram_share=settings.max_ram_share,
                   max_cpu_threads=settings.max_cpu_threads, compute_share=settings.max_compute_share)


@dataclass(frozen=True)
class TrainingWay:
    """One way to fit the model on a device: its quantization and whether activations are recomputed."""

    quantization: str
    gradient_checkpointing: bool

    def words(self) -> str:
        quantized = "unquantized" if self.quantization == "none" else self.quantization
        return f"{quantized}{' with gradient checkpointing' if self.gradient_checkpointing else ''}"


@dataclass
class Plan:
    """What one worker runs with; `rationale` has one line per choice.

    `memory_estimate_gib` is the plan's own arithmetic at its micro-batch,
    `memory_allowed_gib` the volunteer's share of the free memory, and
    `memory_cap_gib` what the worker's allocator is held to (the share less
    the context the allocator does not see). `samples_per_second` is what
    this machine's training worker measured for the same model, device,
    precision and quantization (the plan cache), and `calibrated` says it was
    at this plan's micro-batch and seq_len. `compression` is the rung this
    peer sends averaged tensors with (None when the manifest names none).
    `compute_share` is the most of the wall time the training loop computes
    (the volunteer's `max_compute_share`; 1: it never rests).
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
    gradient_checkpointing: bool = False
    memory_cap_gib: float | None = None
    rationale: list[str] = field(default_factory=list)
    compression: str | None = None
    samples_per_second: float | None = None
    calibrated: bool = False
    compute_share: float = 1.0

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.grad_accum

    def to_dict(self) -> dict:
        return {**asdict(self), "samples_per_step": self.samples_per_step}

    def to_status(self) -> control_types.Plan:
        """The plan as ``status`` shows it (``local.plan``, ``workers[].plan``)."""
        return control_types.Plan(**self.to_dict())

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        names = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in data.items() if key in names})


def choose_precision(device: DeviceFacts) -> tuple[str, str]:
    """bf16 from compute capability 8.0, fp16 from 7.0, fp32 below and on the CPU; with the reason."""
    if device.kind == "cpu":
        return "fp32", "precision fp32: training on the CPU"
    capability = device.compute_capability or (0, 0)
    shown = f"{capability[0]}.{capability[1]}"
    if capability >= BF16_COMPUTE_CAPABILITY:
        return "bf16", f"precision bf16: compute capability {shown} supports bfloat16"
    if capability >= FP16_COMPUTE_CAPABILITY:
        return "fp16", f"precision fp16: compute capability {shown} has no bfloat16 (needs 8.0)"
    return "fp32", (f"precision fp32: compute capability {shown} has no tensor cores, and its fp16 arithmetic is "
                    f"slower than fp32 (16-bit needs 7.0)")


def training_ways(facts: ModelFacts, device: DeviceFacts, measured: dict[str, float] | None = None) -> list[TrainingWay]:
    """The ways to train `facts` on `device`, fastest first.

    Without quantization before with it (dequantizing costs more than
    recomputing: nf4 ran 3x slower than bf16 at the same micro-batch on an
    H100); unquantized without gradient checkpointing before with it, and
    quantized always with it (QLoRA as peft prepares it, the way measured). nf4 before
    int8 (smaller, and faster at every micro-batch measured), unless this
    device measured int8 faster (`measured`: samples/s by quantization, from
    the plan cache). Quantization needs a CUDA GPU and LoRA (QLoRA); int8 needs
    compute capability 7.5.
    """
    quantizations = ["none"]
    if device.kind == "cuda" and facts.can_quantize:
        quantized = ["nf4"]
        if (device.compute_capability or (0, 0)) >= INT8_COMPUTE_CAPABILITY:
            measured = measured or {}
            int8_faster = measured.get("int8", 0.0) > measured.get("nf4", float("inf"))
            quantized = ["int8", "nf4"] if int8_faster else ["nf4", "int8"]
        quantizations += quantized
    unquantized = [TrainingWay("none", False), TrainingWay("none", True)]
    return unquantized + [TrainingWay(quantization, True) for quantization in quantizations[1:]]


def largest_divisor_at_most(total: int, limit: int) -> int:
    """The largest micro-batch <= `limit` that divides `total`, so accumulation reaches it exactly."""
    for size in range(max(1, min(total, limit)), 0, -1):
        if total % size == 0:
            return size
    return 1


def make_plan(facts: ModelFacts, manifest: dict, device: DeviceFacts, policy: PlanPolicy | None = None,
              measured: dict[str, float] | None = None) -> Plan:
    """Choose precision, quantization, gradient checkpointing, micro-batch, accumulation and threads for `device`.

    Args:
        facts: the model's shape, with the run's LoRA settings (`model_facts(model, lora)`).
        manifest: the run manifest as a dict; uses `seq_len` (default 128),
            `micro_batch_hint` (samples per step, default 8) and, for a `diloco`
            run that names one, `compression` with `compression_rungs`
            (`choose_compression`; sync mode sends the manifest's compression).
        device: the device to train on, with its free memory now.
        policy: the volunteer's caps; defaults to `PlanPolicy()`.
        measured: samples/s this device measured per quantization for this model
            (the plan cache); orders int8 and nf4 (`training_ways`).

    The way to train is the first of `training_ways` that fits
    `policy.enough_micro_batch` samples at once (or the manifest's micro-batch,
    if smaller); if none does, the one that fits the most. The micro-batch is
    the largest that fits and divides the manifest's micro-batch, so
    accumulation reaches it exactly.

    Raises:
        PlanError: the model does not fit even at one sample in any way.
    """
    policy = policy or PlanPolicy()
    seq_len = int(manifest.get("seq_len") or 128)
    wanted = int(manifest.get("micro_batch_hint") or 8)
    precision, precision_reason = choose_precision(device)
    free = device.memory_free_mib * MIB
    share = policy.ram_share if device.kind == "cpu" else policy.memory_share
    allowed = int(free * share)
    ways = training_ways(facts, device, measured)
    estimates = {way: estimate_memory(facts, precision, way.quantization, seq_len, device.kind, way.gradient_checkpointing)
                 for way in ways}
    limit = min(wanted, policy.max_micro_batch)
    fits = {way: min(limit, estimate.samples_that_fit(allowed)) for way, estimate in estimates.items()}
    memory_words = f"{format_gib(allowed)} allowed ({share:.0%} of {format_gib(free)} free)"
    if not any(fits.values()):
        smallest = min(ways, key=lambda way: estimates[way].total(1))
        raise PlanError(
            f"{facts.name} does not fit on {device.name}: one sample of {seq_len} tokens needs "
            f"{format_gib(estimates[smallest].total(1))} in {precision}, {smallest.words()}, but {memory_words}",
            "use a device with more free memory, a smaller model, or a shorter seq_len",
        )
    enough = min(wanted, policy.enough_micro_batch)
    way = next((way for way in ways if fits[way] >= enough), None) or max(ways, key=lambda way: fits[way])
    micro_batch = largest_divisor_at_most(wanted, fits[way])
    chosen = estimates[way]
    cpu_threads = _cpu_threads(device, policy)
    rationale = [
        precision_reason,
        _way_reason(facts, estimates, fits, way, ways, precision, seq_len, memory_words, enough, device),
        f"micro-batch {micro_batch} x {wanted // micro_batch} accumulation steps: the manifest wants {wanted} "
        f"samples per step, {micro_batch} fit at once (needs {format_gib(chosen.total(micro_batch))})",
        _threads_reason(device, policy, cpu_threads),
    ]
    if policy.compute_share < 1:
        rationale.append(f"computes {policy.compute_share:.0%} of the time: capped by max_compute_share = {policy.compute_share} "
                         f"(rests the remainder after each step)")
    compression = None
    if "compression" in manifest and manifest.get("mode") == "diloco":
        compression, reason = choose_compression(manifest, facts.trainable_parameters, device.uplink_mbit_s, policy)
        rationale.append(reason)
    return Plan(
        model=facts.name,
        device=device.torch_device,
        device_name=device.name,
        precision=precision,
        quantization=way.quantization,
        gradient_checkpointing=way.gradient_checkpointing,
        micro_batch=micro_batch,
        grad_accum=wanted // micro_batch,
        cpu_threads=cpu_threads,
        seq_len=seq_len,
        memory_estimate_gib=round(chosen.total(micro_batch) / GIB, 2),
        memory_allowed_gib=round(allowed / GIB, 2),
        memory_cap_gib=round((allowed - chosen.context) / GIB, 2),
        rationale=rationale,
        compression=compression,
        compute_share=policy.compute_share,
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


def _way_reason(facts: ModelFacts, estimates: dict[TrainingWay, MemoryEstimate], fits: dict[TrainingWay, int],
                way: TrainingWay, ways: list[TrainingWay], precision: str, seq_len: int, memory_words: str,
                enough: int, device: DeviceFacts) -> str:
    """One line: what the model needs, and why this quantization and checkpointing."""
    plain = estimates[ways[0]]
    need = (f"{format_parameters(facts.parameters)} params need {format_gib(plain.weights)} in {precision} plus "
            f"{format_gib(plain.per_sample)} per sample of {seq_len} tokens")
    checkpointing = "; gradient checkpointing on" if way.gradient_checkpointing else ""
    if way == ways[0]:
        if device.kind == "cpu":
            why = "bitsandbytes quantization needs a CUDA GPU"
        elif not facts.can_quantize:
            why = "full training cannot update quantized weights"
        else:
            why = f"a micro-batch of {fits[way]} fits in {memory_words}"
        return f"quantization none: {need}; {why}"
    tried = ", ".join(f"{earlier.words()} {fits[earlier]}" for earlier in ways[: ways.index(way) + 1])
    busy = f"{enough}, enough to keep the GPU busy"
    reason = f"the fastest way that fits {busy}" if fits[way] >= enough else f"the way that fits the most (none fits {busy})"
    weights = "" if way.quantization == "none" else f" (its weights take {format_gib(estimates[way].weights)})"
    return (f"quantization {way.quantization}{checkpointing}: {need}; samples that fit at once in {memory_words}: "
            f"{tried}; {way.words()}{weights} is {reason}")


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
