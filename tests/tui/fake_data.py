"""The canned state the TUI's fake daemon serves: a three-peer run of the tiny model, mid-epoch.

Every timestamp is fixed relative to ``FROZEN_NOW`` (tests give the app a
clock that returns it), so the screens are the same on every run. The shapes
are the real daemon's (``test_tui_fake_contract.py`` compares them).
"""

from __future__ import annotations

from p2ptrain.protocol import PROTOCOL_VERSION

# The frozen "now" of every canned timestamp; tests give the app a clock that returns it.
FROZEN_NOW = 1_767_000_000.0
RUN_ID = "tiny-demo"
LOCAL_PEER_ID = "12D3KooWLocalPeer0000000000000000000000000000AmberFox"


def _gpu() -> dict:
    return {
        "index": 0,
        "name": "NVIDIA GeForce RTX 3060",
        "uuid": "GPU-5f0c2a8e-0000-0000-0000-3060a1b2c3d4",
        "memory_total_mib": 12288,
        "memory_used_mib": 10650,
        "memory_free_mib": 1638,
        "compute_capability": "8.6",
        "utilization_pct": 97,
        "temperature_c": 78,
        "power_w": 162.0,
        "power_limit_w": 170.0,
        "fan_pct": 64,
        "processes": [],
    }


def _hardware() -> dict:
    return {
        "gpus": [_gpu()],
        "cpu": {"model": "AMD Ryzen 5 5600X", "cores_physical": 6, "cores_logical": 12},
        "ram": {"total_mib": 32000, "available_mib": 21000},
        "driver_version": "550.54.14",
    }


def _local() -> dict:
    return {
        "peer_id": LOCAL_PEER_ID,
        "nickname": "amber-fox",
        "addresses": ["/ip4/127.0.0.1/tcp/40111/p2p/" + LOCAL_PEER_ID],
        "reachability": "direct",
        "reachability_checked_at": None,
        "averaging_client": False,
        "traffic": None,
        "device": "cuda:0",
        "precision": "bf16",
        "quantization": "none",
        "gradient_checkpointing": False,
        "micro_batch": 8,
        "grad_accum": 4,
        "parameters": 23_400_000,
        "trainable_parameters": 23_400_000,
        "samples_per_second": 41.7,
        "loss": 2.871,
        "trained_samples": 160_000,
        "contributed_samples": 153_600,
        "unused_samples": {"late": 4_800, "failed_round": 0, "rejected": 0},
        "waiting": None,
        "calibrated_samples_per_second": 44.9,
    }


def _plan() -> dict:
    """The daemon's hardware plan for the worker (``status.local.plan``, ``daemon/plan.py: Plan.to_dict``)."""
    return {
        "model": "tiny", "device": "cuda:0", "device_name": "NVIDIA GeForce RTX 4090", "precision": "bf16",
        "quantization": "none", "micro_batch": 8, "grad_accum": 4, "cpu_threads": 2, "seq_len": 128,
        "memory_estimate_gib": 0.66, "memory_allowed_gib": 20.21, "gradient_checkpointing": False,
        "memory_cap_gib": 19.71, "compression": None, "samples_per_second": None, "calibrated": False,
        "samples_per_step": 32,
        "rationale": ["precision bf16: compute capability 8.9 supports bfloat16",
                      "quantization none: 824.8K params need 2 MiB in bf16 plus 4 MiB per sample of 128 tokens; "
                      "full training cannot update quantized weights",
                      "micro-batch 8 x 4 accumulation steps: the manifest wants 32 samples per step, 8 fit at once "
                      "(needs 534 MiB)",
                      "2 CPU threads: enough to feed the GPU"],
    }


WORKER_FIELDS = ("device", "peer_id", "precision", "quantization", "gradient_checkpointing", "micro_batch", "grad_accum",
                 "samples_per_second", "loss", "trained_samples", "contributed_samples", "unused_samples", "plan")


def local_status() -> dict:
    """``status["local"]``: this peer, one worker on its GPU."""
    local = {**_local(), "plan": _plan()}
    worker = {name: local[name] for name in WORKER_FIELDS}
    return {**local, "workers": [{**worker, "state": "training"}]}


