"""The hardware probe: NVIDIA GPUs through NVML, and the CPU and RAM through psutil.

NVML is reached through the `pynvml` module of `nvidia-ml-py`; `probe` takes
that module (or a fake with the same functions) as its `nvml` argument, which
is the one boundary tests fake. Everything here is cheap enough to run on
every status request; nothing imports torch.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from p2ptrain.control_types import Cpu, Gpu, GpuProcess, Hardware, Ram
from p2ptrain.daemon.plan import DeviceFacts

logger = logging.getLogger(__name__)

MIB = 1024**2
# NVML return codes (pynvml.NVML_ERROR_*): kept here so a fake NVML needs only its functions.
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
# After boot the driver may still be loading when the daemon starts.
NVML_RETRYABLE = {NVML_ERROR_DRIVER_NOT_LOADED, 999}
DEVICE_GROUPS_FIX = ("add the service user to the video and render groups: sudo usermod -aG video,render "
                     "p2ptrain (or your user), then restart the daemon")


@dataclass
class GpuFacts:
    """One NVIDIA GPU as NVML sees it now. Values NVML does not support on a card are None."""

    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    memory_free_mib: int
    compute_capability: tuple[int, int]
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: int | None = None
    processes: list[dict] = field(default_factory=list)


@dataclass
class CpuFacts:
    model: str
    cores_physical: int
    cores_logical: int


@dataclass
class RamFacts:
    total_mib: int
    available_mib: int


@dataclass
class HardwareFacts:
    """The machine now: GPUs (empty without NVIDIA), CPU, RAM, and health lines ({level, message, fix})."""

    gpus: list[GpuFacts]
    cpu: CpuFacts
    ram: RamFacts
    health: list[dict] = field(default_factory=list)
    nvml_version: str | None = None
    driver_version: str | None = None

    def to_status(self) -> Hardware:
        """The status object's `hardware` (`control_types.Hardware`): gpus, cpu, ram, driver_version."""
        gpus = []
        for gpu in self.gpus:
            entry = asdict(gpu)
            entry["compute_capability"] = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}"
            entry["processes"] = [GpuProcess(**process) for process in gpu.processes]
            gpus.append(Gpu(**entry))
        return Hardware(gpus=gpus, cpu=Cpu(**asdict(self.cpu)), ram=Ram(**asdict(self.ram)),
                        driver_version=self.driver_version)

    def devices(self) -> list[DeviceFacts]:
        """Each GPU as plan input, then the CPU (always last, the fallback)."""
        cores = self.cpu.cores_physical
        devices = [DeviceFacts(kind="cuda", index=gpu.index, name=gpu.name, memory_total_mib=gpu.memory_total_mib,
                               memory_free_mib=gpu.memory_free_mib, compute_capability=gpu.compute_capability,
                               cpu_cores=cores) for gpu in self.gpus]
        devices.append(DeviceFacts(kind="cpu", name=self.cpu.model, memory_total_mib=self.ram.total_mib,
                                   memory_free_mib=self.ram.available_mib, cpu_cores=cores))
        return devices


def select_gpus(gpus: str | list[int], hardware: HardwareFacts) -> list[DeviceFacts]:
    """The devices to run workers on, one worker (one peer) each: `gpus` is "all" or a list of NVML indices.

    No GPU present (or none selected that exists) gives the CPU alone.
    Raises ValueError naming indices that do not exist.
    """
    devices = hardware.devices()
    by_index = {device.index: device for device in devices if device.kind == "cuda"}
    if gpus == "all":
        chosen = list(by_index.values())
    else:
        missing = [index for index in gpus if index not in by_index]
        if missing and by_index:
            raise ValueError(f"training.gpus lists {missing} but this machine has GPUs {sorted(by_index)}; "
                             f"set gpus = \"all\" or a list of existing indices")
        chosen = [by_index[index] for index in gpus if index in by_index]
    return chosen or [devices[-1]]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_code(error: Exception) -> int | None:
    return getattr(error, "value", None)


def _optional(call: Callable, *args):
    """A query some cards do not support (fans on passively cooled cards, power on laptops): None then."""
    try:
        return call(*args)
    except Exception as error:  # pynvml raises NVMLError subclasses; a fake may raise anything
        logger.debug("NVML %s unavailable: %s", getattr(call, "__name__", call), error)
        return None


