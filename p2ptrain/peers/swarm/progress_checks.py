"""What a reader believes of the other peers' progress records.

Every peer estimates the swarm's epoch, its samples and its speed from the
others' progress records (hivemind's ``ProgressTracker``), and hivemind believes
every record it can parse. A record is signed by its peer, so nobody can forge
another's, but anyone who joins a run can write its own, and one lie moves
every reader:

- an epoch far ahead: every reader takes the swarm's epoch for the highest
  record's, thinks itself behind and downloads the state, again and again (no
  donor is on that epoch): training stops;
- a time long past (or a huge speed): readers extrapolate the record's samples
  at its speed since its time, expect the epoch's end now, and step at every
  local step: the run's batch shrinks to one step's, and every step is a round;
- the target's samples: the same at once.

``ProgressChecks.believe`` passes each read's records through these checks
(a record that fails one is left out of the estimate, never of the DHT):

- a record dated more than ``CLOCK_SKEW_S`` ahead of this peer's clock is
  left out; one older than its lifetime (hivemind's ``metadata_expiration``)
  plus that counts as dated now: its samples are not extrapolated (an honest
  peer that waits for its round or the swarm reports nothing, and hivemind
  stores its last record again with that record's time);
- samples count at most the run's target batch size, and at most the most
  of: what the record's peer was believed to hold at this reader's last read
  (nothing on a new epoch) plus its believed speed (below) since,
  ``SPEED_SLACK`` times the median of the other peers' samples on its epoch,
  and an even share of the batch among the records on its epoch: a peer that
  claims the target's samples at once counts a few times the swarm's typical
  peer, and a fast peer's samples catch up at a few times its speed;
- the swarm's epoch is the highest epoch that two other peers' records are
  on (none: the second highest; only one other peer on record: its epoch,
  hivemind's rule); a record further ahead than one epoch is left out, and a
  record one epoch above it moves the swarm only once the samples believed
  on the swarm's epoch (extrapolated, as hivemind does) reach half the target
  batch size (before, it counts for its speed but is read as a client's).
  Honest peers are within one epoch of each other and step near the epoch's
  end: a peer behind follows the swarm, and the first to step pulls the
  others, as in hivemind; a liar one epoch ahead ends epochs at half the
  batch at the earliest;
- a speed counts at most ``SPEED_SLACK`` times the larger of the rate at which
  the record's samples rose on this reader's clock (over at least
  ``RISE_WINDOW_S``, across an epoch's end) and the median of the speeds on
  record, this peer's own included once measured (of an even count, the
  upper one: of two peers, neither cuts the other below its own speed), so a
  claimed speed its samples do not show is cut to a few times the swarm's
  typical speed. The rise is measured on the samples
  believed, so a liar's believed speed grows at most ``SPEED_SLACK`` times a
  window, and a fast honest peer (a GPU among CPUs, 100 times as fast) is
  believed in full after a few windows (about a minute after this reader
  first saw it);
- the records of peers this peer banned (``Trust``) are left out.

Not defended: a liar whose samples rise as its speed says is believed like a
fast honest peer once its believed speed has grown (``SPEED_SLACK`` times a
window): it then brings every epoch's end forward (at most to a round of each
peer's one step); checking a record against the samples its peer then sends
in rounds is not done. Two liars that agree on a far-ahead epoch move the
swarm's epoch. Bans are by the ``peer_id`` a record states, which its writer
chooses; the rise of samples is tracked by the record's signing key, which it
cannot.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Collection

from hivemind.p2p import PeerID

CLOCK_SKEW_S = 30.0  # how far another peer's clock may be off this one's
SPEED_SLACK = 4.0  # a speed counts at most this many times what its samples' rise or the swarm's median shows
RISE_WINDOW_S = 20.0  # the least time over which a record's samples' rise is measured


@dataclasses.dataclass
class _Rise:
    """How one peer's believed samples rose on this reader's clock: at the last read (``read_at``) it was on
    ``epoch`` with ``samples``; ``risen`` samples since ``window_at``; ``rate``: the last measured rise in
    samples a second (None: not measured yet)."""

    epoch: int
    samples: int
    read_at: float
    window_at: float
    risen: int = 0
    rate: float | None = None


@dataclasses.dataclass
class Belief:
    """What one read of the records believes: ``records`` (copies, maybe with samples, speed or
    ``client_mode`` changed) and ``doubts``, one line per record left out or changed (for the round log)."""

    records: dict
    doubts: list[str]


class ProgressChecks:
    """The checks of one reader (the module docstring); keeps the rise of each peer's samples between reads.

    Args:
        target_batch_size: the run's samples an epoch; no record counts more.
        lifetime_s: how long a record lives in the DHT (hivemind's ``metadata_expiration``).
        banned: peer ids (base58) whose records are left out; read at each call (``Trust.banned``, which
            changes as peers are banned and unbanned).
    """

    def __init__(self, target_batch_size: int, lifetime_s: float, banned: Collection[str] = ()):
        self.target_batch_size = target_batch_size
        self.lifetime_s = lifetime_s
        self.banned = banned
        self._rises: dict[bytes, _Rise] = {}

    def believe(self, records: dict, own_key: bytes, own_speed: float | None, now: float) -> Belief:
        """The records to believe of one read.

        Args:
            records: what the read found: signing key (the DHT subkey) to record (a dict as hivemind
                stores it: ``peer_id``, ``epoch``, ``samples_accumulated``, ``samples_per_second``,
                ``time``, ``client_mode``); other values (an emptied record) are left as they are.
            own_key: this peer's signing key: its own record is believed as it is.
            own_speed: this peer's samples a second, for the swarm's median speed (None: not measured yet).
            now: the DHT time of the read (``hivemind.utils.get_dht_time``).
        """
        believed, doubts = {}, []
        for key, record in records.items():
            if key == own_key or not isinstance(record, dict):
                believed[key] = record
                continue
            doubt = self._doubt(record, now)
            if doubt:
                doubts.append(f"{_name(record)} {doubt}: left out")
                continue
            if record["time"] < now - self.lifetime_s - CLOCK_SKEW_S:
                # hivemind's reporter stores the record of the last report again and again: a peer that waits (for
                # its round, for the swarm) keeps its old time; its samples count, not extrapolated over the wait
                doubts.append(f"{_name(record)} dated {now - record['time']:.0f} s ago: counted as of now")
                record = {**record, "time": now}
            if record["samples_accumulated"] > self.target_batch_size:
                doubts.append(f"{_name(record)} {record['samples_accumulated']} samples: counted as {self.target_batch_size}")
                record = {**record, "samples_accumulated": self.target_batch_size}
            believed[key] = record
        swarm = self._follow_the_swarms_epoch(believed, own_key, doubts)
        self._cut_claims(believed, own_key, own_speed, now, doubts)
        self._hold_back_one_ahead(believed, own_key, swarm, now, doubts)
        return Belief(believed, doubts)

    def _doubt(self, record: dict, now: float) -> str | None:
        """Why ``record`` is not believed at all, or None."""
        epoch, samples, speed, at = (record.get(field) for field in ("epoch", "samples_accumulated", "samples_per_second", "time"))
        if type(epoch) is not int or type(samples) is not int or epoch < 0 or samples < 0:
            return "with no epoch or samples"
        if not isinstance(speed, float) or not isinstance(at, float) or not math.isfinite(speed) or speed < 0 \
                or not math.isfinite(at):
            return "with no speed or time"
        if not isinstance(record.get("peer_id"), bytes) or not isinstance(record.get("client_mode"), bool):
            return "with no peer id or client mode"  # hivemind's parser would fail on it
        if at > now + CLOCK_SKEW_S:
            return f"dated {at - now:.0f} s ahead"
        if record_peer_id(record) in self.banned:
            return "banned"
        return None

    def _follow_the_swarms_epoch(self, believed: dict, own_key: bytes, doubts: list[str]) -> int | None:
        """Leave out the records more than one epoch above the swarm's epoch as the others show it (module
        docstring); returns that epoch (None: fewer than two other peers on record, nothing to compare)."""
        epochs = sorted((record["epoch"] for key, record in believed.items()
                         if key != own_key and isinstance(record, dict) and not record.get("client_mode")), reverse=True)
        if len(epochs) < 2:
            return None
        held_twice = [epoch for epoch, next_one in zip(epochs, epochs[1:]) if epoch == next_one]
        swarm = held_twice[0] if held_twice else epochs[1]
        for key, record in list(believed.items()):
            if key != own_key and isinstance(record, dict) and record["epoch"] > swarm + 1:
                doubts.append(f"{_name(record)} on epoch {record['epoch']}, the others on {swarm}: left out")
                del believed[key]
        return swarm

    def _hold_back_one_ahead(self, believed: dict, own_key: bytes, swarm: int | None, now: float, doubts: list[str]) -> None:
        """Read a record one epoch above the swarm's as a client's (its epoch does not move the swarm) until the
        samples believed on the swarm's epoch, each record's extrapolated at its speed since its time (as
        hivemind estimates them), reach half the target batch size."""
        if swarm is None:
            return
        samples = sum(record["samples_accumulated"] + max(0.0, now - record["time"]) * record["samples_per_second"]
                      for record in believed.values() if isinstance(record, dict) and record["epoch"] == swarm)
        if 2 * samples >= self.target_batch_size:
            return
        for key, record in list(believed.items()):
            if key != own_key and isinstance(record, dict) and record["epoch"] == swarm + 1 and not record.get("client_mode"):
                doubts.append(f"{_name(record)} on epoch {record['epoch']} with {samples:.0f} samples on {swarm}: not followed yet")
                believed[key] = {**record, "client_mode": True}

    def _cut_claims(self, believed: dict, own_key: bytes, own_speed: float | None, now: float, doubts: list[str]) -> None:
        """Cut each other record's speed and samples to what the rise of its samples, or the swarm's median, shows;
        then measure that rise."""
        others = {key: record for key, record in believed.items() if key != own_key and isinstance(record, dict)}
        self._rises = {key: rise for key, rise in self._rises.items() if key in others}
        if not others:
            return
        speeds = [record["samples_per_second"] for record in others.values()] + ([own_speed] if own_speed is not None else [])
        median_speed = statistics.median_high(speeds)
        for key, record in others.items():
            rise = self._rises.get(key)
            measured = rise.rate if rise is not None and rise.rate is not None else 0.0
            allowed = SPEED_SLACK * max(measured, median_speed)
            samples = min(record["samples_accumulated"], int(self._samples_allowed(rise, record, others, allowed, now)))
            if record["samples_per_second"] > allowed or samples < record["samples_accumulated"]:
                doubts.append(f"{_name(record)} {record['samples_accumulated']} samples at {record['samples_per_second']:.1f}/s: "
                              f"counted as {samples} at {min(allowed, record['samples_per_second']):.1f}/s")
                believed[key] = record = {**record, "samples_accumulated": samples,
                                          "samples_per_second": min(allowed, record["samples_per_second"])}
            self._rises[key] = self._measure_rise(rise, record, now)

    def _samples_allowed(self, rise: _Rise | None, record: dict, others: dict, speed: float, now: float) -> float:
        """The most samples ``record`` can be believed to hold: what it held at the last read (0 on a new epoch)
        plus ``speed`` since, or ``SPEED_SLACK`` times the median of the other peers' samples on its epoch (not
        this peer's: it may just have joined), or an even share of the batch among the records on its epoch
        (this peer's included: the run's first peer holds most of the first epoch's samples), whichever is
        the most."""
        epoch = record["epoch"]
        on_epoch = [other["samples_accumulated"] for other in others.values() if other["epoch"] == epoch]
        median, share = statistics.median_high(on_epoch), self.target_batch_size / (len(on_epoch) + 1)
        if rise is not None and epoch == rise.epoch:
            grown = rise.samples + speed * (now - rise.read_at)
        elif rise is not None and epoch == rise.epoch + 1:
            grown = speed * (now - rise.read_at)
        else:  # first seen: nothing to grow from
            grown = 0.0
        return max(SPEED_SLACK * median, share, grown)

    @staticmethod
    def _measure_rise(rise: _Rise | None, record: dict, now: float) -> _Rise:
        """Add the rise of a peer's believed samples since the last read to its window; measure the window's rate
        once it spans ``RISE_WINDOW_S``. A fast peer's epochs can be shorter than that: its samples on the next
        epoch add to the rise (the previous epoch's last, unread, samples are missed: its rate reads low, never
        high); any other change of epoch, or fewer samples (a restart), starts a new window. Measured on what was
        believed, a liar's rate grows at most ``SPEED_SLACK`` times a window."""
        epoch, samples = record["epoch"], record["samples_accumulated"]
        if rise is not None and epoch == rise.epoch and samples >= rise.samples:
            rise.risen += samples - rise.samples
        elif rise is not None and epoch == rise.epoch + 1:
            rise.risen += samples
        else:
            rise = _Rise(epoch, samples, now, now, rate=rise.rate if rise is not None else None)
        rise.epoch, rise.samples, rise.read_at = epoch, samples, now
        if now - rise.window_at >= RISE_WINDOW_S:
            rise.rate, rise.risen, rise.window_at = rise.risen / (now - rise.window_at), 0, now
        return rise


def record_peer_id(record: dict) -> str | None:
    try:
        return PeerID(record.get("peer_id")).to_base58()
    except (TypeError, ValueError):  # not a peer id: nobody banned it
        return None


def _name(record: dict) -> str:
    """A record's peer as the round log names it: its peer id's last 6 characters."""
    peer = record_peer_id(record)
    return peer[-6:] if peer else "?"