def planned_local_status() -> dict:
    """``status["local"]`` while the worker joins: only what the daemon's plan says (no peer yet)."""
    plan = _plan()
    local = {name: plan[name] for name in ("precision", "quantization", "gradient_checkpointing", "micro_batch", "grad_accum")}
    local.update(device="cuda:0", plan=plan, traffic=None, waiting=None, samples_per_second=None, loss=None, trained_samples=0, contributed_samples=0,
                 unused_samples={"late": 0, "failed_round": 0, "rejected": 0})
    worker = {name: local.get(name) for name in WORKER_FIELDS}
    return {**local, "workers": [{**worker, "state": "joining"}]}


def run_status(run_id: str = RUN_ID) -> dict:
    """``status["run"]`` of a run mid-epoch."""
    return {
        "id": run_id,
        "mode": "sync",
        "model": "tiny",
        "manifest_hash": "9f2c1e",
        "epoch": 42,
        "samples_accumulated": 2816,
        "target_batch_size": 4096,
        "eta_next_epoch_s": 31.0,
        "num_peers": 3,
        "last_epoch_at": FROZEN_NOW - 5 * 60,
        "as_of": None,
    }


def training_status() -> dict:
    """The daemon mid-epoch in a three-peer run."""
    return {
        "protocol": PROTOCOL_VERSION,
        "version": "0.1.0",
        "state": "training",
        "pause_reason": None,
        "since": FROZEN_NOW - 2 * 3600 - 5 * 60,
        "paused_until": None,
        "started_at": FROZEN_NOW - 26 * 3600,
        "run": run_status(),
        "local": local_status(),
        "hardware": _hardware(),
        "health": [],
    }


def two_gpus_status() -> dict:
    """The daemon training on two GPUs: a worker (and a peer of the swarm) on each."""
    status = training_status()
    first = status["local"]["workers"][0]
    second = {**first, "device": "cuda:1", "peer_id": "12D3KooWSecondGpu", "samples_per_second": 39.2, "loss": 3.15,
              "plan": {**first["plan"], "device": "cuda:1"}}
    status["local"]["workers"] = [first, second]
    status["local"]["samples_per_second"] = first["samples_per_second"] + second["samples_per_second"]
    status["hardware"]["gpus"].append({**status["hardware"]["gpus"][0], "index": 1})
    return status


def paused_status(reason: str = "battery", paused_until: float | None = None) -> dict:
    """The daemon paused for ``reason``; ``paused_until`` makes it a timed pause."""
    status = training_status()
    status.update(state="paused", pause_reason=reason, since=FROZEN_NOW - 12 * 60)
    status["local"]["samples_per_second"] = 0.0
    status["local"]["workers"][0].update(samples_per_second=0.0, state="paused")
    status["run"].update(as_of=FROZEN_NOW - 12 * 60, eta_next_epoch_s=None)
    status["hardware"]["gpus"][0].update(utilization_pct=0, memory_used_mib=410, temperature_c=41, power_w=14.0)
    status["paused_until"] = paused_until
    return status


def joining_status(run_id: str, planned: bool = False) -> dict:
    """Right after a join: the run is known, this peer is not in its swarm yet (``local`` is null, or
    with ``planned`` only the daemon's plan: a new run, whose manifest the daemon plans from at once)."""
    status = training_status()
    status.update(state="joining", since=FROZEN_NOW, local=planned_local_status() if planned else None)
    status["run"] = {**run_status(run_id), "manifest_hash": None, "epoch": 0, "samples_accumulated": 0,
                     "eta_next_epoch_s": None, "num_peers": 0, "last_epoch_at": None}
    return status


def idle_status() -> dict:
    """The daemon in no run: run and local are null, hardware still known."""
    status = training_status()
    status.update(state="idle", pause_reason=None, since=FROZEN_NOW - 300, run=None, local=None)
    status["hardware"]["gpus"][0].update(utilization_pct=0, memory_used_mib=410, temperature_c=38, power_w=12.0)
    return status


