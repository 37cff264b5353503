"""The control protocol's replies and pushes, typed: the schema of ``status``, ``peers``, ``events`` and the plan.

The daemon builds these records and sends ``to_dict()``; the CLI, the TUI and
the tests' fake daemon read a reply with ``from_dict``, which checks every
field's type and raises ``MalformedReply`` naming the field, in one line (as
``pipe_codec.MalformedMessage`` does for the worker pipe), so a client never
trips over a missing key deep in its output code. On the wire a record is a
JSON object with every field present (``null`` when unknown).

Each record class lists its fields and their kinds in ``SCHEMA`` (a dict, in
wire order); ``__slots__`` repeats the names, so a typo in an attribute
assignment fails. A field whose kind is ``optional(...)`` may be absent from
a reply (None); a ``list_of`` field may be absent (empty). A key the record
does not know (a newer daemon's field) is ignored: adding a field is no
protocol change, removing or retyping one is (``protocol.PROTOCOL_VERSION``).

What ``subscribe`` pushes is named in ``Push``; ``decode_push`` gives a push's
data as its record (``step`` and ``epoch`` pushes stay dicts: rows of the
database's ``steps`` and ``epochs`` tables, docs/design.md).

Standard library only, and light: the CLI imports this module on every call,
so no ``dataclasses`` or ``typing`` (``inspect`` alone costs ``p2ptrain status``
about 12 ms).
"""

from __future__ import annotations


class MalformedReply(ValueError):
    """A reply or push that is not what the protocol says; ``str()`` names the field, in one line."""


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ----- kinds of fields ----------------------------------------------------------------

REQUIRED = object()  # the default of a field a reply must carry


class Kind:
    """What one field holds: ``decode`` checks a wire value (building nested records), ``default`` fills an absent one."""

    name = "?"
    default: object = REQUIRED

    def decode(self, value: object, where: str) -> object:
        raise NotImplementedError

    def fresh_default(self) -> object:
        return self.default

    def wrong(self, value: object, where: str) -> MalformedReply:
        return MalformedReply(f"{where} must be {self.name}, not {shown(value)}")


class _Scalar(Kind):
    def __init__(self, name: str, types: tuple, default: object = REQUIRED):
        self.name, self.types, self.default = name, types, default

    def holds(self, value: object) -> bool:
        return isinstance(value, self.types) and (bool in self.types or not isinstance(value, bool))

    def decode(self, value, where):
        if self.holds(value):
            return value
        raise self.wrong(value, where)


class _Anything(Kind):
    name = "anything"

    def decode(self, value, where):
        return value


STR = _Scalar("a string", (str,))
INT = _Scalar("an integer", (int,))
FLOAT = _Scalar("a number", (int, float))
BOOL = _Scalar("true or false", (bool,))
ANY = _Anything()


class optional(Kind):
    """``kind`` or None; None when absent."""

    default = None

    def __init__(self, kind: Kind | type):
        self.kind = kind_of(kind)
        self.name = f"{self.kind.name} or null"

    def decode(self, value, where):
        if value is None:
            return None
        if isinstance(self.kind, _Scalar) and not self.kind.holds(value):
            raise self.wrong(value, where)
        return self.kind.decode(value, where)


class list_of(Kind):
    """A list of ``kind``; empty when absent."""

    default = ()

    def __init__(self, kind: Kind | type):
        self.kind = kind_of(kind)
        self.name = f"a list of {self.kind.name}"

    def fresh_default(self):
        return []

    def decode(self, value, where):
        if not isinstance(value, list):
            raise self.wrong(value, where)
        return [self.kind.decode(item, f"{where}[{index}]") for index, item in enumerate(value)]


class dict_of(Kind):
    """An object of ``kind`` values by string keys (counts by reason, rates by kind)."""

    def __init__(self, kind: Kind | type):
        self.kind = kind_of(kind)
        self.name = f"an object of {self.kind.name}"

    def decode(self, value, where):
        if not isinstance(value, dict):
            raise self.wrong(value, where)
        return {key: self.kind.decode(item, f"{where}.{key}") for key, item in value.items()}


class _Nested(Kind):
    def __init__(self, record: type[Record]):
        self.record = record
        self.name = f"a {record.__name__} object"

    def decode(self, value, where):
        return self.record.from_dict(value, where)


