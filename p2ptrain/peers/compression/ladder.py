"""The compression ladder: what each rung sends per averaged value, and which rungs a run allows.

A *rung* is a way to send pseudo-gradients (or gradients) in an averaging round,
named in the manifest's ``compression``:

- ``none`` (4 bytes a value), ``fp16`` (2), ``uniform8bit`` and
  ``blockwise8bit`` (about 1): dense, every value is sent;
- ``sparse{bits}bit-{k}of{chunk}``, e.g. ``sparse2bit-64of4096``: in every
  chunk of ``chunk`` consecutive values (a power of two) only the ``k`` largest
  in magnitude are sent, each as a ``bits``-bit code (a sign and a magnitude
  level of the chunk's codebook), as SparseLoCo does (Sarfi et al. 2025); their
  positions are Elias-Fano coded, about ``2 + log2(chunk / k)`` bits each. What is not sent is kept by the peer and
  added to its next pseudo-gradient (error feedback, ``error_feedback.py``).
  ``bits`` is 2 or 4; the wire format is in ``sparse.py``.

The run's manifest names its top rung in ``compression`` (the most any peer
sends) and may allow cheaper ones in ``compression_rungs``, for peers on slow
uplinks (``daemon/plan.py`` picks one from the measured uplink). A rung is
"cheaper" when a peer uploads fewer bytes per averaged value in a round of
:data:`PLANNING_GROUP_SIZE` peers (:func:`upload_bytes_per_value`).

Pure Python (no torch, no hivemind): the manifest, the plan and the daemon
import it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DENSE_BYTES_PER_VALUE = {
    "none": 4.0,
    "fp16": 2.0,
    # one byte a value, a float32 scale per 4096 values and a 256-entry float32
    # codebook per part of 2**19 fp32 bytes (hivemind's default part size)
    "blockwise8bit": 1.0 + 4 / 4096 + 1040 / 131072,
    # one byte a value and a 256-entry float32 codebook per part
    "uniform8bit": 1.0 + 1024 / 131072,
}
SPARSE_BITS = (2, 4)
CHUNK_RANGE = (64, 1 << 20)
# a reducer sends each sender the average minus what that sender sent, on the union of
# the group's entries: Elias-Fano coded positions and an 8-bit value per entry, a float32
# scale per UNION_CHUNK values; dense 8-bit where that is smaller (``compression_sparse``)
UNION_CHUNK = 4096
UNION_VALUE_BITS = 8
# the group size rungs are compared and planned for: what a peer uploads in a round
# grows with its group (a reducer's answers cover the union of every sender's entries)
PLANNING_GROUP_SIZE = 4
# the longest one round's upload may take on a peer's uplink, unless its plan's policy says otherwise
ROUND_UPLOAD_S = 30.0
# the default ladder, from most to fewest bytes; a run may name other sparse rungs
LADDER = ("none", "fp16", "blockwise8bit", "sparse4bit-256of4096", "sparse4bit-64of4096",
          "sparse2bit-64of4096", "sparse2bit-16of4096", "sparse2bit-4of4096")
_SPARSE_NAME = re.compile(r"^sparse(\d+)bit-(\d+)of(\d+)$")
RUNG_HELP = ("use none, fp16, uniform8bit, blockwise8bit or sparse<bits>bit-<k>of<chunk> (bits 2 or 4, chunk a "
             "power of two from 64 to 1048576, 1 <= k <= chunk/4), e.g. sparse2bit-64of4096")


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder. ``bits``, ``k`` and ``chunk`` are set for sparse rungs only."""

    name: str
    bits: int = 0
    k: int = 0
    chunk: int = 0

    @property
    def sparse(self) -> bool:
        return self.k > 0

    @property
    def density(self) -> float:
        """The share of values sent (1.0 for dense rungs)."""
        return self.k / self.chunk if self.sparse else 1.0

    @property
    def index_bits(self) -> int:
        return int(math.log2(self.chunk)) if self.sparse else 0

    @property
    def levels(self) -> int:
        """Magnitude levels in a chunk's codebook: one bit of a code is the sign."""
        return 1 << (self.bits - 1) if self.sparse else 0

    def send_bytes_per_value(self) -> float:
        """Bytes a sender's part takes per value of the tensors (full chunks)."""
        if not self.sparse:
            return DENSE_BYTES_PER_VALUE[self.name]
        return (position_bits_per_value(self.density) + self.density * self.bits + 32 * self.levels / self.chunk) / 8

    def return_bytes_per_value(self, group_size: int) -> float:
        """Bytes per value of a reducer's answer to one sender: for sparse rungs at most the
        union of ``group_size`` senders' entries (no overlap), never more than dense 8-bit."""
        if not self.sparse:
            return DENSE_BYTES_PER_VALUE[self.name]
        union = min(1.0, group_size * self.density)
        sparse = (position_bits_per_value(union) + union * UNION_VALUE_BITS) / 8
        return min(sparse, UNION_VALUE_BITS / 8) + 4 / UNION_CHUNK


def position_bits_per_value(density: float) -> float:
    """Bits per value of Elias-Fano coded positions of a share ``density`` of the values
    (``compression_sparse.pack_positions``): ``low + 1`` bits a position and ``2**-low`` a value."""
    low = max(0, math.floor(math.log2(1 / density)))
    return density * (low + 1) + 2.0**-low