def _processes(nvml, handle) -> list[dict]:
    found: dict[int, dict] = {}
    for kind, query in (("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
                        ("compute", "nvmlDeviceGetComputeRunningProcesses")):
        for process in _optional(getattr(nvml, query), handle) or []:
            used = getattr(process, "usedGpuMemory", None)
            entry = found.setdefault(process.pid, {"pid": process.pid, "name": _process_name(process.pid),
                                                   "kinds": [], "used_memory_mib": None})
            entry["kinds"].append(kind)
            if isinstance(used, int) and used < 2**63:  # NVML reports "not available" as a huge value
                entry["used_memory_mib"] = used // MIB
    return list(found.values())


def _process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return "?"  # another user's process, or one that has already exited


def _gpu(nvml, index: int) -> GpuFacts:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    power = _optional(nvml.nvmlDeviceGetPowerUsage, handle)
    limit = _optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    utilization = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
    return GpuFacts(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        memory_total_mib=memory.total // MIB,
        memory_used_mib=memory.used // MIB,
        memory_free_mib=memory.free // MIB,
        compute_capability=tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)),
        utilization_pct=None if utilization is None else utilization.gpu,
        temperature_c=_optional(nvml.nvmlDeviceGetTemperature, handle, 0),  # 0 = NVML_TEMPERATURE_GPU
        power_w=None if power is None else power / 1000,  # NVML reports milliwatts
        power_limit_w=None if limit is None else limit / 1000,
        fan_pct=_optional(nvml.nvmlDeviceGetFanSpeed, handle),
        processes=_processes(nvml, handle),
    )


def _cpu_and_ram() -> tuple[CpuFacts, RamFacts]:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass  # not Linux: platform's answer stands
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    memory = psutil.virtual_memory()
    return (CpuFacts(model=model, cores_physical=physical, cores_logical=logical),
            RamFacts(total_mib=memory.total // MIB, available_mib=memory.available // MIB))


def nvidia_device_files() -> list[Path]:
    """The NVIDIA device nodes (/dev/nvidia0, /dev/nvidiactl...) on this machine."""
    return sorted(Path("/dev").glob("nvidia*"))


def _init_nvml(nvml, retries: int, retry_delay_s: float, sleep: Callable[[float], None]) -> list[dict]:
    """Initialize NVML, retrying while the driver loads; returns health lines (empty when fine)."""
    for attempt in range(retries + 1):
        try:
            nvml.nvmlInit()
            return []
        except Exception as error:
            code = _error_code(error)
            if code == NVML_ERROR_LIBRARY_NOT_FOUND and not nvidia_device_files():
                return [{"level": "info", "message": "no NVIDIA GPU or driver found: training on the CPU",
                         "fix": "install the NVIDIA driver if this machine has an NVIDIA GPU"}]
            if code == NVML_ERROR_NO_PERMISSION:
                return [{"level": "error", "message": "cannot open the NVIDIA GPU: permission denied",
                         "fix": DEVICE_GROUPS_FIX}]
            if code not in NVML_RETRYABLE or attempt == retries:
                return [{"level": "error", "message": f"NVML failed to start: {error}",
                         "fix": "check the NVIDIA driver with nvidia-smi; reboot after a driver update"}]
            logger.info("NVML not ready (%s), retrying in %.0f s", error, retry_delay_s)
            sleep(retry_delay_s)
    return []


def probe(nvml=None, retries: int = 0, retry_delay_s: float = 5.0,
          sleep: Callable[[float], None] = time.sleep) -> HardwareFacts:
    """Look at the machine's GPUs, CPU and RAM now.

    Args:
        nvml: the `pynvml` module, or a fake with the same functions (tests);
            None imports `pynvml`.
        retries: how many more times to try NVML when the driver is not
            loaded yet (the daemon passes a few at boot; `doctor` none).
        retry_delay_s: seconds between tries.
        sleep: how to wait between tries (tests pass a fake).

    Never raises for a missing or broken GPU: that becomes a CPU-only result
    with a line in `health`.
    """
    cpu, ram = _cpu_and_ram()
    if nvml is None:
        import pynvml as nvml
    health = _init_nvml(nvml, retries, retry_delay_s, sleep)
    if health:
        return HardwareFacts(gpus=[], cpu=cpu, ram=ram, health=health)
    gpus: list[GpuFacts] = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                gpus.append(_gpu(nvml, index))
            except Exception as error:
                fix = (DEVICE_GROUPS_FIX if _error_code(error) == NVML_ERROR_NO_PERMISSION
                       else "check the card with nvidia-smi")
                health.append({"level": "error", "message": f"cannot read GPU {index}: {error}", "fix": fix})
        driver = _optional(nvml.nvmlSystemGetDriverVersion)
        version = _optional(nvml.nvmlSystemGetNVMLVersion)
    finally:
        _optional(nvml.nvmlShutdown)
    unreadable = [path for path in nvidia_device_files() if not os.access(path, os.R_OK | os.W_OK)]
    if unreadable:
        health.append({"level": "warning", "message": f"no access to {', '.join(map(str, unreadable))}",
                       "fix": DEVICE_GROUPS_FIX})
    return HardwareFacts(gpus=gpus, cpu=cpu, ram=ram, health=health,
                         driver_version=None if driver is None else _text(driver),
                         nvml_version=None if version is None else _text(version))
