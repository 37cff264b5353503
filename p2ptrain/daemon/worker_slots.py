"""Which training workers this daemon runs, and what each one is started with.

One worker (one peer of the swarm) per selected GPU, or one CPU worker when
there is no GPU. Each worker is its own hivemind peer, so everything that makes
a peer is its own: identity key, checkpoint directory, process-group record,
hardware plan. The first worker keeps the single-worker file names
(``identity.key``, ``checkpoints/``, ``worker.pgid``), so a machine that had one
GPU keeps its peer id and checkpoint when it gets a second.

A GPU worker sees only its own GPU (``CUDA_VISIBLE_DEVICES``, with CUDA
numbering the cards in PCI bus order as NVML does), so inside it the card is
``cuda:0`` and nothing it or a library allocates lands on another card.

Everything here is a pure function of (config, probed devices, paths): no
torch, no processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from p2ptrain.config import Config
from p2ptrain.daemon.hardware_probe import HardwareFacts, select_gpus
from p2ptrain.daemon.memory import GIB
from p2ptrain.daemon.model_facts import model_facts
from p2ptrain.daemon.plan import DeviceFacts, Plan, PlanPolicy, choose_precision, make_plan
from p2ptrain.daemon.temp_files import worker_temp_dir
from p2ptrain.paths import Paths
from p2ptrain.peers.worker.plan_cache import measured_speeds
from p2ptrain.worker_pipe import DhtOptions, WorkerPaths, WorkerPlan, WorkerSpec, halved_micro_batch

_PORT = re.compile(r"/(tcp|udp)/(\d+)")
RESTART_BACKOFF_S = (5, 10, 30, 60, 120, 300)


@dataclass(frozen=True)
class WorkerSlot:
    """One training worker of this daemon and the files that are its own.

    Attributes:
        name: ``gpu<NVML index>`` or ``cpu``; names its files (all but the first
            worker's) and its lines in events and logs.
        device: the device it trains on, as probed when the run started.
        identity_key: its hivemind identity (its peer id).
        checkpoints_dir: where its checkpoints of each run go.
        pgid_file: where its process group is recorded, so a daemon started
            after a SIGKILL ends what this worker left behind.
        position: 0 for the first worker; each worker listens on the
            configured ports plus its position, as two peers cannot share a port.
    """

    name: str
    device: DeviceFacts
    identity_key: Path
    checkpoints_dir: Path
    pgid_file: Path
    position: int = 0

    @property
    def device_label(self) -> str:
        """The device in this machine's numbering (NVML's, as in ``training.gpus``): ``cuda:1``, ``cpu``."""
        return self.device.torch_device

    @property
    def worker_device(self) -> str:
        """The device as the worker names it: it sees only its own GPU, as ``cuda:0``."""
        return "cpu" if self.device.kind == "cpu" else "cuda:0"

    def environment(self) -> dict[str, str]:
        """Environment variables the worker sets before torch starts CUDA."""
        if self.device.kind == "cpu":
            return {}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(self.device.index)}


@dataclass
class WorkerRestarts:
    """One worker's crashes and out-of-memory errors in this run, for its own back-off.

    Attributes:
        crashes_in_a_row: exits since it last joined the swarm.
        restart_at: ``time.monotonic()`` of its next start, None when none is due.
        micro_batch_halvings: out-of-memory errors so far.
        out_of_memory_at: ``(micro_batch, grad_accum)`` it last ran out of
            memory at; its next starts use at most half of it (``halved_micro_batch``).
        ran_out_of_memory: its current process reported an out-of-memory error.
    """

    crashes_in_a_row: int = 0
    restart_at: float | None = None
    micro_batch_halvings: int = 0
    out_of_memory_at: tuple[int, int] | None = None
    ran_out_of_memory: bool = False

    def micro_batch_cap(self) -> tuple[int, int] | None:
        """The largest ``(micro_batch, grad_accum)`` its next start may use, None for the plan's."""
        return halved_micro_batch(*self.out_of_memory_at) if self.out_of_memory_at else None


def select_devices(config: Config, hardware: HardwareFacts) -> list[DeviceFacts]:
    """The devices to train on: ``training.gpus`` of the probed GPUs, or the CPU.

    Args:
        config: uses ``training.device`` ("cpu" forces the CPU) and ``training.gpus``
            ("all" or a list of NVML indices).
        hardware: the probe's result.

    Raises:
        ValueError: ``training.gpus`` names a GPU this machine does not have
            (the message says how to fix it).
    """
    if config.training.device == "cpu":
        return [hardware.devices()[-1]]
    return select_gpus(config.training.gpus, hardware)


def worker_slots(devices: list[DeviceFacts], paths: Paths) -> list[WorkerSlot]:
    """One slot per device, the first with the single-worker file names.

    Args:
        devices: from ``select_devices``, in the order the config lists them.
        paths: the daemon's directories.
    """
    slots = []
    for position, device in enumerate(devices):
        name = "cpu" if device.kind == "cpu" else f"gpu{device.index}"
        if position == 0:
            slots.append(WorkerSlot(name, device, paths.identity_key, paths.checkpoints_dir, paths.worker_pgid_file))
        else:
            slots.append(
                WorkerSlot(
                    name,
                    device,
                    identity_key=paths.state_dir / f"identity-{name}.key",
                    checkpoints_dir=paths.checkpoints_dir / name,
                    pgid_file=paths.state_dir / f"worker-{name}.pgid",
                    position=position,
                )
            )
    return slots