def parse_rung(name: str) -> Rung:
    """The rung a manifest ``compression`` name describes.

    :raises ValueError: with the accepted forms, for a name that is no rung.
    """
    if name in DENSE_BYTES_PER_VALUE:
        return Rung(name)
    match = _SPARSE_NAME.match(name) if isinstance(name, str) else None
    if match:
        bits, k, chunk = (int(group) for group in match.groups())
        power_of_two = chunk & (chunk - 1) == 0
        if bits in SPARSE_BITS and power_of_two and CHUNK_RANGE[0] <= chunk <= CHUNK_RANGE[1] and 1 <= k <= chunk // 4:
            return Rung(name, bits, k, chunk)
    raise ValueError(f"unknown compression {name!r}; {RUNG_HELP}")


def upload_bytes_per_value(rung: Rung, group_size: int = PLANNING_GROUP_SIZE) -> float:
    """Bytes one peer uploads per averaged value in one butterfly all-reduce of ``group_size``
    peers: its part for each other reducer ((g-1)/g of its tensors) and the answers to the
    other senders for its own part ((g-1) answers of 1/g each)."""
    share = (group_size - 1) / group_size
    return share * (rung.send_bytes_per_value() + rung.return_bytes_per_value(group_size))


def allowed_rungs(compression: str, compression_rungs: list[str] | tuple[str, ...] = ()) -> list[Rung]:
    """The rungs a run allows, from most to fewest bytes: its top rung ``compression`` and the
    cheaper ``compression_rungs``.

    :raises ValueError: naming a rung that is unknown or sends more than the top rung.
    """
    top = parse_rung(compression)
    rungs = {top.name: top}
    for name in compression_rungs:
        rung = parse_rung(name)
        if upload_bytes_per_value(rung) > upload_bytes_per_value(top):
            raise ValueError(f"compression_rungs names {name!r}, which sends more than the run's compression "
                             f"{compression!r}; list only rungs cheaper than it, or raise compression")
        rungs[rung.name] = rung
    return sorted(rungs.values(), key=upload_bytes_per_value, reverse=True)


class RungNotAllowed(ValueError):
    """A peer would send with a rung its run's manifest does not allow; ``message`` and ``fix``."""

    def __init__(self, message: str, fix: str):
        super().__init__(f"{message}; {fix}")
        self.message, self.fix = message, fix


def rung_for_peer(name: str, allowed: list[Rung]) -> Rung:
    """The rung ``name`` if the run allows it (``allowed_rungs``).

    :raises RungNotAllowed: a rung the manifest does not allow (another peer's reducers
        would refuse what this one sends), saying which rungs it allows.
    """
    rung = parse_rung(name)
    names = [allowed_rung.name for allowed_rung in allowed]
    if rung.name not in names:
        raise RungNotAllowed(f"compression {rung.name} is not allowed by this run's manifest (it allows {', '.join(names)})",
                             "send with one of those: remove the compression override, or join a run that allows it")
    return rung


def round_upload_seconds(rung: Rung, values: int, uplink_mbit_s: float, group_size: int = PLANNING_GROUP_SIZE) -> float:
    """Seconds one averaging round's upload takes at ``uplink_mbit_s`` for ``values`` averaged values."""
    return upload_bytes_per_value(rung, group_size) * values * 8 / (uplink_mbit_s * 1e6)


def choose_rung(allowed: list[Rung], values: int, uplink_mbit_s: float | None, budget_s: float) -> tuple[Rung, str]:
    """The rung a peer sends with, and why (one line).

    The most precise allowed rung whose round upload takes at most ``budget_s`` seconds on
    this peer's uplink; the cheapest allowed one when none does; the run's top rung when the
    uplink is unknown. A peer never sends more than the run's top rung.

    Args:
        allowed: ``allowed_rungs(...)``, most bytes first.
        values: the averaged values (the model's trainable parameters).
        uplink_mbit_s: the measured or configured uplink, Mbit/s (None: unknown).
        budget_s: the longest a round's upload may take.
    """
    top = allowed[0]
    if uplink_mbit_s is None:
        return top, f"compression {top.name}: the run's top rung (no uplink measured or configured)"
    seconds = {rung.name: round_upload_seconds(rung, values, uplink_mbit_s) for rung in allowed}
    fitting = [rung for rung in allowed if seconds[rung.name] <= budget_s]
    chosen = fitting[0] if fitting else allowed[-1]
    where = (f"{values:,} values, {PLANNING_GROUP_SIZE}-peer rounds, {uplink_mbit_s:g} Mbit/s up: "
             f"{chosen.name} uploads {seconds[chosen.name]:.3g} s a round")
    if len(allowed) == 1:
        return chosen, f"compression {chosen.name}: the only rung the run allows ({where})"
    if not fitting:
        return chosen, (f"compression {chosen.name}: the cheapest rung the run allows, yet over the {budget_s:g} s "
                        f"budget ({where})")
    if chosen is top:
        return chosen, f"compression {chosen.name}: the run's top rung fits the {budget_s:g} s budget ({where})"
    previous = allowed[allowed.index(chosen) - 1]
    return chosen, (f"compression {chosen.name}: {previous.name} would take {seconds[previous.name]:.3g} s, over "
                    f"the {budget_s:g} s budget ({where})")
