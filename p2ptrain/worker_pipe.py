"""The pipe between the daemon and its training workers: every message, typed.

The daemon starts a worker with a ``WorkerSpec`` and then talks to it over a
``multiprocessing`` pipe: commands down (``Pause``, ``Resume``, ``Finish``,
``Leave``, ``Unban``, ``UsePlan``), reports up (``PlanWanted``, ``Joined``, ``Network``,
``Traffic``, ``Step``, ``Epoch``, ``Swarm``, ``StateChanged``, ``Event``, ``Error``, ``Left``). Both sides import this
module, and nothing else of each other.

Messages cross the pipe as plain dicts of builtins: a report as
``{"type": KIND, field: value, ...}``, a command as ``{"cmd": KIND, field: value, ...}``
(``encode``). ``decode_report`` and ``decode_command`` check every field's
type against the dataclass (``pipe_codec.py``) and raise ``MalformedMessage``
(one line) for anything else, a key the message does not have included, so a broken worker
costs a log line, never the daemon, and the two sides cannot drift apart
silently.

To add a field, add it to its dataclass here (with a default, if older
senders may leave it out); to add a kind, add a ``Report`` subclass with its
``kind=`` and a handler in the daemon's table (``daemon/reports.py``;
``tests/unit/test_worker_pipe.py`` fails while one is missing).

``PeerRow`` (defined with the control protocol's records, ``control_types.py``,
and imported here) is one peer of a swarm as every part sees it: the worker's
swarm view, the daemon's run view, the ``peers`` table of the database and the
``peers`` result of the control protocol.

Stdlib only: the daemon imports it without torch or hivemind.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from p2ptrain.control_types import PeerRow, shown
from p2ptrain.pipe_codec import MalformedMessage, Message

# Exit codes of a worker process the daemon acts on (any other code is a crash).
FAILED_EXIT_CODE = 1  # a fatal error, reported as ``Error(fatal=True)`` before the exit
OUT_OF_MEMORY_EXIT_CODE = 3  # the daemon restarts the worker with half the micro-batch
STOP_DEADLINE_EXIT_CODE = 4  # a stop signal was not honoured in time: ended without a final checkpoint

# After a stop signal the worker finishes its step and checkpoints; a step can
# block in averaging for up to the averaging timeout, so past these deadlines
# it ends its process group without a final checkpoint (the timer's one stays).
STOP_DEADLINE_S = 30.0  # the daemon asked (SIGTERM while it lives)
DAEMON_GONE_DEADLINE_S = 4.0  # the daemon died: leave no orphan for long

WorkerState = Literal["training", "paused", "finished"]


def halved_micro_batch(micro_batch: int, grad_accum: int) -> tuple[int, int] | None:
    """The one out-of-memory back-off: what to try after running out of memory at ``micro_batch``.

    The worker uses it before its first step (its start-up check), the daemon
    when it restarts a worker that ran out of memory while training.

    Args:
        micro_batch: samples per forward/backward that did not fit.
        grad_accum: micro-batches per step at that micro-batch.

    Returns:
        ``(micro_batch, grad_accum)`` with about half the micro-batch (the
        largest divisor of the samples per step at most half of it, so a step
        still has as many samples), or None at micro-batch 1: nothing smaller.
    """
    if micro_batch <= 1:
        return None
    samples_per_step = micro_batch * grad_accum
    smaller = next(size for size in range(micro_batch // 2, 0, -1) if samples_per_step % size == 0)
    return smaller, samples_per_step // smaller


# ----- the spec a worker is started with ---------------------------------------


@dataclasses.dataclass
class WorkerPaths(Message):
    """The worker's files: ``state_dir`` (known peers), ``cache_dir`` (datasets,
    shared by all workers), ``checkpoints_dir`` and ``identity_key`` (its own)."""

    state_dir: str
    cache_dir: str
    checkpoints_dir: str
    identity_key: str


@dataclasses.dataclass
class DhtOptions(Message):
    """How the worker's DHT listens and joins (config ``[dht]``, ports shifted per worker).

    Attributes:
        host_maddrs: addresses to listen on; empty: any free port on all interfaces.
        announce_maddrs: public addresses to tell peers instead of the local ones.
        use_relay, use_auto_relay: libp2p circuit relays, for peers behind NAT.
        client_mode: this peer accepts no connections.
        start_timeout_s: how long the DHT may take to start and reach a bootstrap peer.
        check_identity_free: check that no other peer of the swarm uses this identity before
            starting (hivemind's probe, seconds on a loaded machine); the daemon skips it for a
            worker that returns soon after its own left (``daemon/identity_use.py``).
    """

    host_maddrs: list[str] = dataclasses.field(default_factory=list)
    announce_maddrs: list[str] = dataclasses.field(default_factory=list)
    use_relay: bool = True
    use_auto_relay: bool = False
    client_mode: bool = False
    start_timeout_s: float = 60.0
    check_identity_free: bool = True


@dataclasses.dataclass
class WorkerPlan(Message):
    """What the worker trains with, from the daemon's hardware plan.

    Attributes:
        device: the device as the worker sees it: ``cpu``, or ``cuda:0`` in a
            GPU worker (it sees only its own card).
        precision: ``fp32``, ``bf16`` or ``fp16``.
        quantization: ``none``, ``int8`` or ``nf4``.
        micro_batch: samples per forward/backward; None: the manifest's
            ``micro_batch_hint``. The worker confirms it with real steps
            before its first one, halving it on out-of-memory and growing it
            while larger ones fit ``memory_cap_bytes`` and train faster, up to
            ``max_micro_batch``.
        grad_accum: micro-batches accumulated into one step.
        gradient_checkpointing: recompute activations in the backward pass
            (less memory, about a third more compute).
        memory_cap_bytes: the most memory training may take: a GPU worker's
            allocator is held to it (``torch.cuda.set_per_process_memory_fraction``),
            so going past it is an out-of-memory error like any other; a CPU
            worker grows its micro-batch only while its peak resident set stays
            under it. None: no cap (the device's memory).
        cpu_threads: threads torch may use; None: torch's default.
        compute_share: the most of the wall time the training loop computes
            (``duty_cycle``); it rests the remainder after each step. 1: never rests.
        device_name: the device's model (``NVIDIA RTX 4090``, the CPU's name),
            which keys the measured speed in the plan cache.
        compression: the compression rung it sends pseudo-gradients with
            (``compression_ladder``); None: a plan made without the run's
            manifest, so the worker picks it from ``WorkerSpec.uplink_mbit_s``.
        max_micro_batch: the largest micro-batch calibration may grow to: half
            of one that ran out of memory while training (a calibration pass
            can fit where a training step does not). None: no bound.
    """

    device: str = "cpu"
    precision: str = "fp32"
    quantization: str = "none"
    micro_batch: int | None = None
    grad_accum: int = 1
    cpu_threads: int | None = None
    compute_share: float = 1.0
    device_name: str = ""
    compression: str | None = None
    gradient_checkpointing: bool = False
    memory_cap_bytes: int | None = None
    max_micro_batch: int | None = None


@dataclasses.dataclass
class AveragingTimings(Message):
    """Seconds peers spend forming an averaging group, and before a stuck round is abandoned."""

    matchmaking_time: float
    averaging_timeout: float


@dataclasses.dataclass
class WorkerSpec(Message):
    """Everything one worker process is started with (the argument of ``peers.worker.training_worker.main``).

    Attributes:
        run_id: the run to join.
        paths: the worker's files.
        manifest: the run manifest as JSON (``Manifest.model_dump``); None or
            empty when joining an existing run (the worker reads it from the DHT).
        new_run: create the run from ``manifest`` instead of fetching it.
        initial_peers: bootstrap multiaddrs; empty: the peers the worker remembers.
        dht: how its DHT listens.
        nickname: shown to other peers.
        plan: what it trains with; None when the daemon could not plan without
            the run's manifest (a peer joining a run): the worker reads the
            manifest from the swarm, reports ``PlanWanted`` and waits for ``UsePlan``.
        uplink_mbit_s: the machine's upload bandwidth (config
            ``training.uplink_mbit_s``), which picks the compression rung when
            the plan has none; None: unknown (the run's top rung).
        start_paused: wait for ``Resume`` once joined, before the first step
            (a benchmark starting several workers, so none trains alone; the
            daemon starts no worker while it is paused).
        checkpoint_interval_s: seconds between timer checkpoints while training.
        log_level: the worker log's level name.
        environment: variables set before torch is imported
            (``CUDA_VISIBLE_DEVICES`` of a GPU worker).
        device_label: the device in the host's numbering (``cuda:1``), what
            other peers are shown; None: the plan's device.
        averaging: averaging timings; None: chosen from the listen addresses.
        manifest_timeout_s: how long to look for the manifest of an existing run.
        temp_dir: the worker's ``TMPDIR`` (``daemon/temp_files.py``: removed
            once its process group has ended); None: the inherited one.
        banned_peers: peer ids this machine banned in the run (the daemon's
            ``bans`` table): left out of the worker's rounds and state downloads.
    """

    run_id: str
    paths: WorkerPaths
    manifest: dict | None = None
    new_run: bool = False
    initial_peers: list[str] = dataclasses.field(default_factory=list)
    dht: DhtOptions = dataclasses.field(default_factory=DhtOptions)
    nickname: str = ""
    plan: WorkerPlan | None = None
    uplink_mbit_s: float | None = None
    start_paused: bool = False
    checkpoint_interval_s: float = 600.0
    log_level: str = "INFO"
    environment: dict[str, str] = dataclasses.field(default_factory=dict)
    device_label: str | None = None
    averaging: AveragingTimings | None = None
    manifest_timeout_s: float = 60.0
    temp_dir: str | None = None
    banned_peers: list[str] = dataclasses.field(default_factory=list)


# ----- what became of a peer's samples ----------------------------------------------


@dataclasses.dataclass
class UnusedSamples(Message):
    """Samples a peer trained that will never enter an average or optimizer step, by reason
    (``peers/training/sample_account.py``).

    Attributes:
        late: its local progress was more rounds behind the swarm than may be kept.
        failed_round: the round they were in cannot be finished (the worker restarted during it).
        rejected: non-finite (a loss, gradients, a pseudo-gradient or the average of its round).
    """

    late: int = 0
    failed_round: int = 0
    rejected: int = 0


@dataclasses.dataclass(kw_only=True)
class SampleTotals(Message):
    """A worker's sample totals for the run, which ``Joined``, ``Step`` and ``Epoch`` carry
    (``peers/training/sample_account.py``; keyword-only, so they follow each report's own fields).

    Attributes:
        trained_samples: every sample it trained (its checkpoint's, plus since).
        contributed_samples: those that entered an adopted average or optimizer step.
        unused_samples: those that never will, by reason.
    """

    trained_samples: int = 0
    contributed_samples: int = 0
    unused_samples: UnusedSamples = dataclasses.field(default_factory=UnusedSamples)


@dataclasses.dataclass
class PortMove(Message):
    """A fixed listening port that was taken when the worker's DHT started, and the port used
    instead (``peers/net/ports.py``): ``port`` 0 is a random one; ``holder`` says who held it, in
    words; ``message`` and ``fix`` are the warning ``status.health`` shows."""

    protocol: str
    configured: int
    port: int
    holder: str
    message: str
    fix: str


# ----- commands: daemon -> worker --------------------------------------------------


class _OfAKind(Message):
    """A message with a name on the pipe: ``class Step(Report, kind="step")`` registers ``Step`` as ``step``."""

    KIND: ClassVar[str]
    KINDS: ClassVar[dict[str, type]]

    def __init_subclass__(cls, kind: str = "", **options):
        super().__init_subclass__(**options)
        if kind:
            cls.KIND = kind
            cls.KINDS[kind] = cls


COMMANDS: dict[str, type[Command]] = {}


class Command(_OfAKind):
    """A command to the worker; ``KIND`` names it on the pipe (``{"cmd": KIND, field: value, ...}``);
    the worker's handler gets the fields as keyword arguments."""

    KINDS = COMMANDS


@dataclasses.dataclass(frozen=True)
class Pause(Command, kind="pause"):
    """Stop after the current step, checkpoint, leave the swarm, report ``StateChanged("paused")``
    and exit 0: the process ends, so all its memory (model, optimizer, CUDA cache) goes back.
    ``resume`` is a new worker that loads that checkpoint."""


@dataclasses.dataclass(frozen=True)
class Resume(Command, kind="resume"):
    """Cancel a ``Finish``; a worker started paused (``WorkerSpec.start_paused``) starts training."""


@dataclasses.dataclass(frozen=True)
class Finish(Command, kind="finish"):
    """Complete the current epoch, then do what ``Pause`` does, reporting ``StateChanged("finished")``."""


@dataclasses.dataclass(frozen=True)
class Leave(Command, kind="leave"):
    """Checkpoint, say goodbye to the swarm, report ``Left`` and exit 0."""


@dataclasses.dataclass(frozen=True)
class Unban(Command, kind="unban"):
    """Lift the bans of ``peers`` (every ban when None): they may average with this worker again."""

    peers: list[str] | None = None


@dataclasses.dataclass(frozen=True)
class UsePlan(Command, kind="use-plan"):
    """The answer to ``PlanWanted``: the ``plan`` to train with, or None with why there is none
    (``failure``, ``fix``: the worker then fails, as for any fatal error)."""

    plan: WorkerPlan | None = None
    failure: str = ""
    fix: str = ""


# ----- reports: worker -> daemon ----------------------------------------------------

REPORTS: dict[str, type[Report]] = {}


class Report(_OfAKind):
    """A report from the worker; ``KIND`` names it on the pipe (``{"type": KIND, ...}``)."""

    KINDS = REPORTS


@dataclasses.dataclass
class PlanWanted(Report, kind="plan-wanted"):
    """A worker started without a plan has read the run's ``manifest`` (JSON) from the swarm: the
    daemon plans its device for it and answers ``UsePlan``."""

    manifest: dict


@dataclasses.dataclass
class Joined(Report, SampleTotals, kind="joined"):
    """The worker is in the swarm: who it is and what it trains with.

    All fields but the manifest are ``status.local`` (``daemon/run_view.py``).

    Attributes:
        addresses: multiaddrs others can dial it at, best first (the one peers reached first).
        reachability: ``direct``, ``relayed``, ``unreachable`` or ``unknown``, as peers
            measured it by dialing back (``peers/net/dial_back.py``) when it joined.
        reachability_checked_at: when that check ended; None when nobody could be asked.
        averaging_client: it averages as a client (sends its share, never reduces):
            peers could not dial it directly.
        micro_batch, grad_accum: what it trains with, confirmed by real steps
            (halved from the plan's if that ran out of memory, grown if larger ones were faster).
        gradient_checkpointing: it recomputes activations in the backward pass (the plan's choice).
        parameters, trainable_parameters: the model's sizes.
        manifest: the run manifest it trains with (JSON), and its hash.
        port_moves: the configured listening ports that were taken, and where it listens instead.
        trained_samples, contributed_samples, unused_samples: its totals in the
            run so far, from its checkpoint (``Step`` carries them on).
        calibrated_samples_per_second: forward/backward speed measured at
            ``micro_batch`` before the first step (None if not measured).
    """

    peer_id: str
    nickname: str
    addresses: list[str]
    reachability: str
    device: str
    precision: str
    quantization: str
    micro_batch: int
    grad_accum: int
    parameters: int
    trainable_parameters: int
    manifest: dict
    manifest_hash: str
    port_moves: list[PortMove] = dataclasses.field(default_factory=list)
    calibrated_samples_per_second: float | None = None
    reachability_checked_at: float | None = None
    averaging_client: bool = False
    gradient_checkpointing: bool = False


@dataclasses.dataclass
class Network(Report, kind="network"):
    """A reachability check ended (after ``Joined``, then every few minutes; ``peers/net/network.py``).

    Attributes:
        reachability: ``direct``, ``relayed``, ``unreachable`` or ``unknown`` (nobody answered).
        addresses: this peer's addresses, those peers reached first.
        checked_at: Unix time the check ended; ``asked`` and ``answered``: how many peers.
        reached: the addresses the answering peers reached.
        averaging_client: it averages as a client (fixed when it joined).
    """

    reachability: str
    addresses: list[str]
    checked_at: float | None = None
    asked: int = 0
    answered: int = 0
    reached: list[str] = dataclasses.field(default_factory=list)
    averaging_client: bool = False


@dataclasses.dataclass
class Traffic(Report, kind="traffic"):
    """What this peer sent and received (every 15 s; ``peers/net/traffic.py``).

    Attributes:
        bytes_per_s: by kind (``averaging``, ``matchmaking``, ``progress``, ``metrics``,
            ``dht``, ``other``), sent + received, over the last minute (never below zero).
        totals: bytes by kind, sent + received, since ``since``; ``other`` is the kernel's total less
            the kinds, as measured (for a moment below zero while a round's bytes are counted by
            hivemind and not yet by the kernel: ``peers/net/traffic.py``), as of ``totals_at`` (Unix time).
        sent_bytes_per_s, received_bytes_per_s: the totals over the same minute.
        sent_bytes, received_bytes: since ``since`` (Unix time this worker began counting).
        measured_at: ``kernel`` (totals from p2pd's TCP sockets) or ``messages`` (hivemind's messages only).
    """

    bytes_per_s: dict[str, float]
    totals: dict[str, float]
    totals_at: float
    sent_bytes_per_s: float
    received_bytes_per_s: float
    sent_bytes: float
    received_bytes: float
    since: float
    measured_at: str


@dataclasses.dataclass
class Step(Report, SampleTotals, kind="step"):
    """Local training since the previous ``Step`` (at most about one a second).

    Attributes:
        ts: Unix time of the report.
        epoch: the worker's local epoch.
        loss: mean training loss over the report's steps.
        samples: samples trained since the previous report.
        samples_per_second: over the same window.
        idle_s, longest_idle_s: seconds between training two batches while
            training (averaging, downloads, waiting for the swarm), summed and
            the longest, over the same window.
        trained_samples, contributed_samples, unused_samples: the worker's totals (``SampleTotals``).
        waiting: why the samples not yet used wait, when it is not simply the
            current round (``Trainer.waiting``): e.g. no peer came to the last
            rounds; None otherwise.
    """

    ts: float
    epoch: int
    loss: float | None
    samples: int
    samples_per_second: float
    idle_s: float = 0.0
    longest_idle_s: float = 0.0
    waiting: str | None = None


@dataclasses.dataclass
class Epoch(Report, SampleTotals, kind="epoch"):
    """An epoch ended (a global step in sync mode, an outer step in DiLoCo).

    Attributes:
        num_peers: peers in the swarm at its end.
        global_samples: samples the swarm gathered for it.
        loss: mean local training loss of the epoch; ``val_loss`` on held-out data after it.
        averaged_with: peers in its last averaging round, this one included.
        trained_samples, contributed_samples, unused_samples: the sample totals as in
            ``Step``, right after the round (pending then: what the peer trained
            while the round was averaged).
    """

    epoch: int
    started_at: float
    ended_at: float
    duration_s: float
    num_peers: int
    global_samples: int
    loss: float | None
    val_loss: float | None = None
    averaged_with: int = 1


@dataclasses.dataclass
class Swarm(Report, kind="swarm"):
    """The run as the worker reads it from the DHT (every few seconds).

    Attributes:
        epoch: the swarm's epoch; ``samples_accumulated`` towards the next.
        eta_next_epoch_s: None while nobody reports a speed.
        num_peers: compatible peers seen.
        peers: every peer seen (``is_local`` is the daemon's to set).
    """

    epoch: int
    samples_accumulated: int
    target_batch_size: int
    eta_next_epoch_s: float | None
    num_peers: int
    peers: list[PeerRow] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class StateChanged(Report, kind="state"):
    """The worker's own state: ``training``; ``paused`` or ``finished`` (a ``Finish`` completed its
    epoch) once it has checkpointed and left the swarm, right before it exits 0 (a worker
    started paused reports ``paused`` and waits for ``Resume``).

    ``reason``: why a worker paused on its own, not told to: ``diverged`` (its divergence guard
    rolled it back too often, ``peers/training/divergence.py``); None when the daemon asked for it."""

    state: WorkerState
    reason: str | None = None


@dataclasses.dataclass
class Event(Report, kind="event"):
    """Something worth a line in the ``events`` table (DEVELOPERS.md lists the kinds)."""

    kind: str
    message: str
    data: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Error(Report, kind="error"):
    """A failure: ``fatal`` ones end the run's workers (the user must act), others are shown as warnings.

    Attributes:
        out_of_memory: the worker ran out of memory while training and exits
            with ``OUT_OF_MEMORY_EXIT_CODE``; the daemon restarts it with
            ``halved_micro_batch(micro_batch, grad_accum)``. At micro-batch 1
            the error is fatal instead.
        micro_batch, grad_accum: what it trained with when it ran out of memory.
    """

    message: str
    fix: str = ""
    fatal: bool = False
    out_of_memory: bool = False
    micro_batch: int | None = None
    grad_accum: int | None = None


@dataclasses.dataclass
class Left(Report, kind="left"):
    """The worker checkpointed, said goodbye and is about to exit 0 (after ``Leave``)."""


def encode(message: Command | Report) -> dict[str, Any]:
    """The dict that crosses the pipe for ``message``."""
    if isinstance(message, Command):
        return {"cmd": message.KIND, **message.to_dict()}
    return {"type": message.KIND, **message.to_dict()}


def decode_report(data: Any) -> Report:
    """The report a received dict stands for.

    Raises:
        MalformedMessage: not a dict, an unknown ``type``, or a field of the wrong type.
    """
    return _decode(data, "type", REPORTS, "report")


def decode_command(data: Any) -> Command:
    """The command a received dict stands for.

    Raises:
        MalformedMessage: not a dict, an unknown ``cmd``, or a field of the wrong type.
    """
    return _decode(data, "cmd", COMMANDS, "command")


def _decode(data: Any, key: str, kinds: dict[str, type], what: str):
    if not isinstance(data, dict):
        raise MalformedMessage(f"a worker {what} must be a dict, not {shown(data)}")
    kind = data.get(key)
    if kind not in kinds:
        raise MalformedMessage(f"unknown worker {what} {key}={shown(kind)}; known: {', '.join(kinds)}")
    fields = {name: value for name, value in data.items() if name != key}
    return kinds[kind].from_dict(fields, where=f"{kind} {what}")