def shifted_ports(maddrs: list[str], offset: int) -> list[str]:
    """``maddrs`` with every fixed TCP/UDP port raised by ``offset`` (port 0, "any free port", stays 0).

    Args:
        maddrs: multiaddrs such as ``/ip4/0.0.0.0/tcp/31337``.
        offset: the worker's position.
    """

    def shift(match: re.Match) -> str:
        port = int(match.group(2))
        return f"/{match.group(1)}/{port + offset if port else 0}"

    return [_PORT.sub(shift, maddr) for maddr in maddrs]


def leftover_pgid_files(state_dir: Path) -> list[Path]:
    """Every worker's process-group record in ``state_dir`` (``worker.pgid``, ``worker-gpu1.pgid``...)."""
    return sorted(state_dir.glob("worker*.pgid"))


def hardware_plan(slot: WorkerSlot, manifest: dict, policy: PlanPolicy, uplink_mbit_s: float | None = None,
                  cache_dir: Path | None = None) -> Plan:
    """The hardware plan for one worker's device, sized from its free memory now.

    Args:
        slot: the worker.
        manifest: the run manifest (the daemon's own for a run it creates or has
            joined before; the worker's, read from the swarm, for a new joiner).
        policy: the volunteer's caps.
        uplink_mbit_s: the configured upload bandwidth, which picks the compression rung.
        cache_dir: where this machine's measurements are (the plan cache), which order
            int8 and nf4; None: by the arithmetic alone.

    Raises:
        ModelFactsError: the model's shape cannot be found here.
        PlanError: the model does not fit the device.
    """
    facts = model_facts(manifest["model"], manifest.get("lora"))
    device = replace(slot.device, uplink_mbit_s=uplink_mbit_s)
    measured = None
    if cache_dir is not None:
        precision, _ = choose_precision(device)
        measured = measured_speeds(cache_dir, facts.name, device.name, precision)
    return make_plan(facts, manifest, device, policy, measured)


def worker_plan(slot: WorkerSlot, plan: Plan, max_micro_batch: int | None = None) -> WorkerPlan:
    """What the worker trains with: ``plan`` on the worker's own name for its device; its calibration
    grows the micro-batch to at most ``max_micro_batch`` (after out-of-memory errors in training)."""
    return WorkerPlan(
        device=slot.worker_device, precision=plan.precision, quantization=plan.quantization,
        micro_batch=plan.micro_batch, grad_accum=plan.grad_accum, cpu_threads=plan.cpu_threads, compute_share=plan.compute_share,
        device_name=slot.device.name,
        compression=plan.compression, gradient_checkpointing=plan.gradient_checkpointing,
        memory_cap_bytes=int(plan.memory_cap_gib * GIB) if plan.memory_cap_gib else None,
        max_micro_batch=max_micro_batch,
    )


def restart_delay_s(crashes_in_a_row: int) -> int:
    """Seconds to wait before starting a worker that crashed this many times in a row (at least once)."""
    return RESTART_BACKOFF_S[min(max(crashes_in_a_row, 1), len(RESTART_BACKOFF_S)) - 1]


def worker_spec(
    slot: WorkerSlot, run_request: dict, config: Config, paths: Paths, plan: WorkerPlan | None, workers: int,
    banned_peers: list[str] | None = None, check_identity_free: bool = True,
) -> WorkerSpec:
    """The spec one worker is started with.

    Args:
        slot: the worker.
        run_request: the desired run (``run_id``, ``manifest``, ``new_run``, ``initial_peers``).
        config: the daemon's config (DHT settings, nickname, checkpoint interval, log level).
        paths: the daemon's directories (state and the shared data cache).
        plan: from ``worker_plan`` (its micro-batch capped after an out-of-memory error); None
            without the run's manifest: the worker asks for one once it has read it (``PlanWanted``).
        workers: how many workers this daemon runs; with several, each
            nickname says its GPU, so the swarm's peer table tells them apart.
        banned_peers: peer ids this machine banned in the run (``storage/bans.py``):
            the worker leaves them out of its rounds and state downloads from the start.
        check_identity_free: run hivemind's check that no other peer uses the slot's identity
            (``identity_use.IdentityUse.needs_check``).

    Each worker after the first listens on the configured ports plus its
    position (``shifted_ports``): forward those too to be reachable directly.
    """
    dht = config.dht
    return WorkerSpec(
        run_id=run_request["run_id"],
        manifest=run_request.get("manifest"),
        new_run=bool(run_request.get("new_run")),
        initial_peers=run_request.get("initial_peers") or config.dht.initial_peers,
        paths=WorkerPaths(
            state_dir=str(paths.state_dir),
            cache_dir=str(paths.cache_dir),
            checkpoints_dir=str(slot.checkpoints_dir),
            identity_key=str(slot.identity_key),
        ),
        dht=DhtOptions(
            host_maddrs=shifted_ports(dht.host_maddrs, slot.position),
            announce_maddrs=shifted_ports(dht.announce_maddrs, slot.position),
            use_relay=dht.use_relay,
            use_auto_relay=dht.use_auto_relay,
            client_mode=dht.client_mode,
            start_timeout_s=dht.start_timeout_s,
            check_identity_free=check_identity_free,
        ),
        nickname=f"{config.nickname}-{slot.name}" if workers > 1 else config.nickname,
        plan=plan,
        uplink_mbit_s=config.training.uplink_mbit_s,
        checkpoint_interval_s=config.training.checkpoint_interval_s,
        log_level=config.log_level,
        environment=slot.environment(),
        temp_dir=str(worker_temp_dir(paths, slot.name)),  # its TMPDIR: see temp_files.py
        banned_peers=list(banned_peers or ()),
        device_label=slot.device_label,  # what peers are shown: the worker itself sees only cuda:0
    )
