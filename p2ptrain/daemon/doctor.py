"""`p2ptrain doctor`: the real hardware, the plan it gets, and checks that each say how to fix a failure.

The CLI imports this module only for `p2ptrain doctor` (its `add_arguments`
and `run`), so other commands never pay for it. On a machine without a GPU it never
imports torch (the CUDA check reads torch's build facts from its
files), which keeps it within a few seconds.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import grp
import importlib.metadata
import importlib.util
import json
import os
import re
from pathlib import Path

from p2ptrain.control_types import Status
from p2ptrain.daemon.hardware_probe import DEVICE_GROUPS_FIX, HardwareFacts, nvidia_device_files, probe
from p2ptrain.daemon.model_facts import ModelFactsError, model_facts
from p2ptrain.daemon.plan import PlanError, PlanPolicy, make_plan
from p2ptrain.peers.net.ports import NEXT_PORTS_TRIED, PortHolder, port_holder, port_is_free, port_move

DEFAULT_DHT_PORT = 31337
TIME_ERROR = 5  # adjtimex(2): the kernel's clock is not synchronized


def check(name: str, ok: bool, message: str, fix: str = "", level: str | None = None) -> dict:
    """One check result: {name, ok, level ("ok", "info", "warning", "error"), message, fix}."""
    return {"name": name, "ok": ok, "level": level or ("ok" if ok else "error"), "message": message,
            "fix": "" if ok else fix}


def check_nvml(hardware: HardwareFacts) -> dict:
    problems = [line for line in hardware.health if line["level"] in ("warning", "error")]
    if problems:
        return check("nvml", False, problems[0]["message"], problems[0]["fix"])
    if not hardware.gpus:
        return check("nvml", True, "no NVIDIA GPU or driver found: training on the CPU", level="info")
    names = ", ".join(f"{gpu.index}: {gpu.name}" for gpu in hardware.gpus)
    return check("nvml", True, f"NVML {hardware.nvml_version}, driver {hardware.driver_version}; GPUs {names}")


def _torch_build() -> tuple[str | None, str | None]:
    """(torch version, CUDA version it was built for) from torch/version.py, without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None, None
    text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    version = re.search(r"^__version__\s*=\s*'([^']*)'", text, re.MULTILINE)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*'([^']*)'", text, re.MULTILINE)
    return (version.group(1) if version else "unknown"), (cuda.group(1) if cuda else None)


def check_cuda(hardware: HardwareFacts) -> dict:
    version, cuda = _torch_build()
    if version is None:
        return check("cuda", False, "torch is not installed", "pip install torch")
    if not hardware.gpus:
        return check("cuda", True, f"torch {version} ({'CUDA ' + cuda if cuda else 'CPU build'}); no GPU, "
                     "CUDA not needed", level="info")
    if cuda is None:
        return check("cuda", False, f"torch {version} is a CPU build but this machine has an NVIDIA GPU",
                     "install the CUDA build of torch: pip install --force-reinstall torch")
    import torch

    if not torch.cuda.is_available():
        return check("cuda", False, f"torch {version} (CUDA {cuda}) cannot use the GPU",
                     "update the NVIDIA driver to one that supports CUDA " + cuda)
    return check("cuda", True, f"torch {version}, CUDA {cuda}, {torch.cuda.device_count()} device(s)")


def check_bitsandbytes(hardware: HardwareFacts) -> dict:
    try:
        version = importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        level = "warning" if hardware.gpus else "info"
        return check("bitsandbytes", not hardware.gpus, "bitsandbytes is not installed: no int8/nf4 (QLoRA)",
                     "pip install bitsandbytes", level=level)
    if not hardware.gpus:
        return check("bitsandbytes", True, f"bitsandbytes {version}; quantization is for GPUs, not needed here",
                     level="info")
    try:
        import bitsandbytes  # noqa: F401  (loads its CUDA library: the part that fails)
    except Exception as error:
        return check("bitsandbytes", False, f"bitsandbytes {version} does not load: {error}",
                     "pip install --force-reinstall bitsandbytes", level="warning")
    return check("bitsandbytes", True, f"bitsandbytes {version} loads: int8 and nf4 available")


def check_device_groups() -> dict:
    devices = nvidia_device_files() + sorted(Path("/dev/dri").glob("renderD*"))
    if not nvidia_device_files():
        return check("device-groups", True, "no NVIDIA device files: nothing to open", level="info")
    closed = [str(path) for path in devices if not os.access(path, os.R_OK | os.W_OK)]
    groups = sorted(grp.getgrgid(gid).gr_name for gid in os.getgroups() if _group_exists(gid))
    if closed:
        return check("device-groups", False, f"cannot open {', '.join(closed)} (groups: {', '.join(groups)})",
                     DEVICE_GROUPS_FIX)
    return check("device-groups", True, f"GPU device files open (groups: {', '.join(groups)})")