def kind_of(kind: Kind | type) -> Kind:
    """``kind`` itself, or a record class as the kind of a nested record."""
    return kind if isinstance(kind, Kind) else _Nested(kind)


def with_default(kind: Kind, default: object) -> Kind:
    """``kind``, filled with ``default`` (a scalar) when a reply leaves the field out."""
    return _Scalar(kind.name, kind.types, default)


def plain(value: object) -> object:
    """``value`` as JSON's builtins: records as dicts, recursively."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


class Record:
    """Base of the protocol's records: keyword construction, ``to_dict``, a checked ``from_dict``, equality.

    A subclass sets ``SCHEMA`` (field name -> kind, in wire order) and
    ``__slots__`` (its own new names).
    """

    __slots__ = ()
    SCHEMA: dict[str, Kind] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.SCHEMA = {name: kind_of(kind) for name, kind in cls.SCHEMA.items()}

    def __init__(self, **values):
        for name, kind in self.SCHEMA.items():
            if name in values:
                setattr(self, name, values.pop(name))
            elif kind.default is REQUIRED:
                raise TypeError(f"{type(self).__name__} needs {name}")
            else:
                setattr(self, name, kind.fresh_default())
        if values:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(values))}")

    def to_dict(self) -> dict:
        """The record as plain JSON builtins, every field present."""
        return {name: plain(getattr(self, name)) for name in self.SCHEMA}

    @classmethod
    def from_dict(cls, data: object, where: str = ""):
        """The record from a reply's dict, each field checked.

        Args:
            data: the decoded JSON.
            where: what it is, for the error (default: the class name).

        Raises:
            MalformedReply: ``data`` is not a dict, lacks a required field, or a field has the wrong type.
        """
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise MalformedReply(f"{where} must be an object, not {shown(data)}")
        record = cls.__new__(cls)
        for name, kind in cls.SCHEMA.items():
            if name in data:
                value = kind.decode(data[name], f"{where}: {name}")
            elif kind.default is REQUIRED:
                raise MalformedReply(f"{where} has no {name}")
            else:
                value = kind.fresh_default()
            setattr(record, name, value)
        return record

    def replace(self, **changes) -> Record:
        """A copy with ``changes``."""
        return type(self)(**{**{name: getattr(self, name) for name in self.SCHEMA}, **changes})

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.SCHEMA)

    __hash__ = None

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.SCHEMA)
        return f"{type(self).__name__}({fields})"


OPTIONAL_STR, OPTIONAL_INT, OPTIONAL_FLOAT, OPTIONAL_BOOL = optional(STR), optional(INT), optional(FLOAT), optional(BOOL)


# ----- the status object (docs/design.md, "Control protocol") ---------------------------------


class Health(Record):
    """One line of ``status.health``: ``level`` (``error`` or ``warning``), what is wrong, and how to fix it."""

    SCHEMA = {"level": STR, "message": STR, "fix": with_default(STR, "")}
    __slots__ = tuple(SCHEMA)


class RunStatus(Record):
    """``status.run``: the run this daemon is in, as its workers last reported it.

    ``as_of`` is when the numbers were reported while no worker runs (paused), else None;
    ``eta_next_epoch_s`` is None then.
    """

    SCHEMA = {
        "id": STR,
        "mode": OPTIONAL_STR,
        "model": OPTIONAL_STR,
        "manifest_hash": OPTIONAL_STR,
        "epoch": INT,
        "samples_accumulated": INT,
        "target_batch_size": OPTIONAL_INT,
        "eta_next_epoch_s": OPTIONAL_FLOAT,
        "num_peers": INT,
        "last_epoch_at": OPTIONAL_FLOAT,
        "as_of": OPTIONAL_FLOAT,
    }
    __slots__ = tuple(SCHEMA)


class Plan(Record):
    """The daemon's hardware plan for one worker (``local.plan``, ``workers[].plan``; made by
    ``daemon/plan.py: make_plan``), with ``rationale``: one line per choice."""

    SCHEMA = {
        "model": STR,
        "device": STR,
        "device_name": STR,
        "precision": STR,
        "quantization": STR,
        "micro_batch": INT,
        "grad_accum": INT,
        "cpu_threads": INT,
        "compute_share": with_default(FLOAT, 1.0),  # absent from the plans of daemons before it
        "seq_len": INT,
        "memory_estimate_gib": FLOAT,
        "memory_allowed_gib": FLOAT,
        "gradient_checkpointing": BOOL,
        "memory_cap_gib": OPTIONAL_FLOAT,
        "rationale": list_of(STR),
        "compression": OPTIONAL_STR,
        "samples_per_second": OPTIONAL_FLOAT,
        "calibrated": BOOL,
        "samples_per_step": INT,
    }
    __slots__ = tuple(SCHEMA)


UNUSED_SAMPLES = dict_of(INT)  # {late, failed_round, rejected}: samples the run will never use, by reason


class WorkerStatus(Record):
    """One training worker (one peer of the swarm, one per GPU) in ``local.workers``.

    ``state``: ``joining``, ``training``, ``pausing``, ``paused``, ``finished``,
    ``restarting`` or ``oom-backoff`` (``daemon/worker_state.py``). Until the worker
    joined, its precision ... grad_accum are its plan's, and ``peer_id`` is None.
    """

    SCHEMA = {
        "device": STR,
        "peer_id": OPTIONAL_STR,
        "precision": OPTIONAL_STR,
        "quantization": OPTIONAL_STR,
        "gradient_checkpointing": OPTIONAL_BOOL,
        "micro_batch": OPTIONAL_INT,
        "grad_accum": OPTIONAL_INT,
        "samples_per_second": OPTIONAL_FLOAT,
        "loss": OPTIONAL_FLOAT,
        "trained_samples": INT,
        "contributed_samples": INT,
        "unused_samples": UNUSED_SAMPLES,
        "state": STR,
        "plan": optional(Plan),
    }
    __slots__ = tuple(SCHEMA)


class TrafficStatus(Record):
    """``local.traffic``: bytes per second by kind (sent + received, summed over the workers), and
    ``month_gb`` (that rate over this whole month) and ``month_used_gb`` (counted so far); ``totals``:
    bytes by kind since the workers began counting (the latest began at ``since``; a later ``since``
    means a worker started again and its totals from zero), as of ``totals_at``."""

    SCHEMA = {
        "bytes_per_s": dict_of(FLOAT),
        "totals": optional(dict_of(FLOAT)),
        "totals_at": OPTIONAL_FLOAT,
        "since": OPTIONAL_FLOAT,
        "sent_bytes_per_s": FLOAT,
        "received_bytes_per_s": FLOAT,
        "month_gb": FLOAT,
        "month_used_gb": FLOAT,
        "measured_at": OPTIONAL_STR,
    }
    __slots__ = tuple(SCHEMA)


class LocalStatus(Record):
    """``status.local``: this machine's peer, the first joined worker's view (before any joined,
    the first planned one's: its plan's precision ... grad_accum, no ``peer_id``). With several
    workers ``samples_per_second`` and the sample totals are sums over ``workers``.

    ``reachability``: ``direct``, ``relayed``, ``unreachable`` or ``unknown`` (peers dial this one back);
    ``contributed_samples`` entered an adopted average or step, ``unused_samples`` never will,
    the rest are pending (``waiting`` says why, when it is more than the current round).
    """

    SCHEMA = {
        "peer_id": OPTIONAL_STR,
        "nickname": OPTIONAL_STR,
        "addresses": list_of(STR),
        "reachability": OPTIONAL_STR,
        "reachability_checked_at": OPTIONAL_FLOAT,
        "averaging_client": OPTIONAL_BOOL,
        "device": STR,
        "precision": OPTIONAL_STR,
        "quantization": OPTIONAL_STR,
        "gradient_checkpointing": OPTIONAL_BOOL,
        "micro_batch": OPTIONAL_INT,
        "grad_accum": OPTIONAL_INT,
        "parameters": OPTIONAL_INT,
        "trainable_parameters": OPTIONAL_INT,
        "calibrated_samples_per_second": OPTIONAL_FLOAT,
        "samples_per_second": OPTIONAL_FLOAT,
        "loss": OPTIONAL_FLOAT,
        "trained_samples": INT,
        "contributed_samples": INT,
        "unused_samples": UNUSED_SAMPLES,
        "waiting": OPTIONAL_STR,
        "plan": optional(Plan),
        "workers": list_of(WorkerStatus),
        "traffic": optional(TrafficStatus),
    }
    __slots__ = tuple(SCHEMA)


class GpuProcess(Record):
    """A process using a GPU, as NVML lists it (``kinds``: ``graphics``, ``compute``)."""

    SCHEMA = {"pid": INT, "name": STR, "kinds": list_of(STR), "used_memory_mib": OPTIONAL_INT}
    __slots__ = tuple(SCHEMA)


class Gpu(Record):
    """One NVIDIA GPU now (``hardware.gpus``); what NVML does not support on a card is None."""

    SCHEMA = {
        "index": INT,
        "name": STR,
        "uuid": STR,
        "memory_total_mib": INT,
        "memory_used_mib": INT,
        "memory_free_mib": INT,
        "compute_capability": STR,
        "utilization_pct": OPTIONAL_INT,
        "temperature_c": OPTIONAL_INT,
        "power_w": OPTIONAL_FLOAT,
        "power_limit_w": OPTIONAL_FLOAT,
        "fan_pct": OPTIONAL_INT,
        "processes": list_of(GpuProcess),
    }
    __slots__ = tuple(SCHEMA)


class Cpu(Record):
    SCHEMA = {"model": STR, "cores_physical": INT, "cores_logical": INT}
    __slots__ = tuple(SCHEMA)


class Ram(Record):
    SCHEMA = {"total_mib": INT, "available_mib": INT}
    __slots__ = tuple(SCHEMA)


class Hardware(Record):
    """``status.hardware``: the GPUs (none without NVIDIA), CPU and RAM, as last probed."""

    SCHEMA = {"gpus": list_of(Gpu), "cpu": Cpu, "ram": Ram, "driver_version": OPTIONAL_STR}
    __slots__ = tuple(SCHEMA)


class Status(Record):
    """The ``status`` result (``p2ptrain status --json``), and what ``snapshot`` and ``status`` pushes carry.

    ``state``: ``idle``, ``joining``, ``training``, ``paused``, ``finishing``, ``leaving``
    or ``error``; ``pause_reason`` while paused; ``run`` None outside a run, ``local``
    before a worker was planned, ``hardware`` before the first probe.
    """

    SCHEMA = {
        "protocol": INT,
        "version": STR,
        "state": STR,
        "pause_reason": OPTIONAL_STR,
        "since": OPTIONAL_FLOAT,
        "paused_until": OPTIONAL_FLOAT,
        "started_at": FLOAT,
        "run": optional(RunStatus),
        "local": optional(LocalStatus),
        "hardware": optional(Hardware),
        "health": list_of(Health),
    }
    __slots__ = tuple(SCHEMA)

    @property
    def run_id(self) -> str | None:
        """The id of the run the daemon is in, or None."""
        return self.run.id if self.run else None


class JoinResult(Status):
    """The ``join`` result: the status, plus ``warnings`` (a new run's settings the DiLoCo study found unstable)."""

    SCHEMA = {**Status.SCHEMA, "warnings": list_of(STR)}
    __slots__ = ("warnings",)


# ----- peers, bans and events ----------------------------------------------------------------


class PeerRow(Record):
    """One peer of a run, as this machine sees it: the ``peers`` result and push, the worker's swarm
    view (``worker_pipe.Swarm``), the daemon's run view and the database's ``peers`` table.

    All but the last four come from the peer's signed metrics record
    (``peers/swarm/records.py``: ``LocalMetrics``); a peer seen only in hivemind's
    progress records has None where it says nothing.

    Attributes:
        last_group: peers in its last averaging round, itself included (0 before its first, or in a
            run of manifest format 4 or older, whose records do not say).
        bans: the peer ids it refuses to average with.
        compatible: it trains with our manifest (its ``manifest_hash``), so we average with it.
        last_seen: Unix (DHT) time of its latest record.
        is_local: one of this machine's own workers (the daemon sets it).
        banned: this machine banned it from its rounds (the daemon sets it; ``peers/robust/trust.py``).
    """

    SCHEMA = {
        "peer_id": STR,
        "nickname": OPTIONAL_STR,
        "device": OPTIONAL_STR,
        "precision": OPTIONAL_STR,
        "quantization": OPTIONAL_STR,
        "micro_batch": OPTIONAL_INT,
        "samples_per_second": OPTIONAL_FLOAT,
        "loss": OPTIONAL_FLOAT,
        "epoch": OPTIONAL_INT,
        "trained_samples": OPTIONAL_INT,
        "contributed_samples": OPTIONAL_INT,
        "manifest_hash": OPTIONAL_STR,
        "compatible": OPTIONAL_BOOL,
        "reachability": OPTIONAL_STR,
        "version": OPTIONAL_STR,
        "last_group": OPTIONAL_INT,
        "bans": list_of(STR),
        "last_seen": OPTIONAL_FLOAT,
        "is_local": with_default(BOOL, False),
        "banned": with_default(BOOL, False),
    }
    __slots__ = tuple(SCHEMA)


class Ban(Record):
    """A peer this machine banned in the run (``storage/bans.py``) and why."""

    SCHEMA = {"peer_id": STR, "banned_at": FLOAT, "reason": OPTIONAL_STR, "rounds_named": OPTIONAL_INT}
    __slots__ = tuple(SCHEMA)


class PeersUpdate(Record):
    """The ``peers`` push: the run's peers as the latest swarm snapshot shows them."""

    SCHEMA = {"run_id": OPTIONAL_STR, "peers": list_of(PeerRow)}
    __slots__ = tuple(SCHEMA)


class PeersResult(PeersUpdate):
    """The ``peers`` result: the run's peers and this machine's bans in it."""

    SCHEMA = {**PeersUpdate.SCHEMA, "bans": list_of(Ban)}
    __slots__ = ("bans",)


class UnbanResult(Record):
    """The ``unban`` result: whose bans were lifted, and the bans left."""

    SCHEMA = {"run_id": OPTIONAL_STR, "unbanned": list_of(STR), "bans": list_of(Ban)}
    __slots__ = tuple(SCHEMA)


class EventRow(Record):
    """One row of the ``events`` result (and an ``event`` push): ``kind`` a short word, ``message`` one
    line for people. A row may stand for ``count`` repeats from ``ts`` to ``last_ts``
    (``daemon/event_bursts.py``); it is pushed again, same ``ts`` and ``kind``, as it grows."""

    SCHEMA = {
        "ts": FLOAT,
        "kind": STR,
        "message": STR,
        "data": optional(dict_of(ANY)),
        "count": optional(INT),
        "last_ts": OPTIONAL_FLOAT,
    }
    __slots__ = tuple(SCHEMA)

    def repeated_words(self) -> str:
        """`` (x700 in 84 s)`` for a row that stands for repeats; empty for a single event."""
        count = self.count or 1
        if count <= 1:
            return ""
        span = max(0.0, (self.last_ts or self.ts) - self.ts)
        return f" (x{count} in {span:.0f} s)"


class EventsResult(Record):
    """The ``events`` result, newest last."""

    SCHEMA = {"events": list_of(EventRow)}
    __slots__ = tuple(SCHEMA)


# ----- what subscribe pushes -----------------------------------------------------------------


class Push:
    """The names of what ``subscribe`` pushes, ``{"event": NAME, "data": ...}``: ``SNAPSHOT`` (the
    status, first), then ``STATUS`` when it changed, ``STEP`` and ``EPOCH`` (rows as the ``metrics``
    and ``epochs`` results carry them, with ``worker``), ``EVENT`` (an ``EventRow``) and ``PEERS``."""

    SNAPSHOT = "snapshot"
    STATUS = "status"
    STEP = "step"
    EPOCH = "epoch"
    EVENT = "event"
    PEERS = "peers"


# each push's record; the others' data is a plain dict
PUSHED_RECORDS: dict[str, type[Record]] = {
    Push.SNAPSHOT: Status,
    Push.STATUS: Status,
    Push.EVENT: EventRow,
    Push.PEERS: PeersUpdate,
}


def decode_push(event: str, data: object) -> object:
    """A push's data as its record (a ``step`` or ``epoch`` row as a dict); MalformedReply if it is not one.

    An event name this client does not know (a newer daemon's) gives its data unchanged.
    """
    record = PUSHED_RECORDS.get(event)
    if record is not None:
        return record.from_dict(data, f"the {event} push")
    if event in (Push.STEP, Push.EPOCH) and not isinstance(data, dict):
        raise MalformedReply(f"the {event} push must be an object, not {shown(data)}")
    return data