def error_status() -> dict:
    """The daemon in the error state, with a fix."""
    status = idle_status()
    status.update(state="error", since=FROZEN_NOW - 60)
    status["health"] = [
        {
            "level": "error",
            "message": "the training worker ran out of GPU memory 3 times",
            "fix": "close other GPU programs, then press j to join again",
        }
    ]
    return status


def sample_peers() -> list[dict]:
    """Three peers: this machine, a relayed laptop, and one with another manifest."""

    def row(peer_id, nickname, device, precision, quantization, micro_batch, speed, epoch, loss, link, seen, **extra):
        return {
            "peer_id": peer_id,
            "nickname": nickname,
            "device": device,
            "precision": precision,
            "quantization": quantization,
            "micro_batch": micro_batch,
            "samples_per_second": speed,
            "loss": loss,
            "epoch": epoch,
            "trained_samples": int(speed * 3600),
            "contributed_samples": int(speed * 3500),
            "manifest_hash": "9f2c1e",
            "compatible": True,
            "reachability": link,
            "version": "0.1.0",
            "last_seen": FROZEN_NOW - seen,
            "is_local": False,
            "banned": False,
            **extra,
        }

    return [
        row(LOCAL_PEER_ID, "amber-fox", "cuda:0", "bf16", "none", 8, 41.7, 42, 2.871, "direct", 0, is_local=True),
        row("12D3KooWLaptop000000000000000000000000000000000QuietOwl", "quiet-owl", "cpu", "fp32", "none", 2, 3.2,
            42, 2.902, "relayed", 4),
        row("12D3KooWOther0000000000000000000000000000000000RedCrane", "red-crane", "cuda:0", "fp16", "nf4", 16,
            88.0, 17, 3.410, "direct", 9, manifest_hash="77aa01", compatible=False),
    ]


def sample_steps(workers: tuple[str, ...] = ("gpu0",)) -> list[dict]:
    """A loss curve falling from 5.5 to about 2.9 over the last five hours, one row a minute per worker
    (a later worker's curve a little higher: another GPU, another sample stream)."""
    rows = []
    for minute in range(300):
        ts = FROZEN_NOW - (300 - minute) * 60
        for index, worker in enumerate(workers):
            loss = 2.85 + 0.3 * index + 2.65 * (0.985**minute) + 0.04 * ((minute * 7) % 5 - 2) / 2
            rows.append({"ts": ts + index, "run_id": RUN_ID, "epoch": minute // 7, "loss": round(loss, 4), "samples": 256,
                         "samples_per_second": 41.0, "worker": worker})
    return rows


def sample_epochs() -> list[dict]:
    """Epochs 30-41 of the run, about seven minutes each."""
    rows = []
    ended = FROZEN_NOW - 5 * 60
    for epoch in range(41, 29, -1):
        duration = 380 + (epoch % 4) * 25
        loss = 2.85 + 2.65 * (0.985 ** (epoch * 7))
        rows.append({"run_id": RUN_ID, "epoch": epoch, "started_at": ended - duration, "ended_at": ended,
                     "duration_s": float(duration), "num_peers": 3, "global_samples": 4096,
                     "loss": round(loss, 4), "val_loss": round(loss + 0.12, 4)})
        ended -= duration
    return rows[::-1]


def sample_events() -> list[dict]:
    """What happened lately, oldest first."""
    events = [
        (-26 * 3600, "started", "daemon started (p2ptrain 0.1.0)"),
        (-26 * 3600 + 5, "joined", f"joined {RUN_ID} as amber-fox with 2 peers"),
        (-3 * 3600, "paused", "paused: running on battery"),
        (-2 * 3600 - 5 * 60, "resumed", "resumed: back on mains power"),
        (-5 * 60, "epoch", "epoch 41 done in 6m 45s with 3 peers, loss 2.874"),
        (-60, "peer", "red-crane has another manifest (77aa01): not averaging with it"),
    ]
    return [{"ts": FROZEN_NOW + offset, "kind": kind, "message": message, "data": {}, "count": 1,
             "last_ts": FROZEN_NOW + offset} for offset, kind, message in events]