def _group_exists(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def _load_config(home: str | None):
    """The daemon's config, or None when it is missing or broken (the daemon reports that itself)."""
    try:
        from p2ptrain.config import load_config
        from p2ptrain.paths import resolve_paths

        return load_config(resolve_paths(home).config_file)
    except Exception:
        return None


def _dht_port(config) -> int:
    """The TCP port of the first configured DHT listen address (default 31337)."""
    for address in config.dht.host_maddrs if config is not None else []:
        match = re.search(r"/tcp/(\d+)", address)
        if match:
            return int(match.group(1))
    return DEFAULT_DHT_PORT


def _plan_policy(config) -> PlanPolicy:
    """The volunteer's caps from the config's [policy] table (defaults when it is missing or invalid)."""
    from p2ptrain.config import PolicySettings

    policy = getattr(config, "policy", None) or {}
    try:
        settings = policy if isinstance(policy, PolicySettings) else PolicySettings(**policy)
    except ValueError:
        settings = PolicySettings()
    return PlanPolicy.from_settings(settings)


def check_dht_port(config, home: str | None) -> dict:
    """Whether the DHT can listen on its configured TCP port, and where it listens when another program holds it."""
    port = _dht_port(config)
    if port == 0:
        return check("dht-port", True, "DHT listens on a random port: peers behind NAT reach us through relays",
                     level="info")
    try:
        free = port_is_free("0.0.0.0", port)
    except OSError as error:
        return check("dht-port", False, f"cannot listen on TCP port {port}: {error.strerror}",
                     "set dht.host_maddrs to a port above 1024, e.g. /ip4/0.0.0.0/tcp/31337")
    if free:
        return check("dht-port", True, f"TCP port {port} is free to listen on; whether peers can dial it is measured "
                     f"once the daemon is in a run (the reachability check)")
    holder = port_holder(port) or PortHolder(None)
    if holder.p2ptrain_daemon_pid is not None and holder.p2ptrain_daemon_pid == _daemon_pid(home):
        return check("dht-port", True, f"TCP port {port}: this daemon's DHT listens on it")
    listening = _listening_port(home)
    instead = listening or next((candidate for candidate in range(port + 1, port + 1 + NEXT_PORTS_TRIED)
                                 if port_is_free("0.0.0.0", candidate)), 0)
    move = port_move("tcp", port, instead, holder.describe())
    message = move.message if listening else (f"TCP port {port} is taken by {move.holder}: the daemon will listen on "
                                              f"{f'port {instead}' if instead else 'a random port'} instead")
    return check("dht-port", False, message, move.fix, level="warning")


def _daemon_pid(home: str | None) -> int | None:
    """The pid of the daemon the CLI talks to (from the pid file beside its socket), or None."""
    from p2ptrain.paths import control_socket

    try:
        return int(control_socket(home).with_name("daemon.pid").read_text())
    except (OSError, ValueError):
        return None


def _listening_port(home: str | None) -> int | None:
    """The TCP port this home's daemon listens on, when it runs and is in a run."""
    local = _daemon_status(home, 2).local
    for address in local.addresses if local else []:
        match = re.search(r"/tcp/(\d+)", address)
        if match:
            return int(match.group(1))
    return None


def check_reachability(home: str | None, config) -> dict:
    """What peers of the run measured when they dialed this peer back (asked from the running daemon)."""
    from p2ptrain.peers.net.reachability import fix_for

    local = _daemon_status(home, 5).local
    reachability = local.reachability if local else None
    addresses = local.addresses if local else []
    if not reachability:
        return check("reachability", True, "measured when the daemon is in a run (peers dial it back): join a run, "
                     "then run p2ptrain doctor again", level="info")
    if reachability == "unknown":
        return check("reachability", True, "not measured yet: no other peer of the run has dialed this one back",
                     level="info")
    if reachability == "direct":
        return check("reachability", True, f"peers dial this peer directly at {addresses[0] if addresses else '?'}")
    dht = config.dht if config is not None else None
    fix = fix_for(reachability, dht.host_maddrs if dht else [f"/ip4/0.0.0.0/tcp/{DEFAULT_DHT_PORT}"],
                  dht.announce_maddrs if dht else [], addresses)
    message = {"relayed": "peers reach this one only through a relay",
               "unreachable": "peers of the run cannot dial this one (behind NAT or a firewall)"}[reachability]
    if local.averaging_client:
        message += "; it averages as a client (sends its share, never reduces) and serves no DHT requests"
    return check("reachability", False, message, fix, level="warning")


def check_clock() -> dict:
    """Whether the kernel's clock is synchronized (NTP): DHT records expire by wall-clock time."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        state = libc.adjtimex(ctypes.create_string_buffer(512))  # modes = 0: read only
    except (OSError, AttributeError):
        return check("clock", True, "cannot ask the kernel about clock synchronization here", level="info")
    if state == TIME_ERROR:
        return check("clock", False, "the clock is not synchronized (no NTP): DHT records expire by wall-clock "
                     "time, so a clock off by minutes makes peers miss each other",
                     "enable time synchronization: sudo timedatectl set-ntp true", level="warning")
    return check("clock", True, "the clock is synchronized (NTP)")


def check_user_activity() -> dict:
    from p2ptrain.daemon.policies import SystemSensors

    sensors = SystemSensors()
    idle = sensors.user_idle_s()
    if idle is None:
        return check("user-activity", False, "cannot tell when the computer is in use (no logind session "
                     "manager, no X11 display): pausing while the user is active never triggers",
                     "run under systemd-logind, or set policy.schedule to the hours this machine may train",
                     level="warning")
    return check("user-activity", True, f"user activity read from {sensors.idle_source} (idle {idle:.0f} s)")


def diagnose(home: str | None, model: str | None) -> dict:
    """Everything `doctor` reports: {hardware, plan, plans, checks}.

    The plans are the running daemon's for its run's workers (with the rationale it
    made them with), or, outside a run or for `model`, what this machine's devices
    would do with `model` (default: the built-in tiny model).
    """
    hardware = probe()
    config = _load_config(home)
    checks = [check_nvml(hardware), check_cuda(hardware), check_bitsandbytes(hardware), check_device_groups(),
              check_dht_port(config, home), check_reachability(home, config), check_clock(), check_user_activity()]
    plans = None if model else _run_plans(home)
    if not plans:
        plans = _device_plans(hardware, model or "tiny", _plan_policy(config))
    return {"hardware": {**hardware.to_status().to_dict(), "health": hardware.health}, "plan": plans[0], "plans": plans,
            "checks": checks}


def _device_plans(hardware: HardwareFacts, model: str, policy: PlanPolicy) -> list[dict]:
    """What each device of this machine would do with `model` (the CPU only where there is no GPU)."""
    plans = []
    for device in hardware.devices():
        if device.kind == "cpu" and hardware.gpus:
            break  # the CPU is only the fallback when there are GPUs
        try:
            plans.append(make_plan(model_facts(model, None if model == "tiny" else {"r": 8}), {}, device,
                                   policy).to_dict())
        except (PlanError, ModelFactsError) as error:
            plans.append({"device": device.torch_device, "error": str(error)})
    return plans


def _run_plans(home: str | None) -> list[dict]:
    """The running daemon's plan for each worker of its run, as made (empty outside a run or without a daemon)."""
    status = _daemon_status(home, 2)
    workers = status.local.workers if status.local else []
    return [{**worker.plan.to_dict(), "device": worker.device, "run": status.run_id} for worker in workers if worker.plan]


def _daemon_status(home: str | None, timeout: float) -> Status:
    """The running daemon's status; one of no run and no worker when no daemon answers (properly)."""
    from p2ptrain.paths import control_socket
    from p2ptrain.protocol import ControlClient, DaemonError, DaemonNotRunning

    try:
        return Status.from_dict(ControlClient(str(control_socket(home)), timeout=timeout).call("status"), "the daemon's status")
    except (DaemonError, DaemonNotRunning, OSError, ValueError):  # MalformedReply is a ValueError
        return Status(protocol=0, version="", state="stopped", started_at=0.0)


def _print_report(report: dict) -> None:
    hardware = report["hardware"]
    print(f"CPU: {hardware['cpu']['model']}, {hardware['cpu']['cores_physical']} cores; RAM "
          f"{hardware['ram']['available_mib'] / 1024:.1f} of {hardware['ram']['total_mib'] / 1024:.1f} GiB free")
    for gpu in hardware["gpus"]:
        print(f"GPU {gpu['index']}: {gpu['name']}, {gpu['memory_free_mib'] / 1024:.1f} of "
              f"{gpu['memory_total_mib'] / 1024:.1f} GiB free, compute capability {gpu['compute_capability']}, "
              f"{gpu['temperature_c']} C")
    for plan in report["plans"]:
        if "error" in plan:
            print(f"plan on {plan['device']}: {plan['error']}")
            continue
        run = f" in run {plan['run']}" if plan.get("run") else f" for {plan['model']}"
        checkpointing = ", gradient checkpointing" if plan.get("gradient_checkpointing") else ""
        print(f"plan on {plan['device']}{run}: {plan['precision']}, quantization {plan['quantization']}{checkpointing}, "
              f"micro-batch {plan['micro_batch']} x {plan['grad_accum']}, {plan['cpu_threads']} CPU threads, "
              f"~{plan['memory_estimate_gib']} of {plan['memory_allowed_gib']} GiB allowed")
        for line in plan["rationale"]:
            print(f"  - {line}")
    for item in report["checks"]:
        mark = {"ok": "ok  ", "info": "info", "warning": "WARN", "error": "FAIL"}[item["level"]]
        print(f"[{mark}] {item['name']}: {item['message']}")
        if item["fix"]:
            print(f"       fix: {item['fix']}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `p2ptrain doctor` (the CLI adds its global options, `--home` among them)."""
    parser.add_argument("--json", action="store_true", help="print {hardware, plan, plans, checks} as JSON")
    parser.add_argument("--model", help="the model to plan for (default: the run's plans when the daemon is in a "
                                         "run, else the built-in tiny model)")


def run(options: argparse.Namespace) -> int:
    """`p2ptrain doctor [--json] [--home DIR] [--model M]`; exit 1 when a check failed with level error."""
    report = diagnose(options.home, options.model)
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return 1 if any(item["level"] == "error" for item in report["checks"]) else 0

