"""This machine: what it trains with, and its GPUs in nvitop's terms."""

from __future__ import annotations

from textual.markup import escape
from textual.reactive import var
from textual.widgets import Static

from p2ptrain.control_types import Cpu, Gpu, Hardware, LocalStatus, Plan
from p2ptrain.tui.formatting import format_count, format_number
from p2ptrain.tui.widgets import show_text

# (moderate, heavy) thresholds. Utilization and memory follow nvitop's defaults;
# temperature follows the throttling points of common consumer GPUs.
UTILIZATION_THRESHOLDS = (10, 75)
MEMORY_THRESHOLDS = (10, 80)
TEMPERATURE_THRESHOLDS = (75, 85)
POWER_THRESHOLDS = (80, 95)
FAN_THRESHOLDS = (60, 85)


def level(value: float | None, thresholds: tuple[float, float]) -> str:
    """The theme colour for ``value``: success below the first threshold, warning, then error."""
    if value is None:
        return "$text-muted"
    moderate, heavy = thresholds
    if value >= heavy:
        return "$error"
    if value >= moderate:
        return "$warning"
    return "$success"


def coloured(text: str, value: float | None, thresholds: tuple[float, float]) -> str:
    return f"[{level(value, thresholds)}]{text}[/]"


def percent(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else 100.0 * part / whole


def gpu_lines(gpu: Gpu) -> list[str]:
    """Two lines for one GPU: its name, then utilization, memory, temperature, power and fan."""
    memory_used = gpu.memory_used_mib
    memory_total = gpu.memory_total_mib
    memory_pct = percent(memory_used, memory_total)
    power_pct = percent(gpu.power_w, gpu.power_limit_w)
    utilization = gpu.utilization_pct
    temperature = gpu.temperature_c
    fan = gpu.fan_pct
    cells = [
        "util " + coloured(f"{format_number(utilization, 0)}%", utilization, UTILIZATION_THRESHOLDS),
        "mem "
        + coloured(
            f"{format_count(memory_used)}/{format_count(memory_total)} MiB", memory_pct, MEMORY_THRESHOLDS
        ),
        "temp " + coloured(f"{format_number(temperature, 0)}°C", temperature, TEMPERATURE_THRESHOLDS),
        "power "
        + coloured(
            f"{format_number(gpu.power_w, 0)}/{format_number(gpu.power_limit_w, 0)} W",
            power_pct,
            POWER_THRESHOLDS,
        ),
        "fan " + (coloured(f"{format_number(fan, 0)}%", fan, FAN_THRESHOLDS) if fan is not None else "n/a"),
    ]
    return [f"[b]GPU {gpu.index}[/b] {escape(gpu.name)}", "  " + "  ".join(cells)]


def describe_cpu(cpu: Cpu) -> str:
    """The daemon's CPU facts (``hardware.cpu``: model, cores_physical, cores_logical) in one line."""
    name = cpu.model or "CPU"
    cores, threads = cpu.cores_physical, cpu.cores_logical
    if cores and threads and threads != cores:
        return f"{name} ({cores} cores, {threads} threads)"
    return f"{name} ({cores} cores)" if cores else name


def plan_lines(plan: Plan | None) -> list[str]:
    """The daemon's hardware plan in one line: its memory (``i`` shows why it chose what it did)."""
    if not plan:
        return []
    return [f"plan: ~{format_number(plan.memory_estimate_gib, 1)} of "
            f"{format_number(plan.memory_allowed_gib, 1)} GiB allowed · [b]i[/b] why"]


def local_lines(local: LocalStatus) -> list[str]:
    """What this machine contributes to the run."""
    quantization = local.quantization
    precision = local.precision or "?"
    if quantization and quantization != "none":
        precision += f" + {quantization}"
    if local.gradient_checkpointing:
        precision += " + gradient checkpointing"
    micro_batch = "—" if local.micro_batch is None else local.micro_batch
    lines = [
        f"{escape(local.device)} · {precision} · micro-batch {micro_batch} × {local.grad_accum or 1}",
        *plan_lines(local.plan),
        f"{format_number(local.samples_per_second, 1)} samples/s · loss {format_number(local.loss, 3)}"
        f" · contributed {format_count(local.contributed_samples)} samples",
    ]
    trained = local.trained_samples
    if trained:
        # what share of this machine's work the run used, and why the rest was not
        used = local.contributed_samples
        unused = [f"{format_count(count)} {reason.replace('_', ' ')}" for reason, count in local.unused_samples.items() if count]
        lines.append(f"used {format_count(used)} of {format_count(trained)} trained ({used / trained:.0%})"
                     + (f" · not used: {', '.join(unused)}" if unused else ""))
    return lines


class HardwarePanel(Static):
    """The local peer's plan and its GPUs (or CPU when there is none)."""

    BORDER_TITLE = "This machine"

    local: var[LocalStatus | None] = var(None)
    hardware: var[Hardware | None] = var(None)

    def _refresh_view(self) -> None:
        lines = local_lines(self.local) if self.local else ["not training"]
        gpus = self.hardware.gpus if self.hardware else []
        for gpu in gpus:
            lines += gpu_lines(gpu)
        if not gpus:
            cpu = self.hardware.cpu if self.hardware else None
            lines.append(f"no NVIDIA GPU · {escape(describe_cpu(cpu))}" if cpu else "no NVIDIA GPU")
        show_text(self, "\n".join(lines))

    def on_mount(self) -> None:
        self._refresh_view()

    def watch_local(self) -> None:
        if self.is_mounted:
            self._refresh_view()

    def watch_hardware(self) -> None:
        if self.is_mounted:
            self._refresh_view()
